"""The only file-system code of the server.

Both folders are opened once, as directory descriptors, when the server starts; every
file is then opened relative to them and checked on the open descriptor. There is no
"check a path, then open the path again": a symlink, hard link or FIFO swapped in between
calls is caught by the open itself (`O_NOFOLLOW`, `RESOLVE_*`) or by `fstat` of what was
actually opened (DESIGN §2, File safety).

Reports are write-only by construction: this module has no function that reads, lists or
deletes anything in the reports folder, and it holds that folder as an `O_PATH`
descriptor, which cannot be read or listed at all.
"""

from __future__ import annotations

import ctypes
import errno
import os
import stat
from collections.abc import Iterator
from dataclasses import dataclass
from enum import Enum
from pathlib import Path

from server import syscalls
from server.contracts import FILENAME_RE


class ReadFailure(Enum):
    """Why a bounded read gave no text. Callers map these to fixed messages."""

    NOT_FOUND = "not_found"
    NOT_REGULAR = "not_regular"  # symlink, FIFO, device, directory, or a hard link (st_nlink > 1)
    TOO_LARGE = "too_large"
    NOT_UTF8 = "not_utf8"
    IO_ERROR = "io_error"


class WriteOutcome(Enum):
    CREATED = "created"
    EXISTS = "exists"  # nothing was written
    NOT_CREATED = "not_created"  # the create itself failed: nothing exists
    UNKNOWN = "unknown"  # failed after the create: the file may exist, partly written


class WorkspaceError(Exception):
    """The workspace cannot be opened: raised at start-up only, never per call."""


@dataclass(frozen=True)
class ReadOk:
    text: str


_OPEN_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_CREATE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
# 0o040: the creating open still gets its write descriptor, but afterwards the sandbox's uid
# (the owner) can neither read nor reopen the file, and seccomp stops it changing the mode.
# Group read is for the broker, which moves the file out of the drop-box: under a rootless
# daemon the sandbox runs with gid 0, which there is the broker user's gid; on a rootful one in
# its own group 10001, and the broker reads as root or as a member (DESIGN §7, drop-box).
REPORT_MODE = 0o040


# --- openat2 ----------------------------------------------------------------------------------
# openat2(2) with RESOLVE_BENEATH refuses any escape from the directory in the kernel itself,
# whatever the name holds. Filenames are already validated to one component, so the portable
# fallback (openat with O_NOFOLLOW) is equally safe; openat2 is defence in depth.

_SYS_OPENAT2 = 437  # same number on x86_64 and aarch64
_RESOLVE_NO_MAGICLINKS = 0x02
_RESOLVE_NO_SYMLINKS = 0x04
_RESOLVE_BENEATH = 0x08


class _OpenHow(ctypes.Structure):
    _fields_ = [("flags", ctypes.c_uint64), ("mode", ctypes.c_uint64), ("resolve", ctypes.c_uint64)]


_openat2_works: bool | None = None  # learnt on first use: ENOSYS/EPERM (old kernel, seccomp) → fallback


def _openat2(dir_fd: int, name: str, flags: int, mode: int) -> int:
    path = os.fsencode(name)
    if b"\0" in path:
        # C would see the name cut short at the NUL and open another file; os.open refuses it too.
        raise ValueError("embedded null byte")
    how = _OpenHow(flags, mode, _RESOLVE_BENEATH | _RESOLVE_NO_MAGICLINKS | _RESOLVE_NO_SYMLINKS)
    fd = syscalls.raw_syscall(
        _SYS_OPENAT2,
        ctypes.c_long(dir_fd),
        ctypes.c_char_p(path),
        ctypes.byref(how),
        ctypes.c_long(ctypes.sizeof(how)),
    )
    if fd < 0:
        raise OSError(-fd, os.strerror(-fd))
    return fd


def open_beneath(dir_fd: int, name: str, flags: int, mode: int = 0) -> int:
    """Open one name relative to `dir_fd`, never following a symlink."""
    global _openat2_works
    if syscalls.available() and _openat2_works is not False:
        try:
            fd = _openat2(dir_fd, name, flags, mode)
        except OSError as exc:
            if exc.errno not in (errno.ENOSYS, errno.EPERM) or _openat2_works:
                raise
            _openat2_works = False
        else:
            _openat2_works = True
            return fd
    return os.open(name, flags, mode, dir_fd=dir_fd)


# --- the workspace ---------------------------------------------------------------------------


def _open_dir(path: Path, flags: int) -> int:
    try:
        return os.open(path, flags | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        raise WorkspaceError(
            f"{path} is not an openable directory ({errno.errorcode.get(exc.errno or 0, 'error')})"
        ) from exc


class Workspace:
    """One tenant's two folders, held open for the life of the server."""

    def __init__(self, root: Path) -> None:
        held: list[int] = []
        try:
            held.append(_open_dir(root, os.O_RDONLY))
            held.append(_open_dir(root / "sources", os.O_RDONLY))
            # O_PATH needs no read permission on the folder (it may be mode 0o300) and
            # cannot be used to list it.
            held.append(_open_dir(root / "reports", os.O_PATH))
        except WorkspaceError:
            for fd in held:
                os.close(fd)
            raise
        self._held = tuple(held)
        self._sources_fd, self._reports_fd = held[1], held[2]

    @classmethod
    def from_fds(cls, sources_fd: int, reports_fd: int) -> Workspace:
        """Adopt two folders opened by someone else: a pooled sandbox's, from the broker, which
        `server/binding.py` has already checked to be directories."""
        workspace = cls.__new__(cls)
        workspace._held = (sources_fd, reports_fd)
        workspace._sources_fd, workspace._reports_fd = sources_fd, reports_fd
        return workspace

    def close(self) -> None:
        for fd in self._held:
            os.close(fd)

    # -- sources ----------------------------------------------------------------------------

    def read_source(self, name: str, limit: int) -> ReadOk | ReadFailure:
        """Read one source document: a single regular file of at most `limit` bytes, UTF-8."""
        if not FILENAME_RE.fullmatch(name):
            return ReadFailure.NOT_FOUND
        try:
            fd = open_beneath(self._sources_fd, name, _OPEN_FLAGS)
        except OSError as exc:
            if exc.errno == errno.ENOENT:
                return ReadFailure.NOT_FOUND
            if exc.errno in (errno.ELOOP, errno.EXDEV, errno.ENOTDIR, errno.EISDIR):
                return ReadFailure.NOT_REGULAR
            return ReadFailure.IO_ERROR
        try:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode) or info.st_nlink != 1:
                return ReadFailure.NOT_REGULAR
            if info.st_size > limit:
                return ReadFailure.TOO_LARGE
            data = _read_at_most(fd, limit + 1)
        except OSError:
            return ReadFailure.IO_ERROR
        finally:
            os.close(fd)
        if len(data) > limit:  # grew after fstat
            return ReadFailure.TOO_LARGE
        try:
            return ReadOk(data.decode("utf-8"))
        except UnicodeDecodeError:
            return ReadFailure.NOT_UTF8

    def source_names(self, limit: int) -> Iterator[str]:
        """Directory entry names of sources, in directory order, at most `limit` of them.

        Yields every entry (valid or not) so the caller can count what it examined.
        """
        # A new open file description per scan: concurrent searches (worker threads) must not
        # share one directory offset, as a dup() would. "." beneath the held descriptor is the
        # same directory, not a fresh path lookup.
        fd = os.open(".", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=self._sources_fd)
        try:
            with os.scandir(fd) as entries:
                for count, entry in enumerate(entries):
                    if count >= limit:
                        return
                    yield entry.name
        finally:
            os.close(fd)

    # -- reports (create-only) --------------------------------------------------------------

    def create_report(self, name: str, data: bytes) -> WriteOutcome:
        """Create a new report with exactly `data`; never overwrite, never read back."""
        if not FILENAME_RE.fullmatch(name):
            return WriteOutcome.NOT_CREATED
        try:
            fd = open_beneath(self._reports_fd, name, _CREATE_FLAGS, REPORT_MODE)
        except OSError as exc:
            return WriteOutcome.EXISTS if exc.errno == errno.EEXIST else WriteOutcome.NOT_CREATED
        # From here on the file exists: any failure leaves its state unknown (DESIGN §2).
        try:
            try:
                view = memoryview(data)
                while view:
                    written = os.write(fd, view)
                    view = view[written:]
                os.fsync(fd)
            finally:
                os.close(fd)
        except OSError:
            return WriteOutcome.UNKNOWN
        return WriteOutcome.CREATED


def _read_at_most(fd: int, size: int) -> bytes:
    chunks: list[bytes] = []
    remaining = size
    while remaining > 0:
        chunk = os.read(fd, min(remaining, 65_536))
        if not chunk:
            break
        chunks.append(chunk)
        remaining -= len(chunk)
    return b"".join(chunks)
