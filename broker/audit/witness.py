"""Copies of the log's lines for elsewhere: the witness file (checkpoints and gap records, for an
operator to ship off the host) and stdout (every line, for a log collector).

A copy is best effort: the log file is the record and fails closed; a copy that cannot be
written is counted (`AuditStats.witness_failures`, `stdout_failures`; on /metrics) and logged,
and requests go on.
"""

from __future__ import annotations

import errno
import logging
import os
from pathlib import Path
from typing import Protocol

logger = logging.getLogger(__name__)


class Copy(Protocol):
    failures: int

    def write(self, data: bytes) -> None: ...

    def close(self) -> None: ...


class FileCopy:
    """An append-only file, mode 0600, opened on first use and again after a failure."""

    _FLAGS = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW

    def __init__(self, path: Path) -> None:
        self.path = path
        self.failures = 0
        self._fd: int | None = None

    def write(self, data: bytes) -> None:
        try:
            if self._fd is None:
                self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
                self._fd = os.open(self.path, self._FLAGS, 0o600)
            if os.write(self._fd, data) != len(data):
                raise OSError(errno.EIO, "short write")
        except OSError as exc:
            self.failures += 1
            self.close()
            logger.error(
                "audit witness file write failed (%s)", errno.errorcode.get(exc.errno or 0, "unknown")
            )

    def close(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)


class StdoutCopy:
    """Every audit line on the process's stdout, as JSON Lines (the broker's own logs go to stderr).

    A blocking write, like any logger's: a collector that stops reading a full pipe stalls the
    broker, so point collectors that may stall at the file instead."""

    def __init__(self) -> None:
        self.failures = 0
        self._fd: int | None = os.dup(1)

    def write(self, data: bytes) -> None:
        if self._fd is None:
            return
        try:
            view = memoryview(data)
            while view:  # a pipe may take part of a large line
                view = view[os.write(self._fd, view) :]
        except OSError:
            self.failures += 1

    def close(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)
