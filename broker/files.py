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
its content (DESIGN: names only); a name is shown with its control characters escaped, since a
planted `audit.jsonl.\x1b]…` must not drive the terminal of whoever reads the error.
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import os
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO, Final

_READ_FLAGS: Final = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC


class UnsafeFileError(Exception):
    """The file cannot be used: missing, not a regular file, a link, too large, too open.

    `reason` is the message without the file's name (for a caller that names the file its own
    way); `errno` the open's error number when the open itself failed (ENOENT: a caller that
    polls for a file, like `audit query --follow`, waits for it), else None."""

    def __init__(self, message: str, *, reason: str | None = None, errno: int | None = None) -> None:
        super().__init__(message)
        self.reason = reason if reason is not None else message
        self.errno = errno


def _refuse(name: str, reason: str, errno: int | None = None) -> UnsafeFileError:
    return UnsafeFileError(f"{name}: {reason}", reason=reason, errno=errno)


def printable(text: str) -> str:
    """`text` with control and other unprintable characters as escapes: safe on a terminal."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else ascii(c)[1:-1] for c in text)


class FileTooLargeError(UnsafeFileError):
    """The file holds more than the caller's limit (nothing of it is returned)."""


def open_regular(path: str | Path, *, follow_links: bool = False) -> int:
    """An fd for reading `path`, which must be a regular file; blocking mode restored.

    `follow_links=False` refuses a symlink as the last component (ELOOP): the safe default
    for key files. Audit tools given a path on the command line may follow (an operator's
    `audit.jsonl` link to the current log is fine); what the link points to must still be a
    regular file.
    """
    name = printable(Path(path).name)
    flags = _READ_FLAGS | (0 if follow_links else os.O_NOFOLLOW)
    try:
        fd = os.open(path, flags)
    except OSError as exc:
        if exc.errno == errno.ELOOP:  # the last component is a symlink and O_NOFOLLOW said no
            raise _refuse(name, "is a symbolic link (refused)", exc.errno) from None
        raise _refuse(name, f"cannot be read ({exc.strerror})", exc.errno) from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise _refuse(name, "not a regular file (refused)")
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
    name = printable(Path(path).name)
    fd = open_regular(path, follow_links=follow_links)
    try:
        info = os.fstat(fd)
        if private and info.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
            raise _refuse(name, "must not be readable by group or others (chmod 600)")
        data = os.read(fd, limit + 1)
        while len(data) <= limit:
            more = os.read(fd, limit + 1 - len(data))
            if not more:
                break
            data += more
    except OSError as exc:
        raise _refuse(name, f"cannot be read ({exc.strerror})", exc.errno) from None
    finally:
        os.close(fd)
    if len(data) > limit:
        reason = f"larger than {limit} bytes (refused)"
        raise FileTooLargeError(f"{name}: {reason}", reason=reason)
    return data


def read_secret(path: str | Path, limit: int) -> str:
    """A secret kept in a file (a client secret, a webhook key): its text, stripped; chmod 600
    like every key file. A link is followed (a Kubernetes Secret volume is links to its
    files); what it points to is what must be private. UnsafeFileError, or on bytes that are
    not UTF-8 an UnsafeFileError too (never the bytes)."""
    data = read_bounded(path, limit, private=True, follow_links=True)
    try:
        return data.decode().strip()
    except UnicodeDecodeError:
        raise _refuse(printable(Path(path).name), "is not UTF-8 text") from None


def bounded_lines(stream: BinaryIO, limit: int) -> Iterator[bytes]:
    """The lines of `stream`, each with its newline (the last may lack one), never more than
    `limit + 1` bytes held.

    A line longer than `limit` comes out once, as its first `limit + 1` bytes (so `len(line) >
    limit` tells the caller), and the rest of it is read and dropped: a 200 MB line planted in
    a log costs one line's bound of memory and counts as one line, not as 200 pieces.
    """
    while raw := stream.readline(limit + 1):
        if len(raw) > limit and not raw.endswith(b"\n"):
            while (rest := stream.readline(limit + 1)) and not rest.endswith(b"\n"):
                pass
        yield raw


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
