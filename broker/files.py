"""Opening files someone else may have planted: one way for key files and audit inputs.

A key file, an audit log, a witness or a proof is a path an operator typed or a glob matched,
in a folder an attacker may be able to write. Every such open here:

- opens once and checks what was opened (`fstat`), never `stat` then reopen — what is checked
  is what is read;
- refuses a symlink at the last component (`O_NOFOLLOW`) where the caller asks, so a link
  to `/dev/zero` or to another tenant's file is not read in its place;
- opens non-blocking, so a FIFO or a device cannot hang start-up or a security team's tool,
  then refuses anything but a regular file;
- bounds every read: a key file by its size limit, a stream by the caller's line limit.

Errors are `UnsafeFileError` whose message names the file's *name* and the problem, never
its content (DESIGN: names only).
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import os
import stat
from pathlib import Path
from typing import BinaryIO, Final

_READ_FLAGS: Final = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC


class UnsafeFileError(Exception):
    """The file cannot be used: missing, not a regular file, a link, too large, too open."""


class FileTooLargeError(UnsafeFileError):
    """The file holds more than the caller's limit (nothing of it is returned)."""


def open_regular(path: str | Path, *, follow_links: bool = False) -> int:
    """An fd for reading `path`, which must be a regular file; blocking mode restored.

    `follow_links=False` refuses a symlink as the last component (ELOOP): the safe default
    for key files. Audit tools given a path on the command line may follow (an operator's
    `audit.jsonl` link to the current log is fine); what the link points to must still be a
    regular file.
    """
    name = Path(path).name
    flags = _READ_FLAGS | (0 if follow_links else os.O_NOFOLLOW)
    try:
        fd = os.open(path, flags)
    except OSError as exc:
        if exc.errno == errno.ELOOP:  # the last component is a symlink and O_NOFOLLOW said no
            raise UnsafeFileError(f"{name}: is a symbolic link (refused)") from None
        raise UnsafeFileError(f"{name}: cannot be read ({exc.strerror})") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise UnsafeFileError(f"{name}: not a regular file (refused)")
        # Regular files never block; clear the flag so later reads behave as usual.
        fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~os.O_NONBLOCK)
    except BaseException:
        os.close(fd)
        raise
    return fd


def open_regular_stream(path: str | Path, *, follow_links: bool = True, buffering: int = -1) -> BinaryIO:
    """`open_regular` as a binary file object (the caller bounds its reads, e.g. readline(n))."""
    fd = open_regular(path, follow_links=follow_links)
    return os.fdopen(fd, "rb", buffering=buffering)


def read_bounded(path: str | Path, limit: int, *, private: bool = False, follow_links: bool = False) -> bytes:
    """The whole of a small file (a key, a secret): at most `limit` bytes, or UnsafeFileError.

    `private=True` also refuses a file readable or writable by group or others (chmod 600).
    """
    name = Path(path).name
    fd = open_regular(path, follow_links=follow_links)
    try:
        info = os.fstat(fd)
        if private and info.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
            raise UnsafeFileError(f"{name}: must not be readable by group or others (chmod 600)")
        data = os.read(fd, limit + 1)
        while len(data) <= limit:
            more = os.read(fd, limit + 1 - len(data))
            if not more:
                break
            data += more
    except OSError as exc:
        raise UnsafeFileError(f"{name}: cannot be read ({exc.strerror})") from None
    finally:
        os.close(fd)
    if len(data) > limit:
        raise FileTooLargeError(f"{name}: larger than {limit} bytes (refused)")
    return data


_RENAME_NOREPLACE: Final = 1  # linux/fs.h
_AT_FDCWD: Final = -100
_libc = ctypes.CDLL(None, use_errno=True)


def rename_noreplace(source: str | Path, target: str | Path) -> None:
    """Rename `source` to `target` unless `target` exists (FileExistsError): one atomic step.

    `exists()` then `rename()` leaves a window in which a file planted at `target` is replaced
    silently; renameat2(RENAME_NOREPLACE) has none. Where the filesystem lacks the flag
    (EINVAL), link + unlink gives the same no-replace guarantee, non-atomically.
    """
    src, dst = os.fsencode(source), os.fsencode(target)
    if _libc.renameat2(_AT_FDCWD, src, _AT_FDCWD, dst, _RENAME_NOREPLACE) == 0:
        return
    err = ctypes.get_errno()
    if err not in (errno.EINVAL, errno.ENOSYS):
        raise OSError(err, os.strerror(err), Path(os.fsdecode(dst)).name)
    os.link(src, dst, follow_symlinks=False)  # EEXIST if planted meanwhile
    os.unlink(src)
