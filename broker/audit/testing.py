"""Helpers for tests of code that emits audit events (the role of structlog.testing.capture_logs).

    async with capture_audit() as (audit, sink):
        await gateway_call(audit=audit, ...)
        assert sink.events[-1]["outcome"] == "ok"
        sink.failing = True          # the next write fails like a full disk: the caller must refuse

Events pass through the real pipeline (allow-list, validators, chain), so what a test sees is what
the file would hold.
"""

from __future__ import annotations

import errno
import json
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from typing import Any

from broker.audit.log import AuditLog
from broker.settings import AuditFsync


class MemorySink:
    """A `Sink` in memory. While `failing` is set, write and sync raise OSError(ENOSPC)."""

    def __init__(self) -> None:
        self.data = bytearray()
        self.failing = False

    def open(self) -> bytes | None:
        del self.data[self.data.rfind(b"\n") + 1 :]  # cut a torn tail, as FileSink does
        lines = self.lines
        return lines[-1] if lines else None

    def write(self, data: bytes) -> None:
        if self.failing:
            raise OSError(errno.ENOSPC, "no space left (MemorySink.failing)")
        self.data += data

    def sync(self) -> None:
        if self.failing:
            raise OSError(errno.ENOSPC, "no space left (MemorySink.failing)")

    def close(self) -> None:
        pass

    @property
    def size(self) -> int:
        return len(self.data)

    def rotate(self) -> None:
        raise OSError(errno.EINVAL, "MemorySink does not rotate")

    def prune(self, keep: int) -> int:
        return 0  # nothing rotated

    def read_back(self) -> Iterator[bytes]:
        return reversed(self.lines)

    @property
    def lines(self) -> list[bytes]:
        return bytes(self.data).splitlines()

    @property
    def events(self) -> list[dict[str, Any]]:
        return [json.loads(line) for line in self.lines]


@asynccontextmanager
async def capture_audit() -> AsyncIterator[tuple[AuditLog, MemorySink]]:
    sink = MemorySink()
    # ALWAYS: no background thread to outlive the test; fsync of memory costs nothing.
    log = await AuditLog.with_sink(sink, fsync=AuditFsync.ALWAYS)
    try:
        yield log, sink
    finally:
        await log.close()
