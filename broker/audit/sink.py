"""Where audit lines go: the `Sink` interface and the file implementation.

A sink moves bytes and knows nothing of events. `open` also hands back the last complete line,
so the log can continue its hash chain across restarts and after a failed write.
"""

from __future__ import annotations

import errno
import fcntl
import logging
import os
import re
import stat
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Protocol

from broker.files import UnsafeFileError, open_regular, rename_noreplace

logger = logging.getLogger(__name__)

MAX_LINE_BYTES = 1 << 20  # far above any valid line (~20 KB with every list full)
_CHUNK = 64 * 1024


class ShortWriteError(OSError):
    """write(2) took only part of a line; the torn fragment is removed when the sink reopens."""

    def __init__(self) -> None:
        super().__init__(errno.EIO, "short write")


class Sink(Protocol):
    def open(self) -> bytes | None:
        """(Re)open; return the last complete line without its newline, or None for an empty log.

        A torn last line (no newline: a crash or failed write mid-line) is cut off first. It
        was never acknowledged, because `emit` raised and the request was refused.
        """

    def write(self, data: bytes) -> None:
        """Write `data` in one call or raise OSError (ShortWriteError for a partial write)."""

    def sync(self) -> None:
        """Force written data to stable storage. Safe to call from another thread."""

    def close(self) -> None: ...

    @property
    def size(self) -> int:
        """Bytes in the current file (what rotation compares with its limit)."""

    def rotate(self) -> None:
        """Close the current file under a rotated name and start an empty one (OSError if not)."""

    def prune(self, keep: int) -> int:
        """Remove all but the newest `keep` rotated files; how many were removed (OSError if not)."""

    def read_back(self) -> Iterator[bytes]:
        """Every complete line of the log's lineage, newest first, across rotated files."""


_ROTATED = re.compile(r"\.([0-9]{6,})")


def rotated_files(path: Path) -> list[Path]:
    """The rotated files of the log at `path`, oldest first (`audit.jsonl.000001`, ...)."""
    found = []
    for candidate in path.parent.glob(path.name + ".*"):
        match = _ROTATED.fullmatch(candidate.name[len(path.name) :])
        if match:
            found.append((int(match.group(1)), candidate))
    return [p for _, p in sorted(found)]


class FileSink:
    """One append-only file, mode 0600, locked against a second writer.

    O_APPEND makes every write land at the current end even if the file is also opened elsewhere;
    flock makes a second broker pointed at the same file fail at start rather than fork the chain.
    O_NOFOLLOW refuses a symlink planted at the log's path.
    """

    _FLAGS = os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fd: int | None = None
        self._regular = True  # fsync means nothing (or EINVAL) on /dev/full, a FIFO or a tty
        self._fd_lock = threading.Lock()  # sync() in the fsync thread vs open/close
        self._size = 0

    def open(self) -> bytes | None:
        self.close()
        self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd = os.open(self.path, self._FLAGS, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            st = os.fstat(fd)
            last = None
            # /dev/full, a FIFO or a tty have no tail to resume from; only regular files do.
            if stat.S_ISREG(st.st_mode):
                if st.st_mode & 0o077:
                    os.fchmod(fd, 0o600)  # who called what, when: for the broker's user only
                    logger.warning("audit log was readable by others; mode set to 0600")
                last = _read_tail(fd, st.st_size)
                size = os.fstat(fd).st_size
                if last is None:  # a fresh file after rotation: the chain goes on from the last one
                    last = next(self._read_rotated(), None)
            else:
                size = 0
        except BaseException:
            os.close(fd)
            raise
        with self._fd_lock:
            self._fd, self._regular, self._size = fd, stat.S_ISREG(st.st_mode), size
        return last

    @property
    def size(self) -> int:
        return self._size

    def rotate(self) -> None:
        """Rename the current file to the next free `NAME.NNNNNN` and open a new, empty one.

        The old file is fsynced first: once renamed, no interval fsync will reach it again."""
        if self._fd is None or not self._regular:
            raise OSError(errno.EINVAL, "audit sink cannot rotate")
        existing = rotated_files(self.path)
        index = int(existing[-1].name.rsplit(".", 1)[1]) + 1 if existing else 1
        target = self.path.with_name(f"{self.path.name}.{index:06d}")
        os.fsync(self._fd)
        # No-replace in one step: a file planted at the target after the listing is never lost.
        rename_noreplace(self.path, target)
        try:
            self.open()
        except BaseException:
            self.close()  # renamed: writing on would only grow the rotated file
            raise

    def prune(self, keep: int) -> int:
        old = rotated_files(self.path)[:-keep] if keep else []
        for path in old:  # oldest first: a failure midway leaves the newest ones
            path.unlink()
        if old:
            fd = os.open(self.path.parent, os.O_RDONLY | os.O_DIRECTORY)
            try:
                os.fsync(fd)  # the removals are on disk
            finally:
                os.close(fd)
        return len(old)

    def read_back(self) -> Iterator[bytes]:
        if self._fd is not None and self._regular:
            yield from _lines_backwards(self._fd, self._size)
        yield from self._read_rotated()

    def _read_rotated(self) -> Iterator[bytes]:
        for path in reversed(rotated_files(self.path)):
            # A FIFO or a link planted under a rotated name must not hang or redirect start-up.
            try:
                fd = open_regular(path)
            except UnsafeFileError as exc:
                raise OSError(errno.EINVAL, f"rotated audit file unusable ({exc.reason})") from None
            try:
                yield from _lines_backwards(fd, os.fstat(fd).st_size)
            finally:
                os.close(fd)

    def write(self, data: bytes) -> None:
        if self._fd is None:
            raise OSError(errno.EBADF, "audit sink is closed")
        written = os.write(self._fd, data)
        self._size += written
        if written != len(data):
            raise ShortWriteError()

    def sync(self) -> None:
        # fsync a duplicate so a concurrent reopen/close cannot pull the fd out from under us
        # (or hand its number to an unrelated file) during a multi-millisecond fsync.
        with self._fd_lock:
            if self._fd is None or not self._regular:
                return
            fd = os.dup(self._fd)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def close(self) -> None:
        with self._fd_lock:
            fd, self._fd, self._size = self._fd, None, 0
        if fd is not None:
            os.close(fd)


def _read_tail(fd: int, size: int) -> bytes | None:
    """Return the last complete line of the file (without newline); cut off a torn fragment."""
    last_newline = _rfind_newline(fd, size)
    if last_newline != size - 1:  # bytes after the last newline: a write that did not finish
        size = last_newline + 1
        os.ftruncate(fd, size)
        logger.warning("audit log ended in a torn line; removed it")
    if size == 0:
        return None
    start = _rfind_newline(fd, size - 1) + 1
    return os.pread(fd, size - 1 - start, start)


def _lines_backwards(fd: int, size: int) -> Iterator[bytes]:
    """Complete lines of a file (without newlines), last first; a torn fragment is skipped."""
    pos = _rfind_newline(fd, size)  # the newline ending the last complete line (-1: none)
    rest = b""  # the end of a line whose start lies before `pos`
    while pos > 0:
        start = max(0, pos - _CHUNK)
        parts = (os.pread(fd, pos - start, start) + rest).split(b"\n")
        pos, rest = start, parts[0]
        if len(rest) > MAX_LINE_BYTES:
            raise OSError(errno.EFBIG, "audit log line too long")
        yield from reversed(parts[1:])
    if pos == 0:
        yield rest


def _rfind_newline(fd: int, end: int) -> int:
    """Offset of the last newline before `end`, or -1 if none; never scans past one line's bound."""
    pos = end
    while pos > 0:
        if end - pos > MAX_LINE_BYTES:
            raise OSError(errno.EFBIG, "audit log line too long")
        start = max(0, pos - _CHUNK)
        found = os.pread(fd, pos - start, start).rfind(b"\n")
        if found != -1:
            return start + found
        pos = start
    return -1
