"""Only allow-listed keys with values of their promised shape reach the file; canaries never do."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import structlog
from structlog.typing import EventDict

from broker.audit import AuditEvent, AuditLog, UnknownEventError, verify_file
from broker.types import DaemonMode, Outcome
from tests.broker.audit.audit_helpers import CANARY, read_events, request_fields

pytestmark = pytest.mark.anyio


def assert_no_canary(path: Path) -> None:
    raw = path.read_bytes()
    assert CANARY.encode() not in raw
    assert json.dumps(CANARY)[1:-1].encode() not in raw


SECRET_BEARING_KEYS = [
    "arguments", "query", "content", "token", "authorization", "Authorization", "filename", "excerpt", "exc",
]  # fmt: skip


@pytest.mark.parametrize("key", SECRET_BEARING_KEYS)
async def test_unknown_keys_are_dropped_and_counted(audit: AuditLog, log_path: Path, key: str) -> None:
    await audit.emit("mcp.request", **request_fields(), **{key: CANARY})
    assert_no_canary(log_path)
    [event] = read_events(log_path)
    assert key not in event
    assert event["dropped"] == 1
    assert audit.stats.keys_dropped == 1
    assert verify_file(log_path).ok


async def test_a_key_name_is_never_written_either(audit: AuditLog, log_path: Path) -> None:
    await audit.emit("mcp.request", **{CANARY: 1, f"x_{CANARY}": None})
    assert_no_canary(log_path)
    assert read_events(log_path)[0]["dropped"] == 2


async def test_callers_cannot_set_the_pipeline_fields(audit: AuditLog, log_path: Path) -> None:
    await audit.emit("mcp.request", v=2, seq=999, ts=CANARY, prev="f" * 64, invalid=["tool"], dropped=0)
    [event] = read_events(log_path)
    assert (event["v"], event["seq"], event["prev"]) == (1, 1, "0" * 64)
    assert event["dropped"] == 6 and "invalid" not in event
    assert_no_canary(log_path)


BAD_VALUES: list[tuple[str, Any]] = [
    ("request_id", f"req {CANARY}"),
    ("request_id", "r" * 129),
    ("tenant", f"{CANARY}"),  # upper case: not a DNS label
    ("tenant", "acme/../other"),
    ("tenant", "-acme"),
    ("subject", "a" * 257 + CANARY),
    ("subject", f"alice\n{CANARY}"),
    ("subject", ""),
    ("method", f"tools/call {CANARY}"),
    ("tool", f"read_document?filename={CANARY}"),
    ("tool", ""),
    ("tool", 42),
    ("arg_names", CANARY),  # a string is not a list of names
    ("arg_names", ["query", f"{CANARY} value"]),
    ("arg_names", [f"n{i}" for i in range(65)] + [CANARY]),
    ("arg_names", {"query": CANARY}),
    ("header_names", ["Authorization: Bearer " + CANARY]),
    ("outcome", CANARY),
    ("outcome", "OK"),
    ("reason", f"file {CANARY} not found"),
    ("reason", "x" * 65),
    ("reason", "Upper"),
    ("duration_ms", CANARY),
    ("duration_ms", -1),
    ("duration_ms", float("nan")),
    ("duration_ms", True),
    ("bytes_in", "12"),
    ("bytes_in", 1.5),
    ("bytes_out", True),
    ("bytes_out", 2**60),
    ("approval_id", f"{CANARY} ok"),
    ("sandbox", f"/run/tenants/{CANARY}"),
    ("sandbox_mode", CANARY),
    ("limits_enforced", 1),
    ("limits_enforced", CANARY),
    ("image_digest", "docbroker-server:latest"),  # a name is not a digest
    ("image_digest", "sha256:" + "A" * 64),
    ("image_digest", f"sha256:{'0' * 64} {CANARY}"),
    ("protocol", CANARY),
    ("protocol", "2026-07-28 " + CANARY),
    ("decision", CANARY),
    ("decision", "pending"),
    ("status", 200.0),
    ("status", 99),
    ("status", CANARY),
]


@pytest.mark.parametrize(("key", "value"), BAD_VALUES)
async def test_values_outside_their_shape_are_never_written(
    audit: AuditLog, log_path: Path, key: str, value: Any
) -> None:
    fields = request_fields()
    fields[key] = value
    await audit.emit("mcp.request", **fields)
    assert_no_canary(log_path)
    [event] = read_events(log_path)
    assert key not in event
    assert event["invalid"] == [key]  # the key's name is a schema name, safe to record
    assert audit.stats.values_invalid == 1
    assert verify_file(log_path).ok


async def test_a_str_subclass_cannot_smuggle_through_its_str(audit: AuditLog, log_path: Path) -> None:
    class Sneaky(str):
        def __str__(self) -> str:
            return "ok"

    await audit.emit("mcp.request", outcome=Sneaky(CANARY), reason=Sneaky(f"a {CANARY}"))
    assert_no_canary(log_path)
    assert read_events(log_path)[0]["invalid"] == ["outcome", "reason"]


async def test_every_valid_field_is_written(audit: AuditLog, log_path: Path) -> None:
    fields = request_fields()
    await audit.emit("mcp.request", **fields, approval_id="apr_0123", decision="approved")
    [event] = read_events(log_path)
    for key, value in fields.items():
        if key not in ("arg_names", "header_names"):
            assert event[key] == value, key
    assert event["arg_names"] == ["max_results", "query"]  # sorted
    assert event["header_names"] == ["Mcp-Protocol-Version", "Mcp-Session-Id"]
    assert event["approval_id"] == "apr_0123" and event["decision"] == "approved"
    assert "invalid" not in event and "dropped" not in event


async def test_enums_none_and_normalisation(audit: AuditLog, log_path: Path) -> None:
    await audit.emit(
        AuditEvent.SANDBOX_FAILED,
        outcome=Outcome.ERROR,
        sandbox_mode=DaemonMode.NOT_APPLICABLE,
        approval_id=None,  # not relevant to this event: omitted, not "invalid"
        arg_names=("b", "a", "b"),
        duration_ms=2.00049,
        subject="Ünïcode user",
    )
    raw = log_path.read_bytes()
    assert raw.isascii() and raw.count(b"\n") == 1
    [event] = read_events(log_path)
    assert event["event"] == "sandbox.failed" and event["outcome"] == "error"
    assert event["sandbox_mode"] == "n/a" and "approval_id" not in event
    assert event["arg_names"] == ["a", "b"] and event["duration_ms"] == 2.0
    assert event["subject"] == "Ünïcode user"


@pytest.mark.parametrize("event", ["tools.rejected", "contract.changed"] + [e.value for e in AuditEvent])
async def test_every_schema_event_is_accepted(audit: AuditLog, log_path: Path, event: str) -> None:
    await audit.emit(event, reason="ok")
    assert read_events(log_path)[0]["event"] == event


@pytest.mark.parametrize("event", [CANARY, "mcp.Request", "", "audit.recovered"])
async def test_an_unknown_event_name_raises_and_writes_nothing(
    audit: AuditLog, log_path: Path, event: str
) -> None:
    with pytest.raises(UnknownEventError) as err:
        await audit.emit(event, reason="ok")
    assert CANARY not in str(err.value)
    assert log_path.read_bytes() == b""
    assert audit.healthy  # a caller's bug, not a broken sink
    await audit.emit("mcp.request")
    assert read_events(log_path)[0]["seq"] == 1


async def test_structlog_global_configuration_does_not_touch_the_audit_log(
    audit: AuditLog, log_path: Path
) -> None:
    def leak(_: object, __: str, event_dict: EventDict) -> EventDict:
        event_dict["leak"] = CANARY
        return event_dict

    structlog.configure(processors=[leak, structlog.processors.JSONRenderer()])
    try:
        with structlog.testing.capture_logs() as captured:
            await audit.emit("mcp.request", reason="ok")
            structlog.get_logger().info("ordinary log line", detail="x")
    finally:
        structlog.reset_defaults()
    assert_no_canary(log_path)
    assert [c["event"] for c in captured] == ["ordinary log line"]  # audit events stay out
    assert read_events(log_path)[0]["reason"] == "ok"
