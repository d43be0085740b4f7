"""The audit log: one name-only event per request, and no request at all when it cannot be written.

    audit = await AuditLog.open(settings.audit)          # lifespan start-up
    audit.check()                                        # before forwarding: raises when broken
    await audit.emit(AuditEvent.MCP_REQUEST, tenant=..., outcome=Outcome.OK, ...)
    await audit.close()                                  # lifespan shutdown

Ordering: a lock covers "stamp seq/prev, render, write(2), advance the chain", so the file's
order is the chain's order however many tasks or threads emit at once.

Durability (measured on the broker's budget of 1.5 ms p50 for everything it adds): write(2) of a
line costs microseconds, fsync about a millisecond. With `AuditFsync.INTERVAL` (default) every line
is in the kernel before `emit` returns, so a broker crash loses nothing, and a background thread
fsyncs at most every `fsync_interval_seconds`: only a kernel crash or power cut can lose that
window. `AuditFsync.ALWAYS` fsyncs before `emit` returns (in a worker thread, so the event loop
keeps running; concurrent emits share one fsync when they overlap).

Failure: any failed write, short write or fsync marks the log unhealthy and raises
`AuditSinkError`; `check()` then refuses every call. The next `emit` (the refused request's own
terminal event) tries to recover by reopening the file and re-reading its tail, so seq and prev
continue from what is really on disk, whether or not the failed line got there.
"""

from __future__ import annotations

import errno
import logging
import threading
import time
from dataclasses import dataclass
from types import TracebackType
from typing import Any

import anyio.to_thread

from broker.audit.chain import Chain
from broker.audit.errors import AuditSinkError
from broker.audit.processors import Clock, Counters, build_logger
from broker.audit.schema import AuditEvent
from broker.audit.sink import FileSink, ShortWriteError, Sink
from broker.settings import AuditFsync, AuditSettings

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class AuditStats:
    """Totals since start-up, for /metrics. Non-zero keys_dropped/values_invalid mean a broker bug."""

    written: int
    keys_dropped: int
    values_invalid: int
    write_failures: int
    sync_failures: int
    recoveries: int


class _ChainedWriter:
    """The pipeline's end: write the line, and only then let the chain move past it."""

    def __init__(self, sink: Sink, chain: Chain) -> None:
        self._sink = sink
        self._chain = chain

    def write(self, line: str) -> None:
        data = line.encode("ascii")  # render_json uses ensure_ascii
        self._sink.write(data + b"\n")  # one write(2): O_APPEND places the whole line at the end
        self._chain.advance(data)


class AuditLog:
    def __init__(
        self,
        sink: Sink,
        *,
        fsync: AuditFsync = AuditFsync.INTERVAL,
        fsync_interval_seconds: float = 0.2,
        clock: Clock = time.time_ns,
    ) -> None:
        """Prefer `AuditLog.open(settings)` or `AuditLog.with_sink(sink)`, which also start it."""
        self._sink = sink
        self._fsync = fsync
        self._interval = fsync_interval_seconds
        self._lock = threading.Lock()
        self._chain = Chain()
        self._counters = Counters()
        self._pipeline = build_logger(_ChainedWriter(sink, self._chain), self._chain, self._counters, clock)
        self._healthy = False
        self._closed = True
        self._dirty = False  # written since the last fsync
        self._stop = threading.Event()
        self._syncer: threading.Thread | None = None
        self._written = self._write_failures = self._sync_failures = self._recoveries = 0

    @classmethod
    async def open(cls, settings: AuditSettings, *, clock: Clock = time.time_ns) -> AuditLog:
        """Open (or create, mode 0600) the log file and continue its chain. Raises AuditSinkError."""
        return await cls.with_sink(
            FileSink(settings.path),
            fsync=settings.fsync,
            fsync_interval_seconds=settings.fsync_interval_seconds,
            clock=clock,
        )

    @classmethod
    async def with_sink(
        cls,
        sink: Sink,
        *,
        fsync: AuditFsync = AuditFsync.INTERVAL,
        fsync_interval_seconds: float = 0.2,
        clock: Clock = time.time_ns,
    ) -> AuditLog:
        log = cls(sink, fsync=fsync, fsync_interval_seconds=fsync_interval_seconds, clock=clock)
        with log._lock:
            log._reopen()  # one open and a tail read: too short to be worth a thread hop
            log._closed = False
        if fsync is AuditFsync.INTERVAL:
            log._syncer = threading.Thread(target=log._sync_loop, name="audit-fsync", daemon=True)
            log._syncer.start()
        return log

    async def emit(self, event: AuditEvent | str, /, **fields: Any) -> None:
        """Write one event. Raises AuditSinkError (the caller must refuse the request).

        Keys outside the schema are dropped (only their count is written); values that do not
        fit their key are dropped (only the key's name is written, under `invalid`); None values
        are omitted. An event name outside `AuditEvent` raises UnknownEventError.
        """
        if self._fsync is AuditFsync.ALWAYS:
            await anyio.to_thread.run_sync(self._emit_durably, event, fields)
        else:
            self._emit(event, fields)

    @property
    def healthy(self) -> bool:
        return self._healthy and not self._closed

    def check(self) -> None:
        """Raise AuditSinkError unless the log can take events. Call before forwarding a request."""
        if self._closed:
            raise AuditSinkError("closed")
        if not self._healthy:
            raise AuditSinkError("unavailable")

    @property
    def head(self) -> tuple[int, str]:
        """(seq, sha256) of the last line written: anchor it elsewhere to detect a rewritten tail."""
        with self._lock:
            return self._chain.seq, self._chain.head

    def settle(self) -> None:
        """Hash the last line now. Optional: the gateway calls it once an answer has left, so
        the next event's path does not pay for the hash of this one."""
        with self._lock:
            self._chain.settle()

    @property
    def stats(self) -> AuditStats:
        with self._lock:
            return AuditStats(
                written=self._written,
                keys_dropped=self._counters.keys_dropped,
                values_invalid=self._counters.values_invalid,
                write_failures=self._write_failures,
                sync_failures=self._sync_failures,
                recoveries=self._recoveries,
            )

    async def close(self) -> None:
        """Stop the fsync thread, fsync what is pending, close the file. Idempotent."""
        await anyio.to_thread.run_sync(self._close)

    async def __aenter__(self) -> AuditLog:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    # -- internals -------------------------------------------------------------------------------

    def _emit(self, event: AuditEvent | str, fields: dict[str, Any]) -> None:
        with self._lock:
            if self._closed:
                raise AuditSinkError("closed")
            if not self._healthy:
                self._recover()
            try:
                self._pipeline.write(event, fields)
            except OSError as exc:
                self._healthy = False
                self._write_failures += 1
                code = "short_write" if isinstance(exc, ShortWriteError) else "write_failed"
                logger.error("audit log write failed (%s %s); refusing requests", code, _errno_name(exc))
                raise AuditSinkError(code) from exc
            self._written += 1
            self._dirty = True

    def _emit_durably(self, event: AuditEvent | str, fields: dict[str, Any]) -> None:
        self._emit(event, fields)
        # Outside the lock: another thread may write meanwhile, and our fsync covers its line too.
        try:
            self._sink.sync()
        except OSError as exc:
            self._sync_failed(exc)
            raise AuditSinkError("fsync_failed") from exc

    def _reopen(self) -> None:
        try:
            last = self._sink.open()
        except BlockingIOError as exc:  # flock: another process writes this log
            raise AuditSinkError("locked") from exc
        except OSError as exc:
            raise AuditSinkError("open_failed") from exc
        try:
            self._chain.resume(last)
        except ValueError as exc:
            # Appending after a line we cannot parse would make an unverifiable chain: refuse.
            self._sink.close()
            raise AuditSinkError("tail_invalid") from exc
        self._healthy = True

    def _recover(self) -> None:
        self._sink.close()
        self._reopen()
        self._recoveries += 1
        logger.warning("audit log reopened after a failure; accepting requests again")

    def _sync_loop(self) -> None:
        while not self._stop.wait(self._interval):
            self._sync_pending()

    def _sync_pending(self) -> None:
        with self._lock:
            # While unhealthy, leave the lines pending: after the reopen we fsync the same file.
            if not (self._dirty and self._healthy):
                return
            self._dirty = False
        try:
            self._sink.sync()
        except OSError as exc:
            self._sync_failed(exc)

    def _sync_failed(self, exc: OSError) -> None:
        # After a failed fsync the kernel may have dropped the dirty pages: stop taking requests
        # until a reopen re-reads what the file really holds.
        with self._lock:
            self._healthy = False
            self._dirty = True
            self._sync_failures += 1
        logger.error("audit log fsync failed (%s); refusing requests", _errno_name(exc))

    def _close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self._stop.set()
        if self._syncer is not None:
            self._syncer.join()
        try:
            if self._dirty and self._healthy:
                self._sink.sync()
        except OSError as exc:
            logger.error("audit log fsync at close failed (%s)", _errno_name(exc))
        finally:
            self._sink.close()


def _errno_name(exc: OSError) -> str:
    return errno.errorcode.get(exc.errno or 0, "unknown")
