# Over 450 lines: one class, the audit log: chain, sink, checkpoints and gap records ordered by one lock.
"""The audit log: one name-only event per request, and no request at all when it cannot be written.

    audit = await AuditLog.open(settings.audit)          # lifespan start-up
    audit.check()                                        # before forwarding: raises when broken
    await audit.emit(AuditEvent.MCP_REQUEST, tenant=..., outcome=Outcome.OK, ...)
    await audit.close()                                  # lifespan shutdown

Ordering: a lock covers "stamp seq/prev, render, write(2), advance the chain", so the file's
order is the chain's order however many tasks or threads emit at once.

Durability (against the broker's latency budget for everything it adds): write(2) of a line
is cheap, fsync is not (bench/audit_throughput.py measures both). With `AuditFsync.INTERVAL`
(default) every line is in the kernel before `emit` returns, so a broker crash loses nothing,
and a background thread fsyncs at most every `fsync_interval_seconds`: only a kernel crash or
power cut can lose that window. `AuditFsync.ALWAYS` fsyncs before `emit` returns (in a worker
thread, so the event loop keeps running; concurrent emits share one fsync when they overlap).

Failure: any failed write, short write or fsync marks the log unhealthy and raises
`AuditSinkError`; `check()` then refuses every call. The next `emit` (the refused request's own
terminal event) tries to recover by reopening the file and re-reading its tail, so seq and prev
continue from what is really on disk, whether or not the failed line got there.

Evidence (with a signing key, `AuditSettings.key_file`): every line is also a leaf of an RFC 6962
tree; every `checkpoint_every` lines, every `checkpoint_interval_seconds` (if anything was written),
at rotation and at close, a signed `audit.checkpoint` line goes into the log and to the witness
file. Every file starts with one. After an outage, the recovery writes a signed `audit.gap` line
first (how many requests were refused). With `rotate_bytes`, a file that reaches it is renamed to
`NAME.NNNNNN` and the chain goes on in a new file (broker.audit.notary, broker.audit.sink).
"""

from __future__ import annotations

import errno
import logging
import threading
import time
from dataclasses import dataclass, fields
from types import TracebackType
from typing import Any

import anyio.to_thread

from broker.audit.chain import Chain
from broker.audit.errors import AuditSinkError
from broker.audit.notary import HistoryError, Notary
from broker.audit.processors import AddHeader, Clock, Counters, build_logger, render_json
from broker.audit.schema import AuditEvent, SystemEvent
from broker.audit.sink import FileSink, ShortWriteError, Sink
from broker.audit.witness import Copy, FileCopy, StdoutCopy
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
    checkpoints: int = 0
    gaps: int = 0
    rotations: int = 0
    # Copies that could not be written (the log has the lines): a failing witness means the
    # checkpoints stop reaching the place that can catch a cut-back log.
    witness_failures: int = 0
    stdout_failures: int = 0

    @property
    def copy_failures(self) -> int:
        return self.witness_failures + self.stdout_failures

    def totals(self) -> dict[str, int]:
        """Every counter by its field name: what /metrics exports (broker/metrics.py)."""
        return {f.name: getattr(self, f.name) for f in fields(self)}


class _ChainedWriter:
    """The pipeline's end: write the line, and only then let the chain move past it."""

    def __init__(self, sink: Sink, chain: Chain, stdout: Copy | None) -> None:
        self._sink = sink
        self._chain = chain
        self._stdout = stdout

    def write(self, line: str) -> None:
        data = line.encode("ascii")  # render_json uses ensure_ascii
        self._sink.write(data + b"\n")  # one write(2): O_APPEND places the whole line at the end
        self._chain.advance(data)
        if self._stdout is not None:
            self._stdout.write(data + b"\n")


@dataclass(frozen=True)
class Evidence:
    """What the log does beyond the chain (all off for `AuditLog.with_sink` unless given)."""

    notary: Notary | None = None
    witness: Copy | None = None
    stdout: Copy | None = None
    checkpoint_every: int = 1000
    checkpoint_interval_seconds: float = 10.0
    rotate_bytes: int = 0  # 0: never
    keep_files: int = 0  # rotated files kept after a rotation, the newest (0: all)


class AuditLog:
    def __init__(
        self,
        sink: Sink,
        *,
        fsync: AuditFsync = AuditFsync.INTERVAL,
        fsync_interval_seconds: float = 0.2,
        clock: Clock = time.time_ns,
        evidence: Evidence | None = None,
        replica: str | None = None,
    ) -> None:
        """Prefer `AuditLog.open(settings)` or `AuditLog.with_sink(sink)`, which also start it.

        `replica`: stamped on every line (the broker always gives its DOCBROKER_REPLICA_ID)."""
        self._sink = sink
        self._fsync = fsync
        self._interval = fsync_interval_seconds
        self._lock = threading.Lock()
        self._chain = Chain()
        self._counters = Counters()
        self._evidence = evidence or Evidence()
        self._notary = self._evidence.notary
        self._writer = _ChainedWriter(sink, self._chain, self._evidence.stdout)
        self._pipeline = build_logger(self._writer, self._chain, self._counters, clock, replica)
        self._header = AddHeader(self._chain, clock, replica)
        self._clock = clock
        self._healthy = False
        self._closed = True
        self._dirty = False  # written since the last fsync
        self._stop = threading.Event()
        self._syncer: threading.Thread | None = None
        self._checkpointer: threading.Thread | None = None
        self._written = self._write_failures = self._sync_failures = self._recoveries = 0
        self._checkpoints = self._gaps = self._rotations = 0
        self._outage_since: int | None = None  # clock() when the log became unwritable
        self._refused = self._lost = 0  # during the current outage
        self._next_rotation = self._evidence.rotate_bytes

    @classmethod
    async def open(cls, settings: AuditSettings, *, clock: Clock = time.time_ns) -> AuditLog:
        """Open (or create, mode 0600) the log file and continue its chain. Raises AuditSinkError.

        With `settings.key_file`, the signing key is created there (mode 0600) on first start."""
        return await cls.with_sink(
            FileSink(settings.path),
            fsync=settings.fsync,
            fsync_interval_seconds=settings.fsync_interval_seconds,
            clock=clock,
            evidence=_evidence(settings, clock),
            replica=settings.replica,
        )

    @classmethod
    async def with_sink(
        cls,
        sink: Sink,
        *,
        fsync: AuditFsync = AuditFsync.INTERVAL,
        fsync_interval_seconds: float = 0.2,
        clock: Clock = time.time_ns,
        evidence: Evidence | None = None,
        replica: str | None = None,
    ) -> AuditLog:
        log = cls(
            sink,
            fsync=fsync,
            fsync_interval_seconds=fsync_interval_seconds,
            clock=clock,
            evidence=evidence,
            replica=replica,
        )
        with log._lock:
            try:
                log._reopen()  # one open and a tail read: too short to be worth a thread hop
            except AuditSinkError as exc:
                # Opened, but the first checkpoint could not be written (a full disk, /dev/full):
                # start refusing requests, as after any failed write, rather than not at all.
                if exc.code not in ("write_failed", "short_write"):
                    raise
                log._lost = 0
            log._closed = False
        if fsync is AuditFsync.INTERVAL:
            log._syncer = threading.Thread(target=log._sync_loop, name="audit-fsync", daemon=True)
            log._syncer.start()
        if log._notary is not None:
            log._checkpointer = threading.Thread(
                target=log._checkpoint_loop, name="audit-checkpoint", daemon=True
            )
            log._checkpointer.start()
        return log

    async def emit(self, event: AuditEvent, /, **fields: Any) -> None:
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
            self._refused += 1  # counted in the gap record once the log is back
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
                checkpoints=self._checkpoints,
                gaps=self._gaps,
                rotations=self._rotations,
                witness_failures=self._evidence.witness.failures if self._evidence.witness else 0,
                stdout_failures=self._evidence.stdout.failures if self._evidence.stdout else 0,
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

    def _emit(self, event: AuditEvent, fields: dict[str, Any]) -> None:
        with self._lock:
            if self._closed:
                raise AuditSinkError("closed")
            try:
                if not self._healthy:
                    self._recover()
                self._pipeline.write(event, fields)
            except OSError as exc:
                raise self._write_failed(exc) from exc
            except AuditSinkError:
                self._lost += 1
                raise
            self._written += 1
            self._dirty = True
            if self._notary is not None or self._next_rotation:
                self._after_write()

    def _write_failed(self, exc: OSError) -> AuditSinkError:
        self._healthy = False
        self._write_failures += 1
        self._lost += 1
        if self._outage_since is None:
            self._outage_since = self._clock()
        code = "short_write" if isinstance(exc, ShortWriteError) else "write_failed"
        logger.error("audit log write failed (%s %s); refusing requests", code, _errno_name(exc))
        return AuditSinkError(code)

    def _after_write(self) -> None:
        """Checkpoint or rotate when due; a failure here only marks the log unhealthy, since the
        caller's own line is written."""
        notary = self._notary
        if notary is not None:
            notary.since += 1
        try:
            if self._next_rotation and self._sink.size >= self._next_rotation:
                self._rotate()
            elif notary is not None and notary.since >= self._evidence.checkpoint_every:
                self._write_checkpoint()
        except OSError as exc:
            self._write_failed(exc)
            self._lost -= 1  # nothing of the caller's was lost

    def _system_line(self, event: SystemEvent, fields: dict[str, Any]) -> None:
        record = self._header(None, "", {"event": event.value, **fields})
        self._writer.write(render_json(None, "", record))

    def _write_checkpoint(self) -> None:
        assert self._notary is not None and self._chain.tree is not None
        self._chain.settle()
        fields = self._notary.checkpoint(self._chain.tree)
        self._system_line(SystemEvent.CHECKPOINT, fields)
        self._notary.since = 0
        self._checkpoints += 1
        self._dirty = True
        self._copy_to_witness({"checkpoint": fields["checkpoint"], "sig": fields["sig"]})

    def _copy_to_witness(self, record: dict[str, Any]) -> None:
        if self._evidence.witness is not None:
            self._evidence.witness.write(render_json(None, "", record).encode("ascii") + b"\n")

    def _rotate(self) -> None:
        self._chain.settle()
        try:
            self._sink.rotate()
        except OSError as exc:
            if self._sink.size and self._healthy:  # still on the old file: try again a little later
                self._next_rotation = self._sink.size + max(1, self._evidence.rotate_bytes // 16)
                logger.warning(
                    "audit log rotation failed (%s); continuing in the same file", _errno_name(exc)
                )
                return
            raise
        self._rotations += 1
        self._next_rotation = self._evidence.rotate_bytes
        if self._notary is not None:
            self._write_checkpoint()  # the new file starts with one
        if self._evidence.keep_files:
            self._prune()

    def _prune(self) -> None:
        """Remove the rotated files older than the newest `keep_files`: the volume stays bounded.
        The new file starts with a checkpoint over every line so far, so what is left still
        verifies (`audit verify`: "earlier files not given"); the removed lines were on stdout
        when written, for the collector. A failure is logged and retried at the next rotation."""
        try:
            removed = self._sink.prune(self._evidence.keep_files)
        except OSError as exc:
            logger.warning("audit log retention failed (%s); kept the rotated files", _errno_name(exc))
            return
        if removed:
            logger.warning("audit log retention: removed %d rotated file(s) beyond the kept ones", removed)

    def _checkpoint_if_due(self, minimum: int) -> bool:
        with self._lock:
            if self._closed or not self._healthy or self._notary is None or self._notary.since < minimum:
                return False
            try:
                self._write_checkpoint()
            except OSError as exc:
                self._write_failed(exc)
                self._lost -= 1
                return False
            return True

    def _checkpoint_loop(self) -> None:
        while not self._stop.wait(self._evidence.checkpoint_interval_seconds):
            self._checkpoint_if_due(1)

    def _emit_durably(self, event: AuditEvent, fields: dict[str, Any]) -> None:
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
            if self._notary is not None:
                self._chain.tree = self._notary.resume(self._sink.read_back(), self._chain.seq)
        except HistoryError as exc:
            self._sink.close()
            raise AuditSinkError("history_invalid") from exc
        except ValueError as exc:
            # Appending after a line we cannot parse would make an unverifiable chain: refuse.
            self._sink.close()
            raise AuditSinkError("tail_invalid") from exc
        except OSError as exc:
            self._sink.close()
            raise AuditSinkError("open_failed") from exc
        if self._notary is not None and (self._sink.size == 0 or self._notary.count == 0):
            # Every file starts with a checkpoint (the log id, or where the last file ended); a
            # log from before checkpoints gets its first one, over every line so far, right away.
            try:
                self._write_checkpoint()
            except OSError as exc:
                raise self._write_failed(exc) from exc
        self._healthy = True

    def _recover(self) -> None:
        self._sink.close()
        self._reopen()
        self._recoveries += 1
        logger.warning("audit log reopened after a failure; accepting requests again")
        if self._outage_since is not None and self._notary is not None:
            # Before the event that triggered the recovery: the record of what was refused.
            self._chain.settle()
            assert self._chain.tree is not None
            gap = self._notary.gap(self._chain.tree.size, self._outage_since, self._refused, self._lost)
            self._system_line(SystemEvent.GAP, gap)
            self._notary.since += 1
            self._gaps += 1
            self._copy_to_witness(gap)
        self._outage_since = None
        self._refused = self._lost = 0

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
            if self._outage_since is None:
                self._outage_since = self._clock()
        logger.error("audit log fsync failed (%s); refusing requests", _errno_name(exc))

    def _close(self) -> None:
        self._checkpoint_if_due(1)  # at shutdown: the last lines are signed too
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self._stop.set()
        for thread in (self._syncer, self._checkpointer):
            if thread is not None:
                thread.join()
        try:
            if self._dirty and self._healthy:
                self._sink.sync()
        except OSError as exc:
            logger.error("audit log fsync at close failed (%s)", _errno_name(exc))
        finally:
            self._sink.close()
            for copy in (self._evidence.witness, self._evidence.stdout):
                if copy is not None:
                    copy.close()


def _evidence(settings: AuditSettings, clock: Clock) -> Evidence:
    stdout = StdoutCopy() if settings.stdout else None
    if settings.key_file is None:
        return Evidence(stdout=stdout, rotate_bytes=settings.rotate_bytes, keep_files=settings.keep_files)
    from broker.audit.checkpoint import KeyFileError, create_signing_key, load_signing_key

    try:
        if create_signing_key(settings.key_file):
            logger.warning("created a new audit signing key; give its public key to the security team")
        signer = load_signing_key(settings.key_file)
    except (KeyFileError, OSError) as exc:
        raise AuditSinkError("key_invalid") from exc
    return Evidence(
        notary=Notary(signer, settings.replica, clock),
        witness=FileCopy(settings.witness_file) if settings.witness_file else None,
        stdout=stdout,
        checkpoint_every=settings.checkpoint_every,
        checkpoint_interval_seconds=settings.checkpoint_interval_seconds,
        rotate_bytes=settings.rotate_bytes,
        keep_files=settings.keep_files,
    )


def _errno_name(exc: OSError) -> str:
    return errno.errorcode.get(exc.errno or 0, "unknown")
