"""AuditLog: strict ordering under concurrency, fsync policy, and failing closed for real."""

from __future__ import annotations

import errno
import json
import os
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path
from typing import Any

import anyio
import pytest

from broker.audit import AuditLog, AuditSinkError, verify_file
from broker.audit.sink import FileSink
from broker.audit.testing import MemorySink, capture_audit
from broker.settings import AuditFsync, AuditSettings
from tests.broker.audit.audit_helpers import CANARY, plain, read_events, request_fields

pytestmark = pytest.mark.anyio


async def test_concurrent_emits_are_strictly_ordered(audit: AuditLog, log_path: Path) -> None:
    async with anyio.create_task_group() as tg:
        for i in range(100):
            tg.start_soon(partial(audit.emit, "mcp.request", **request_fields(i)))
    events = read_events(log_path)
    assert [e["seq"] for e in events] == list(range(1, 101))
    assert sorted(e["request_id"] for e in events) == sorted(f"req-{i:06d}" for i in range(100))
    assert verify_file(log_path).ok


async def test_concurrent_emits_with_fsync_always(log_path: Path) -> None:
    # ALWAYS runs each emit in a worker thread: ordering must hold across threads too.
    async with await AuditLog.open(plain(log_path, fsync=AuditFsync.ALWAYS)) as log:
        async with anyio.create_task_group() as tg:
            for i in range(100):
                tg.start_soon(partial(log.emit, "mcp.request", **request_fields(i)))
        assert log.stats.written == 100
    assert [e["seq"] for e in read_events(log_path)] == list(range(1, 101))
    assert verify_file(log_path).ok


class CountingSink(FileSink):
    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self.syncs = 0
        self.fail_sync = False

    def sync(self) -> None:
        self.syncs += 1
        if self.fail_sync:
            raise OSError(errno.EIO, "injected fsync failure")
        super().sync()


async def test_fsync_always_syncs_before_emit_returns(log_path: Path) -> None:
    sink = CountingSink(log_path)
    async with await AuditLog.with_sink(sink, fsync=AuditFsync.ALWAYS) as log:
        for i in range(5):
            await log.emit("mcp.request", **request_fields(i))
            assert sink.syncs == i + 1


async def test_fsync_interval_batches_and_stays_quiet_when_idle(log_path: Path) -> None:
    sink = CountingSink(log_path)
    async with await AuditLog.with_sink(sink, fsync_interval_seconds=0.05) as log:
        for i in range(50):
            await log.emit("mcp.request", **request_fields(i))
        assert sink.syncs <= 1  # emit itself never fsyncs
        await _wait_for(lambda: sink.syncs >= 1)
        settled = sink.syncs
        await anyio.sleep(0.2)
        assert sink.syncs == settled  # nothing new written: no fsync
        await log.emit("mcp.request")
        await _wait_for(lambda: sink.syncs > settled)


async def test_a_failed_background_fsync_refuses_calls_until_recovered(log_path: Path) -> None:
    sink = CountingSink(log_path)
    async with await AuditLog.with_sink(sink, fsync_interval_seconds=0.02) as log:
        sink.fail_sync = True
        await log.emit("mcp.request", **request_fields(1))
        await _wait_for(lambda: not log.healthy)
        with pytest.raises(AuditSinkError):
            log.check()
        assert log.stats.sync_failures >= 1

        sink.fail_sync = False
        await log.emit("mcp.request", **request_fields(2))  # reopens, re-reads the tail
        assert log.healthy and log.stats.recoveries == 1
        log.check()
    assert [e["seq"] for e in read_events(log_path)] == [1, 2]
    assert verify_file(log_path).ok


async def test_close_fsyncs_pending_lines_and_refuses_later_emits(log_path: Path) -> None:
    sink = CountingSink(log_path)
    log = await AuditLog.with_sink(sink, fsync_interval_seconds=10)
    await log.emit("mcp.request")
    await log.close()
    await log.close()  # idempotent
    assert sink.syncs == 1
    assert not log.healthy
    with pytest.raises(AuditSinkError) as err:
        log.check()
    assert err.value.code == "closed"
    with pytest.raises(AuditSinkError):
        await log.emit("mcp.request")
    assert not any(t.name == "audit-fsync" for t in threading.enumerate())


def failing(path: Path, keys: Path, signed: bool, fsync: AuditFsync = AuditSettings.fsync) -> AuditSettings:
    """The log of a failure test: plain, or signed with checkpoints (every 5 lines) and a
    witness as the broker's own is by default, its key and witness off the failing disk."""
    if not signed:
        return plain(path, fsync=fsync)
    return AuditSettings(
        path=path, key_file=keys / "audit-signing.key", witness_file=keys / "witness.jsonl",
        fsync=fsync, checkpoint_every=5,
    )  # fmt: skip


@pytest.mark.parametrize("signed", [False, True], ids=["plain", "signed"])
@pytest.mark.parametrize("mode", list(AuditFsync))
async def test_fail_closed_on_dev_full(mode: AuditFsync, signed: bool, tmp_path: Path) -> None:
    # /dev/full accepts open() and fails every write with ENOSPC, like a full disk.
    log = await AuditLog.open(failing(Path("/dev/full"), tmp_path, signed, mode))
    try:
        # Signed, the first checkpoint cannot be written: it refuses from the start.
        assert log.healthy is not signed
        for _ in range(2):  # the second emit tries to recover by reopening, and fails again
            with pytest.raises(AuditSinkError) as err:
                await log.emit("mcp.request", subject=CANARY, **{"query": CANARY})
            assert err.value.code == "write_failed"
            assert CANARY not in str(err.value) and CANARY not in repr(err.value.__cause__)
            assert not log.healthy
            with pytest.raises(AuditSinkError):
                log.check()
        assert log.stats.write_failures == 2 + signed and log.stats.written == 0
    finally:
        await log.close()


@pytest.fixture
def tiny_fs(tmp_path: Path) -> Iterator[Path]:
    """A 16 KiB tmpfs. Needs root (CI runs as root); without it the test fails, it never skips."""
    mnt = tmp_path / "tiny"
    mnt.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16k,mode=0700", "tmpfs", str(mnt)], check=True)
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=True)


@pytest.mark.parametrize("signed", [False, True], ids=["plain", "signed"])
async def test_fail_closed_when_the_disk_fills_mid_run_then_recover(
    tiny_fs: Path, tmp_path: Path, signed: bool
) -> None:
    path = tiny_fs / "audit.jsonl"
    ballast = tiny_fs / "ballast"
    ballast.write_bytes(b"\0" * 8192)  # space we can give back later
    log = await AuditLog.open(failing(path, tmp_path, signed))
    try:
        written = 0
        with pytest.raises(AuditSinkError) as err:
            for i in range(1000):
                await log.emit("mcp.request", **request_fields(i))
                written += 1
        assert err.value.code in ("write_failed", "short_write")
        assert 0 < written < 1000
        assert not log.healthy
        with pytest.raises(AuditSinkError):
            log.check()
        # Whatever part of the failed line reached the disk, the acknowledged lines are intact.
        report = verify_file(path)
        kept = read_events_complete(path)
        assert report.ok or report.first_bad_line == len(kept) + 1
        assert [e["seq"] for e in kept] == list(range(1, len(kept) + 1))
        assert requests(kept) == [f"req-{i:06d}" for i in range(written)]
        assert any(e["event"] == "audit.checkpoint" for e in kept) is signed

        with pytest.raises(AuditSinkError):  # still full: recovery fails, still closed
            await log.emit("mcp.request", **request_fields(-1))

        os.unlink(ballast)
        await log.emit("mcp.request", **request_fields(written))  # reopen, cut torn tail, continue
        assert log.healthy and log.stats.recoveries >= 1
        log.check()
    finally:
        await log.close()
    report = verify_file(path)
    assert report.ok, report.problem
    events = read_events(path)
    assert [e["seq"] for e in events] == list(range(1, len(events) + 1))
    assert requests(events) == [f"req-{i:06d}" for i in range(written + 1)]
    # Signed, the outage is on the record: one gap line after the recovery, and it is witnessed.
    assert [e["event"] for e in events].count("audit.gap") == signed
    if signed:
        assert events[-1]["event"] == "audit.checkpoint"  # the close signs the last lines too
        witnessed = [json.loads(line) for line in (tmp_path / "witness.jsonl").read_bytes().splitlines()]
        assert sum("gap" in record for record in witnessed) == 1  # the gap record, copied


def requests(events: list[dict[str, Any]]) -> list[str]:
    return [str(e["request_id"]) for e in events if e["event"] == "mcp.request"]


def read_events_complete(path: Path) -> list[dict[str, object]]:
    """Events of the complete lines only (a failed write may leave a torn last line)."""
    data = path.read_bytes()
    return [json.loads(line) for line in data[: data.rfind(b"\n") + 1].splitlines()]


async def test_capture_audit_helper_shows_events_and_can_fail() -> None:
    async with capture_audit() as (log, sink):
        await log.emit("policy.denied", tenant="acme", reason="rate_limited", query=CANARY)
        assert sink.events[-1]["reason"] == "rate_limited" and sink.events[-1]["dropped"] == 1
        sink.failing = True
        with pytest.raises(AuditSinkError):
            await log.emit("mcp.request")
        with pytest.raises(AuditSinkError):
            log.check()
        sink.failing = False
        await log.emit("mcp.request")
        assert [e["seq"] for e in sink.events] == [1, 2]
        assert CANARY.encode() not in sink.data


class SyncCountingMemorySink(MemorySink):
    def __init__(self) -> None:
        super().__init__()
        self.syncs = 0

    def sync(self) -> None:
        self.syncs += 1
        super().sync()


async def test_memory_sink_works_with_the_interval_thread() -> None:
    sink = SyncCountingMemorySink()
    async with await AuditLog.with_sink(sink, fsync_interval_seconds=0.01) as log:
        await log.emit("sandbox.started", tenant="acme", sandbox="ctr-1", sandbox_mode="rootless")
        await _wait_for(lambda: sink.syncs >= 1)  # the interval thread has synced what it wrote
    assert sink.events[0]["sandbox_mode"] == "rootless"


async def test_emit_cost_fits_the_latency_budget(audit: AuditLog) -> None:
    # The broker may add 1.5 ms p50 in total; the default mode (write(2), batched fsync) must
    # stay far below that. Measured 20-70 µs on a shared 2-vCPU VM; the best of five batches
    # keeps a busy CI neighbour from failing the test.
    fields = request_fields()
    batches = []
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(400):
            await audit.emit("mcp.request", **fields)
        batches.append((time.perf_counter() - start) / 400)
    assert min(batches) < 300e-6, f"{min(batches) * 1e6:.0f} µs per emit"


async def _wait_for(predicate: Callable[[], bool], timeout: float = 2.0) -> None:
    with anyio.fail_after(timeout):
        while not predicate():
            await anyio.sleep(0.01)
