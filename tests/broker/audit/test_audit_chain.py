"""The hash chain: every line links to the one before, across restarts and torn writes."""

from __future__ import annotations

import hashlib
import json
import os
import re
import stat
from pathlib import Path

import pytest

from broker.audit import AuditEvent, AuditLog, AuditSinkError, verify_file
from broker.settings import default_replica_id
from tests.broker.audit.audit_helpers import plain, read_events, request_fields

pytestmark = pytest.mark.anyio

GENESIS = "0" * 64


def assert_chain(path: Path, first_seq: int = 1) -> None:
    """Recompute the chain independently of broker.audit.verify."""
    lines = path.read_bytes().split(b"\n")
    assert lines[-1] == b"", "file must end with a newline"
    prev = GENESIS
    for i, line in enumerate(lines[:-1]):
        record = json.loads(line)
        assert record["seq"] == first_seq + i
        assert record["prev"] == prev
        assert record["v"] == 1
        assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", record["ts"])
        prev = hashlib.sha256(line).hexdigest()


async def test_chain_over_many_events(audit: AuditLog, log_path: Path) -> None:
    for i in range(500):
        await audit.emit(AuditEvent.MCP_REQUEST, **request_fields(i))
    assert_chain(log_path)
    report = verify_file(log_path)
    assert report.ok and report.lines == 500
    assert audit.head == (500, report.head)


async def test_settling_between_lines_leaves_the_same_chain(audit: AuditLog, log_path: Path) -> None:
    # The gateway settles after each answer; a line's hash must not depend on when it is taken.
    for i in range(20):
        await audit.emit(AuditEvent.MCP_REQUEST, **request_fields(i))
        if i % 3:
            audit.settle()
            audit.settle()  # twice: nothing pending the second time
    assert_chain(log_path)
    assert audit.head == (20, verify_file(log_path).head)


async def test_line_is_canonical_json(audit: AuditLog, log_path: Path) -> None:
    await audit.emit("auth.denied", reason="token_expired", status=401, header_names=[])
    line = log_path.read_bytes()
    record = json.loads(line)
    assert line == json.dumps(record, sort_keys=True, separators=(",", ":")).encode() + b"\n"
    assert record == {
        "v": 1, "seq": 1, "ts": record["ts"], "prev": GENESIS, "replica": default_replica_id(),
        "event": "auth.denied", "reason": "token_expired", "status": 401, "header_names": [],
    }  # fmt: skip


async def test_every_line_names_its_replica_and_a_caller_cannot_change_it(log_path: Path) -> None:
    settings = plain(log_path, replica="broker-b")
    async with await AuditLog.open(settings) as log:
        await log.emit("auth.denied", reason="token_expired", status=401)
        await log.emit("auth.denied", reason="token_expired", status=401, replica="broker-a")
    records = [json.loads(line) for line in log_path.read_bytes().splitlines()]
    assert [r["replica"] for r in records] == ["broker-b", "broker-b"]
    assert records[1]["dropped"] == 1  # the caller's `replica` is an unknown key, dropped
    assert verify_file(log_path).ok


async def test_timestamp_is_rfc3339_utc_milliseconds(log_path: Path) -> None:
    ns = 1_785_230_102_123_999_999  # 2026-07-28T09:15:02.123999999Z: truncated, not rounded
    async with await AuditLog.open(plain(log_path), clock=lambda: ns) as log:
        await log.emit("sandbox.started", tenant="acme", sandbox="ctr-1")
    assert read_events(log_path)[0]["ts"] == "2026-07-28T09:15:02.123Z"


async def test_restart_continues_seq_and_chain(log_path: Path) -> None:
    settings = plain(log_path)
    for run in range(3):
        async with await AuditLog.open(settings) as log:
            assert log.head[0] == run * 10
            for i in range(10):
                await log.emit("mcp.request", **request_fields(i))
    assert_chain(log_path)
    assert [e["seq"] for e in read_events(log_path)] == list(range(1, 31))
    assert verify_file(log_path).ok


async def test_restart_cuts_a_torn_last_line_and_continues(log_path: Path) -> None:
    settings = plain(log_path)
    async with await AuditLog.open(settings) as log:
        for i in range(5):
            await log.emit("mcp.request", **request_fields(i))
    with open(log_path, "ab") as f:
        f.write(b'{"event":"mcp.request","prev":"ab')  # a crash in the middle of a write
    assert verify_file(log_path).first_bad_line == 6

    async with await AuditLog.open(settings) as log:
        assert log.head[0] == 5
        await log.emit("mcp.request", **request_fields(6))
    assert_chain(log_path)
    assert verify_file(log_path).lines == 6


async def test_refuses_to_append_after_an_unparseable_last_line(log_path: Path) -> None:
    log_path.parent.mkdir(parents=True)
    log_path.write_bytes(b"this is not an audit event\n")
    with pytest.raises(AuditSinkError) as err:
        await AuditLog.open(plain(log_path))
    assert err.value.code == "tail_invalid"


async def test_refuses_to_append_after_a_last_line_of_100k_nested_brackets(log_path: Path) -> None:
    # Planted by someone who can write the folder: the broker must refuse the log, not crash.
    log_path.parent.mkdir(parents=True)
    log_path.write_bytes(b"[" * 100_000 + b"\n")
    with pytest.raises(AuditSinkError) as err:
        await AuditLog.open(plain(log_path))
    assert err.value.code == "tail_invalid"


async def test_file_is_created_0600_and_an_open_one_tightened(tmp_path: Path) -> None:
    fresh = tmp_path / "a" / "audit.jsonl"
    async with await AuditLog.open(plain(fresh)) as log:
        await log.emit("sandbox.stopped", tenant="acme")
    assert stat.S_IMODE(fresh.stat().st_mode) == 0o600

    loose = tmp_path / "loose.jsonl"
    loose.touch()
    os.chmod(loose, 0o644)
    async with await AuditLog.open(plain(loose)):
        pass
    assert stat.S_IMODE(loose.stat().st_mode) == 0o600


async def test_refuses_a_symlink_at_the_log_path(tmp_path: Path) -> None:
    target = tmp_path / "elsewhere.jsonl"
    link = tmp_path / "audit.jsonl"
    link.symlink_to(target)
    with pytest.raises(AuditSinkError) as err:
        await AuditLog.open(plain(link))
    assert err.value.code == "open_failed"
    assert not target.exists()


async def test_a_second_writer_on_the_same_file_is_refused(audit: AuditLog, log_path: Path) -> None:
    # Two brokers appending to one file would fork the chain.
    with pytest.raises(AuditSinkError) as err:
        await AuditLog.open(plain(log_path))
    assert err.value.code == "locked"
    await audit.emit("sandbox.started", tenant="acme")
    assert verify_file(log_path).ok
