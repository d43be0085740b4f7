"""Moves approved reports out of a sandbox's drop-box into the tenant's real reports store.

The sandbox only ever sees the drop-box, so a compromised sandbox cannot read, overwrite or
delete a report written earlier (DESIGN §7). The broker accepts a dropped file only if its
bytes hash to the sha256 the human approved: a sandbox that writes anything else is caught,
and the file is quarantined instead of accepted.
"""

from __future__ import annotations

import errno
import hashlib
import logging
import os
import stat
from enum import StrEnum
from pathlib import Path

from server.contracts import FILENAME_RE, MAX_REPORT_BYTES

log = logging.getLogger("docbroker.reports")


class Accepted(StrEnum):
    OK = "ok"
    MISSING = "missing"  # the sandbox said ok but nothing is there
    MISMATCH = "content_mismatch"  # bytes differ from what was approved
    NOT_REGULAR = "not_regular"  # symlink, FIFO, hard link...
    EXISTS = "exists"  # a report of that name is already in the store
    IO_ERROR = "io_error"


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


class ReportStore:
    """One tenant's drop-box and reports folders, as seen from the broker."""

    def __init__(self, dropbox: Path, reports: Path) -> None:
        self._dropbox = dropbox
        self._reports = reports

    def exists(self, name: str) -> bool:
        return FILENAME_RE.fullmatch(name) is not None and os.path.lexists(self._reports / name)

    def accept(self, name: str, sha256: str) -> Accepted:
        if not FILENAME_RE.fullmatch(name):
            return Accepted.NOT_REGULAR
        drop_fd = os.open(self._dropbox, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        reports_fd = os.open(self._reports, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
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
            os.write(out, data)
            os.fsync(out)
        finally:
            os.close(out)
        os.fsync(reports_fd)
        os.unlink(name, dir_fd=drop_fd)
        return Accepted.OK

    def _quarantine(self, drop_fd: int, name: str) -> None:
        """Take a bad drop out of the sandbox's reach; keep it for investigation."""
        quarantine = self._reports.parent / "quarantine"
        quarantine.mkdir(mode=0o700, exist_ok=True)
        q_fd = os.open(quarantine, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            os.rename(name, f"{name}.{os.urandom(4).hex()}", src_dir_fd=drop_fd, dst_dir_fd=q_fd)
        except OSError as exc:
            # The accept outcome is reported either way; say that the bad drop is still there.
            log.warning(
                "could not quarantine a rejected report (%s)", errno.errorcode.get(exc.errno or 0, "error")
            )
        finally:
            os.close(q_fd)
