"""Moves approved reports out of a sandbox's drop-box into the tenant's real reports store.

The sandbox only ever sees the drop-box, so a compromised sandbox cannot read, overwrite or
delete a report written earlier (DESIGN §7). The broker accepts a dropped file only if its
bytes hash to the sha256 the human approved: a sandbox that writes anything else is caught,
and the file is quarantined instead of accepted.

The drop-box ends empty after every save, whatever its outcome, and at start-up (DESIGN §11):
anything else found there (files a sandbox planted, a report dropped just before a crash) is
quarantined. Otherwise a planted name would make the sandbox refuse a later approved save of
that name as "already exists" although no such report exists. Sweeps and saves of one tenant
take turns (`exclusive`), so a sweep never takes the file of a save still in flight.

    store = ReportStore(dropbox, reports)
    async with store.saving(audit_sweep):   # sweeps before and after, audited by count
        ...forward the approved save; await store.accept(filename, sha256) on an ok answer

The file operations themselves are `ReportFiles` (synchronous, no turns): the broker's
`ReportStore` runs them on this host, the reports keeper (`broker/keeper/`) runs the same code
inside a tenant's Pod, and `broker/approvals/keeper_client.py` is the `Reports` that asks it.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import fcntl
import hashlib
import logging
import os
import stat
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Protocol

from broker.audit.schema import AuditEvent
from broker.threads import to_thread_to_the_end
from broker.types import Outcome
from server.contracts import FILENAME_RE, MAX_REPORT_BYTES

log = logging.getLogger("docbroker.reports")


class Accepted(StrEnum):
    OK = "ok"
    MISSING = "missing"  # the sandbox said ok but nothing is there
    MISMATCH = "content_mismatch"  # bytes differ from what was approved
    NOT_REGULAR = "not_regular"  # symlink, FIFO, hard link...
    EXISTS = "exists"  # a report of that name is already in the store
    IO_ERROR = "io_error"


class SweepReason(StrEnum):
    """Why a sweep ran: the audit's `reason` for what it quarantined."""

    BEFORE_SAVE = "dropbox_before_save"  # planted since the last save
    AFTER_SAVE = "dropbox_after_save"  # left beside (or instead of) the approved file
    STARTUP = "dropbox_at_startup"  # left by a broker that stopped mid-save, or planted meanwhile


@dataclass(frozen=True)
class Swept:
    quarantined: int = 0
    stuck: int = 0  # could not be moved out: still in the drop-box


OnSwept = Callable[[Swept, SweepReason], Awaitable[None]]
_LOCK_POLL_SECONDS = 0.02
# Every folder is opened the same way: a symlink put in place of the drop-box, the reports store or
# the quarantine must never redirect an accept, a sweep or a quarantine to another folder.
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
# Quarantined names get a random suffix; a planted name may already be as long as a name can be.
_MAX_KEPT_NAME_BYTES = 200


def _open_dropped(dropbox_fd: int, name: str) -> int:
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    try:
        return os.open(name, flags, dir_fd=dropbox_fd)
    except PermissionError:
        # Local-process runtime: the server ran as our own uid and made the file write-only
        # for its owner. Open the inode (O_PATH, no follow), then make it readable through it.
        path_fd = os.open(name, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dropbox_fd)
        try:
            info = os.fstat(path_fd)
            if not stat.S_ISREG(info.st_mode) or info.st_uid != os.geteuid():
                raise
            os.chmod(f"/proc/self/fd/{path_fd}", 0o600)
            return os.open(f"/proc/self/fd/{path_fd}", flags)
        finally:
            os.close(path_fd)


class Reports(Protocol):
    """One tenant's reports as the gateway and the approval flow use them."""

    def saving(self, on_swept: OnSwept) -> AbstractAsyncContextManager[None]: ...

    async def accept(self, name: str, sha256: str) -> Accepted: ...

    async def exists(self, name: str) -> bool: ...

    async def sweep(self, on_swept: OnSwept, reason: SweepReason) -> None: ...


class ReportStore:
    """One tenant's drop-box and reports folders on the broker's host, in turns."""

    def __init__(self, dropbox: Path, reports: Path) -> None:
        self.files = ReportFiles(dropbox, reports, reports.parent / "quarantine")
        self._reports = reports
        self._turns = asyncio.Lock()

    @property
    def quarantine_dir(self) -> Path:
        return self.files.quarantine_dir

    @contextlib.asynccontextmanager
    async def exclusive(self) -> AsyncIterator[None]:
        """This tenant's drop-box to ourselves: no other save or sweep of it, here or in
        another broker process on this host (an advisory lock beside it, out of the sandbox's
        reach; the kernel drops it if the holder dies)."""
        async with self._turns:
            folder = self._reports.parent
            folder.mkdir(mode=0o700, parents=True, exist_ok=True)
            fd = os.open(
                folder / "dropbox.lock", os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600
            )
            try:
                while True:
                    try:
                        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                        break
                    except BlockingIOError:
                        # Polled, not a blocking flock in a thread: a cancelled waiter must not
                        # leave a thread behind that takes the lock later with no one to free it.
                        await asyncio.sleep(_LOCK_POLL_SECONDS)
                yield
            finally:
                os.close(fd)  # releases the lock

    @contextlib.asynccontextmanager
    async def saving(self, on_swept: OnSwept) -> AsyncIterator[None]:
        """One approved save's turn: the drop-box is emptied before it and after it, ok or not."""
        async with self.exclusive():
            await on_swept(await to_thread_to_the_end(self.files.sweep), SweepReason.BEFORE_SAVE)
            try:
                yield
            finally:
                await on_swept(await to_thread_to_the_end(self.files.sweep), SweepReason.AFTER_SAVE)

    async def sweep(self, on_swept: OnSwept, reason: SweepReason) -> None:
        async with self.exclusive():
            await on_swept(await to_thread_to_the_end(self.files.sweep), reason)

    async def accept(self, name: str, sha256: str) -> Accepted:
        """Call within `saving`: the approved file moves into the store if its bytes match."""
        return await to_thread_to_the_end(self.files.accept, name, sha256)

    async def exists(self, name: str) -> bool:
        return self.files.exists(name)


class ReportFiles:
    """The file operations on one drop-box and reports folder: synchronous and without turns
    (the caller takes them: `ReportStore.exclusive`, or the keeper's one lock)."""

    def __init__(self, dropbox: Path, reports: Path, quarantine: Path) -> None:
        self._dropbox = dropbox
        self._reports = reports
        self.quarantine_dir = quarantine

    def sweep(self) -> Swept:
        """Quarantine everything in the drop-box."""
        try:
            drop_fd = os.open(self._dropbox, _DIR_FLAGS)
        except FileNotFoundError:
            return Swept()  # never provisioned: nothing can have been dropped
        except OSError as exc:
            _warn("could not open a drop-box to empty it", exc)
            return Swept(stuck=1)
        try:
            names = os.listdir(drop_fd)
            moved = sum(self._quarantine(drop_fd, name) for name in names)
        except OSError as exc:
            _warn("could not list a drop-box to empty it", exc)
            return Swept(stuck=1)
        finally:
            os.close(drop_fd)
        return Swept(quarantined=moved, stuck=len(names) - moved)

    def exists(self, name: str) -> bool:
        return FILENAME_RE.fullmatch(name) is not None and os.path.lexists(self._reports / name)

    def accept(self, name: str, sha256: str) -> Accepted:
        if not FILENAME_RE.fullmatch(name):
            return Accepted.NOT_REGULAR
        try:
            drop_fd = os.open(self._dropbox, _DIR_FLAGS)
        except OSError as exc:
            _warn("could not open a drop-box to accept from it", exc)
            return Accepted.IO_ERROR
        try:
            reports_fd = os.open(self._reports, _DIR_FLAGS)
        except OSError as exc:
            os.close(drop_fd)
            _warn("could not open the reports folder to accept into it", exc)
            return Accepted.IO_ERROR
        try:
            return self._accept(drop_fd, reports_fd, name, sha256)
        finally:
            os.close(drop_fd)
            os.close(reports_fd)

    def _accept(self, drop_fd: int, reports_fd: int, name: str, sha256: str) -> Accepted:
        try:
            fd = _open_dropped(drop_fd, name)
        except FileNotFoundError:
            return Accepted.MISSING
        except OSError as exc:
            return (
                Accepted.NOT_REGULAR
                if exc.errno in (errno.ELOOP, errno.EACCES, errno.EPERM)
                else Accepted.IO_ERROR
            )
        try:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode) or info.st_nlink != 1 or info.st_size > MAX_REPORT_BYTES:
                self._quarantine(drop_fd, name)
                return Accepted.NOT_REGULAR
            data = os.read(fd, MAX_REPORT_BYTES + 1)
        finally:
            os.close(fd)
        if hashlib.sha256(data).hexdigest() != sha256:
            self._quarantine(drop_fd, name)
            return Accepted.MISMATCH
        # Write our own copy (owned by the broker, 0600) from the verified bytes, then drop theirs:
        # the sandbox's inode never enters the store, so nothing it still holds open can change it.
        try:
            out = os.open(
                name,
                os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                0o600,
                dir_fd=reports_fd,
            )
        except FileExistsError:
            self._quarantine(drop_fd, name)
            return Accepted.EXISTS
        except OSError:
            return Accepted.IO_ERROR
        try:
            written = os.write(out, data)
            os.fsync(out)
        except OSError as exc:
            _warn("could not write an accepted report", exc)
            written = -1
        finally:
            os.close(out)
        if written != len(data):  # no partial report in the store; the drop is swept after
            with contextlib.suppress(OSError):
                os.unlink(name, dir_fd=reports_fd)
            return Accepted.IO_ERROR
        os.fsync(reports_fd)
        try:
            os.unlink(name, dir_fd=drop_fd)
        except OSError as exc:  # the report is in the store; the sweep after the save retries
            _warn("could not remove an accepted drop", exc)
        return Accepted.OK

    def _quarantine(self, drop_fd: int, name: str) -> bool:
        """Take a drop out of the sandbox's reach, whatever it is (a rename never follows a
        link or opens a FIFO); keep it for investigation. False if it is still there."""
        source = os.fsencode(name)
        kept = source[:_MAX_KEPT_NAME_BYTES] + b"." + os.urandom(4).hex().encode()
        try:
            self.quarantine_dir.mkdir(mode=0o700, exist_ok=True)
            q_fd = os.open(self.quarantine_dir, _DIR_FLAGS)
        except OSError as exc:
            _warn("could not open the quarantine", exc)
            return False
        try:
            os.rename(source, kept, src_dir_fd=drop_fd, dst_dir_fd=q_fd)
            return True
        except OSError as exc:
            # The outcome is reported either way; say that the drop is still there (never its name).
            _warn("could not quarantine a drop", exc)
            return False
        finally:
            os.close(q_fd)


def _warn(what: str, exc: OSError) -> None:
    log.warning("%s (%s)", what, errno.errorcode.get(exc.errno or 0, "error"))


def audit_sweep(emit: Callable[..., Awaitable[None]], **ids: str) -> OnSwept:
    """An `OnSwept` that audits what a sweep found by count and reason, never by name."""

    async def on_swept(swept: Swept, reason: SweepReason) -> None:
        if swept.quarantined:
            await emit(
                AuditEvent.REPORTS_QUARANTINED,
                outcome=Outcome.REJECTED,
                reason=reason,
                count=swept.quarantined,
                **ids,
            )
        if swept.stuck:
            await emit(
                AuditEvent.REPORTS_QUARANTINED,
                outcome=Outcome.ERROR,
                reason="quarantine_failed",
                count=swept.stuck,
                **ids,
            )

    return on_swept


async def sweep_dropboxes(
    tenants: Iterable[str], store_for: Callable[[str], Reports], emit: Callable[..., Awaitable[None]]
) -> None:
    """At start-up: whatever a previous broker left mid-save, or a sandbox planted while no
    broker ran, is quarantined before any call can trip over it."""
    for tenant in tenants:
        await store_for(tenant).sweep(audit_sweep(emit, tenant=tenant), SweepReason.STARTUP)
