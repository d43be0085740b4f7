"""`docbroker audit export --format ocsf`: OCSF API Activity (6003) that a SIEM accepts, names only.

The schema check is independent of the exporter's own. Each exported line is validated twice:
against the official OCSF 1.5.0 schema files as `pydantic-ocsf` bundles them (ocsf/schemas/
v1_5_0.json, from which it builds its models: required attributes, types, enums and their
captions, type_uid), and against API Activity as `ocsf_emitter` generated it (strictly, plus its
`validate()`: class and category identity, the pinned version). Both allow extra attributes, so
the line is also walked key by key: nothing outside the class's declared attributes ships
anywhere but in `unmapped`.
"""

from __future__ import annotations

import json
import secrets
from calendar import timegm
from pathlib import Path
from time import strptime
from typing import Any, get_args, get_origin

import ocsf_emitter
import pytest
from ocsf.v1_5_0.events import APIActivity as OfficialApiActivity
from pydantic import BaseModel
from test_audit_query import T0, Clock, Follower, evidence_line, run_cli

from broker.audit import AuditEvent, AuditLog
from broker.settings import AuditSettings
from broker.testing import Broker, structured
from tests.broker.audit.audit_helpers import CANARY, plain, read_events, request_fields
from tests.broker.support import decide, open_http, open_mcp

pytestmark = pytest.mark.anyio

ApiActivity = ocsf_emitter.models.ApiActivity
# The captions OCSF 1.5.0 gives each value of API Activity's enums (the *_name siblings).
CAPTIONS = {
    "activity": {0: "Unknown", 1: "Create", 2: "Read", 3: "Update", 4: "Delete", 99: "Other"},
    "status": {0: "Unknown", 1: "Success", 2: "Failure", 99: "Other"},
    "severity": {
        0: "Unknown",
        1: "Informational",
        2: "Low",
        3: "Medium",
        4: "High",
        5: "Critical",
        6: "Fatal",
    },
}


def assert_valid_ocsf(event: dict[str, Any]) -> None:
    """One exported event against OCSF 1.5.0 class 6003; raises with the offending field."""
    OfficialApiActivity.model_validate(event)
    model = ApiActivity.model_validate_json(json.dumps(event), strict=True)
    ocsf_emitter.validate(model)
    assert event["class_uid"] == 6003 and event["category_uid"] == 6
    assert event["metadata"]["version"] == ocsf_emitter.OCSF_SCHEMA_VERSION == "1.5.0"
    assert event["activity_name"] == CAPTIONS["activity"][event["activity_id"]]
    assert event["status"] == CAPTIONS["status"][event["status_id"]]
    assert event["severity"] == CAPTIONS["severity"][event["severity_id"]]
    assert event["type_name"] == f"API Activity: {event['activity_name']}"
    undeclared = list(_undeclared(event, ApiActivity, "event"))
    assert undeclared == [], f"attributes outside the OCSF class: {undeclared}"


def _undeclared(value: Any, model: type[BaseModel], where: str) -> Any:
    """Paths of keys that the OCSF object `model` does not declare (its models allow extras)."""
    for key, item in value.items():
        field = model.model_fields.get(key)
        if field is None:
            yield f"{where}.{key}"
            continue
        if key == "unmapped":  # OCSF's place for what the class has no attribute for
            continue
        inner = _object_type(field.annotation)
        items = item if isinstance(item, list) else [item]
        for i, element in enumerate(items):
            if inner is not None and isinstance(element, dict):
                yield from _undeclared(element, inner, f"{where}.{key}[{i}]")


def _object_type(annotation: Any) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in get_args(annotation) if get_origin(annotation) is not None else ():
        found = _object_type(arg)
        if found is not None:
            return found
    return None


def export(*args: str) -> list[dict[str, Any]]:
    result = run_cli("export", "--format", "ocsf", *args)
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr
    return [json.loads(line) for line in result.stdout.splitlines()]


# One writer call per event the broker emits, with the fields it gives that event.
EVERY_EVENT: list[tuple[str, dict[str, Any]]] = [
    (AuditEvent.MCP_REQUEST, request_fields(1)),
    (AuditEvent.MCP_REQUEST, request_fields(2) | {"method": "tools/list", "tool": None, "arg_names": None}),
    (
        AuditEvent.AUTH_DENIED,
        {"outcome": "denied", "reason": "token_expired", "status": 401, "request_id": "r-3"},
    ),
    (
        AuditEvent.POLICY_DENIED,
        request_fields(4) | {"outcome": "denied", "reason": "tool_not_allowed", "status": 403},
    ),
    (
        AuditEvent.APPROVAL_REQUESTED,
        request_fields(5) | {"tool": "save_report", "outcome": "waiting_approval"},
    ),
    (
        AuditEvent.APPROVAL_DECIDED,
        {"tenant": "acme", "subject": "carol", "approval_id": "apr-1", "decision": "approved"},
    ),
    (
        AuditEvent.APPROVAL_CONSUMED,
        {"tenant": "acme", "subject": "alice", "approval_id": "apr-1", "outcome": "ok"},
    ),
    (AuditEvent.APPROVAL_VIEWED, {"tenant": "acme", "subject": "carol", "approval_id": "apr-1"}),
    (
        AuditEvent.SANDBOX_STARTED,
        {"tenant": "acme", "sandbox": "ctr-1", "sandbox_mode": "rootless", "outcome": "ok"},
    ),
    (AuditEvent.SANDBOX_STOPPED, {"tenant": "acme", "sandbox": "ctr-1", "reason": "idle"}),
    (
        AuditEvent.SANDBOX_FAILED,
        {"tenant": "acme", "sandbox": "ctr-2", "outcome": "error", "reason": "start_failed"},
    ),
    (AuditEvent.TOOLS_REJECTED, {"tenant": "acme", "sandbox": "ctr-2", "reason": "descriptor_mismatch"}),
    (AuditEvent.CONTRACT_CHANGED, {"tenant": "acme", "sandbox": "ctr-2", "tool": "read_document"}),
    (
        AuditEvent.APPROVAL_RELEASED,
        {"tenant": "acme", "subject": "alice", "approval_id": "apr-1", "reason": "not_forwarded"},
    ),
    (AuditEvent.APPROVAL_PURGED, {"outcome": "ok", "reason": "retention", "count": 3}),
    (AuditEvent.REPORTS_QUARANTINED, {"tenant": "acme", "reason": "dropbox_after_save", "count": 2}),
    (
        AuditEvent.WEB_SIGNIN,
        {
            "subject": "ann",
            "issuer": "https://idp.example",
            "outcome": "ok",
            "reason": "signed_in",
            "status": 303,
        },
    ),
    (
        AuditEvent.WEB_SIGNOUT,
        {
            "subject": "ann",
            "issuer": "https://idp.example",
            "outcome": "ok",
            "reason": "signed_out",
            "status": 200,
        },
    ),
]


@pytest.fixture
async def every_event(log_path: Path) -> list[dict[str, Any]]:
    clock = Clock(T0)
    async with await AuditLog.open(plain(log_path), clock=clock) as log:
        for i, (event, fields) in enumerate(EVERY_EVENT):
            clock.now = T0 + i * 1_000_000_123
            await log.emit(event, **fields)
    return read_events(log_path)


async def test_every_event_exports_as_valid_ocsf_api_activity(log_path: Path, every_event: list[Any]) -> None:
    assert {e["event"] for e in every_event} == {str(e) for e in AuditEvent}
    exported = export(str(log_path))
    assert len(exported) == len(every_event)
    for event in exported:
        assert_valid_ocsf(event)


async def test_the_mapping_carries_who_what_when_and_the_outcome(
    log_path: Path, every_event: list[Any]
) -> None:
    by_seq = {e["metadata"]["sequence"]: e for e in export(str(log_path))}
    for source in every_event:
        ocsf = by_seq[source["seq"]]
        seconds, ms = source["ts"][:19], int(source["ts"][20:23])
        assert ocsf["time"] == timegm(strptime(seconds, "%Y-%m-%dT%H:%M:%S")) * 1000 + ms
        assert ocsf["metadata"]["original_time"] == source["ts"]
        assert ocsf["metadata"]["event_code"] == source["event"]
        assert ocsf["metadata"].get("tenant_uid") == source.get("tenant")
        assert ocsf["actor"].get("user", {}).get("uid") == source.get("subject")
        assert ocsf["metadata"].get("correlation_uid") == source.get("request_id")
        assert ocsf["api"]["operation"] == source.get("method", source["event"])
        assert ocsf["status_code"] if "reason" in source else "status_code" not in ocsf
        assert ocsf["type_uid"] == 600300 + ocsf["activity_id"]
    denied = by_seq[4]  # policy.denied of tools/call search_documents
    assert (denied["status_id"], denied["status"], denied["severity_id"]) == (2, "Failure", 3)
    assert denied["status_detail"] == "denied" and denied["status_code"] == "tool_not_allowed"
    assert denied["activity_id"] == 2 and denied["http_response"] == {"code": 403}
    assert {"type": "tool", "name": "search_documents"} in denied["resources"]
    assert denied["unmapped"]["arg_names"] == ["max_results", "query"]
    ok = by_seq[1]
    assert (ok["status_id"], ok["severity_id"], ok["duration"]) == (1, 1, 1)
    decided = by_seq[6]
    assert (
        decided["activity_name"] == "Update" and {"type": "approval", "uid": "apr-1"} in decided["resources"]
    )
    assert decided["actor"]["user"]["uid"] == "carol" and decided["unmapped"]["decision"] == "approved"
    assert by_seq[11]["severity"] == "High" and by_seq[9]["activity_name"] == "Create"


async def test_filters_apply_to_the_export(log_path: Path, every_event: list[Any]) -> None:
    exported = export("--event", "approval.decided", "--event", "approval.consumed", str(log_path))
    assert [e["metadata"]["event_code"] for e in exported] == ["approval.decided", "approval.consumed"]


async def test_evidence_lines_neither_break_nor_pollute_the_export(
    log_path: Path, every_event: list[Any]
) -> None:
    with log_path.open("ab") as f:
        f.write(evidence_line(len(every_event) + 1))
    assert len(export(str(log_path))) == len(every_event)
    with_evidence = export("--evidence", str(log_path))
    assert len(with_evidence) == len(every_event) + 1
    last = with_evidence[-1]
    assert last["metadata"]["event_code"] == "audit.checkpoint" and last["activity_id"] == 99
    assert_valid_ocsf(last)


async def test_values_planted_in_a_rewritten_log_do_not_reach_the_export(
    log_path: Path, every_event: list[Any]
) -> None:
    """Someone who can write the file adds values under real and invented keys: names only survive."""
    lines = log_path.read_bytes().splitlines()
    record = json.loads(lines[0])
    record.update(
        tool=f"search {CANARY}",  # not a name: fails the tool validator
        subject=f"{CANARY}\x1b[2J",  # not printable
        filename=f"{CANARY}.md",  # a key outside the schema
        reason=f"{CANARY} is here",
        arg_names=["query", f"{CANARY} value"],
        unmapped={"x": CANARY},
        event=f"evil {CANARY}",
    )
    lines.append(json.dumps(record, sort_keys=True, separators=(",", ":")).encode())
    log_path.write_bytes(b"\n".join(lines) + b"\n")
    result = run_cli("export", "--format", "ocsf", str(log_path))
    assert result.returncode == 0 and len(result.stdout.splitlines()) == len(every_event) + 1
    assert CANARY not in result.stdout and CANARY not in result.stderr
    planted = json.loads(result.stdout.splitlines()[-1])
    assert planted["metadata"]["event_code"] == "other"
    assert_valid_ocsf(planted)


def canonical(record: dict[str, Any]) -> bytes:
    return json.dumps(record, sort_keys=True, separators=(",", ":")).encode()


async def test_names_a_rewritten_log_invents_export_as_other(log_path: Path, every_event: list[Any]) -> None:
    """Values of the right shape (a file name is a fine `tool` to the schema) under the keys whose
    names the broker takes from fixed lists: the export passes only those names, `other` else."""
    lower = CANARY.lower()
    record = every_event[0] | {
        "tool": f"{CANARY}.md",
        "method": f"tools/{CANARY}",
        "arg_names": ["query", f"{CANARY}.md", "filename"],  # filename: read_document's, not search's
        "header_names": [f"Mcp-Param-{CANARY}"],
        "reason": f"{lower}.md",
        "seq": len(every_event) + 1,
    }
    with log_path.open("ab") as f:
        f.write(canonical(record) + b"\n")
    result = run_cli("export", "--format", "ocsf", str(log_path))
    assert result.returncode == 0 and "Traceback" not in result.stderr, result.stderr
    assert CANARY not in result.stdout and lower not in result.stdout
    assert CANARY not in result.stderr and lower not in result.stderr
    events = [json.loads(line) for line in result.stdout.splitlines()]
    assert len(events) == len(every_event) + 1
    planted = events[-1]
    assert_valid_ocsf(planted)
    assert planted["api"]["operation"] == "other" and planted["activity_name"] == "Other"
    assert {"type": "tool", "name": "other"} in planted["resources"]
    assert planted["unmapped"]["arg_names"] == ["other"]  # the tool is unknown: so are its arguments
    assert planted["unmapped"]["header_names"] == ["other"]
    assert planted["status_code"] == "other"
    # The broker's own names still pass: the honest first line, and a tool's declared arguments.
    assert events[0]["resources"][0] == {"type": "tool", "name": "search_documents"}
    assert events[0]["unmapped"]["arg_names"] == ["max_results", "query"]
    assert events[0]["status_code"] == "ok" and events[0]["api"]["operation"] == "tools/call"
    known_tool = every_event[0] | {"arg_names": ["query", "filename"], "seq": len(every_event) + 2}
    with log_path.open("ab") as f:
        f.write(canonical(known_tool) + b"\n")
    last = export(str(log_path))[-1]
    assert last["unmapped"]["arg_names"] == ["other", "query"]


# `ts` of the writer's form (what the schema's pattern checks) that is no time at all.
IMPOSSIBLE_TS = ("2026-13-01T00:00:00.000Z", "0000-06-01T00:00:00.000Z", "2026-02-30T25:61:00.000Z")


async def test_a_line_with_an_impossible_time_is_reported_counted_and_skipped(
    log_path: Path, every_event: list[Any]
) -> None:
    lines = log_path.read_bytes().splitlines()
    for i, ts in enumerate(IMPOSSIBLE_TS):
        lines.insert(2 + 2 * i, canonical(every_event[0] | {"ts": ts}))  # lines 3, 5 and 7
    log_path.write_bytes(b"\n".join(lines) + b"\n")
    result = run_cli("export", "--format", "ocsf", str(log_path))
    assert result.returncode == 0 and "Traceback" not in result.stderr, result.stderr
    exported = [json.loads(line) for line in result.stdout.splitlines()]
    assert [e["metadata"]["sequence"] for e in exported] == [e["seq"] for e in every_event]
    errors = result.stderr.splitlines()
    assert errors[:3] == [
        f"docbroker audit export: {log_path} line {n}: ts is not a real time; skipped" for n in (3, 5, 7)
    ]
    assert "skipped 3 lines that are not audit events" in errors[-1]


async def test_follow_reports_a_bad_line_and_the_feed_goes_on(log_path: Path, every_event: list[Any]) -> None:
    """A SIEM feed (`export --follow`): a bad line appended to the live file must not end it."""
    follower = Follower(str(log_path), command=("export", "--format", "ocsf"))
    try:
        assert [e["metadata"]["sequence"] for e in follower.lines(len(every_event))] == [
            e["seq"] for e in every_event
        ]
        bad = every_event[-1] | {"seq": len(every_event) + 1, "ts": IMPOSSIBLE_TS[0]}
        good = every_event[-1] | {"seq": len(every_event) + 2, "ts": "2027-01-01T00:00:00.000Z"}
        with log_path.open("ab") as f:
            f.write(canonical(bad) + b"\n" + canonical(good) + b"\n")
        after = follower.lines(1)
        assert [e["metadata"]["sequence"] for e in after] == [good["seq"]]  # the feed went on
        assert follower.proc.poll() is None
    finally:
        done = follower.stop()
    err = done.stderr.decode()
    assert done.returncode == 0 and "Traceback" not in err, err
    bad_line = len(every_event) + 1
    assert f"{log_path} line {bad_line}: ts is not a real time; skipped" in err
    assert "skipped 1 lines that are not audit events" in err


class Canaries(dict[str, str]):
    def __call__(self, where: str) -> str:
        self[where] = value = f"cnry{secrets.token_hex(6)}"
        return value


async def test_canaries_through_a_real_broker_never_reach_the_export(broker: Broker) -> None:
    """Values in arguments, file names, contents, token claims and headers travel through a real
    broker (and are seen to arrive); the OCSF export of its audit log carries none of them."""
    c = Canaries()
    doc, word = f"{c('source-filename')}.md", c("file-content")
    broker.sources("acme").mkdir(parents=True, exist_ok=True)
    (broker.sources("acme") / doc).write_text(f"intro\n{word} is the secret\n")
    report, text = f"{c('report-filename')}.md", f"report {c('report-content')}"
    token = broker.token(jti=c("jti"), name=c("claim-name"), email=f"{c('email')}@x.test")
    headers = {"x-canary": c("header"), "user-agent": c("user-agent"), "cookie": f"s={c('cookie')}"}
    async with open_mcp(broker, token, mode="legacy", headers=headers) as client:
        found = structured(await client.call_tool("search_documents", {"query": word, "max_results": 1}))
        assert found["status"] == "ok" and word in str(found)
        read = structured(await client.call_tool("read_document", {"filename": doc}))
        assert word in read["data"]["content"]
        missing = structured(await client.call_tool("read_document", {"filename": f"{c('missing')}.md"}))
        assert missing["status"] != "ok"
        waiting = structured(await client.call_tool("save_report", {"filename": report, "content": text}))
        approval_id = waiting["data"]["approval_id"]
        assert decide(broker, approval_id).status_code == 200
        saved = structured(await client.call_tool("save_report", {"filename": report, "content": text}))
        assert saved["status"] == "ok", saved
    with open_http(broker, token) as http:
        http.headers.update(headers)
        http.post("/mcp", content=f'{{"jsonrpc":"2.0","id":"{c("rpc-id")}","method":"{c("method")}"}}')
    assert (broker.reports("acme") / report).read_text() == text  # the canaries did travel

    result = run_cli("export", "--format", "ocsf", "--evidence", str(broker.audit_file))
    assert result.returncode == 0, result.stderr
    leaked = sorted(where for where, value in c.items() if value in result.stdout or value in result.stderr)
    assert leaked == [], f"canaries in the OCSF export: {leaked}"
    exported = [json.loads(line) for line in result.stdout.splitlines()]
    for event in exported:
        assert_valid_ocsf(event)
    # the reason codes a real broker writes all pass the export's check as they are
    assert all(e.get("status_code") != "other" for e in exported), [e.get("status_code") for e in exported]
    # who approved this report: the approval id, not its file name, leads to the approver
    decided = [
        e
        for e in exported
        if e["metadata"]["event_code"] == "approval.decided"
        and {"type": "approval", "uid": approval_id} in e.get("resources", [])
    ]
    assert [e["actor"]["user"]["uid"] for e in decided] == ["carol"]


async def test_the_writers_checkpoints_and_rotation_export_cleanly(tmp_path: Path) -> None:
    """The log's own signed lines, as the writer makes them, neither break the export nor leak."""
    path = tmp_path / "audit.jsonl"
    settings = AuditSettings(
        path=path,
        key_file=tmp_path / "audit.key",
        witness_file=None,
        checkpoint_every=25,
        replica="r1",
        rotate_bytes=1 << 20,
    )
    async with await AuditLog.open(settings) as log:
        for i in range(3000):
            await log.emit(AuditEvent.MCP_REQUEST, **request_fields(i))
    files = sorted(str(p) for p in tmp_path.glob("audit.jsonl*"))
    lines = [e for f in files for e in read_events(Path(f))]
    checkpoints = sum(e["event"] == "audit.checkpoint" for e in lines)
    assert len(files) >= 2 and checkpoints >= 100
    assert len(export(*files)) == 3000
    exported = export("--evidence", *files)
    assert len(exported) == len(lines)
    assert [e["metadata"]["sequence"] for e in exported] == list(range(1, len(lines) + 1))
    for event in exported:
        assert_valid_ocsf(event)
    assert sum(e["metadata"]["event_code"] == "audit.checkpoint" for e in exported) == checkpoints
