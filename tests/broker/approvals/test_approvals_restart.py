"""Approvals live in the broker's SQLite store and survive a restart (DESIGN §4); the
"approver must differ from requester" rule can also come from the environment
(DOCBROKER_APPROVAL_REQUIRE_DISTINCT_APPROVER=1), for every tenant at once, and holds for an
in-band answer too; closed records are purged after DOCBROKER_APPROVAL_RETENTION, audited.

This module owns its broker: it stops and starts it.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import mcp_types
import pytest

from broker.audit import verify_file
from broker.testing import Broker, make_broker, structured
from tests.broker.support import (
    approve_in_band,
    approver,
    decide,
    events_since,
    last_seq,
    open_mcp,
    unique,
    wait_for,
)

pytestmark = pytest.mark.anyio


@pytest.fixture(scope="module")
def restartable(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Broker]:
    broker = make_broker(tmp_path_factory.mktemp("restart"))
    broker.start()
    try:
        yield broker
    finally:
        broker.stop()


async def save(
    broker: Broker, name: str, content: str, subject: str = "alice", **client: Any
) -> dict[str, Any]:
    mode = "auto" if "elicitation_callback" in client else "legacy"
    async with open_mcp(broker, broker.token(subject=subject), mode=mode, **client) as c:
        return structured(await c.call_tool("save_report", {"filename": name, "content": content}))


async def test_approvals_survive_a_restart_and_env_requires_a_distinct_approver(restartable: Broker) -> None:
    broker = restartable
    pending_name, approved_name = unique("pending"), unique("approved")
    pending = (await save(broker, pending_name, "decided after the restart"))["data"]["approval_id"]
    approved = (await save(broker, approved_name, "approved before the restart"))["data"]["approval_id"]
    assert decide(broker, approved, subject="alice").status_code == 200  # allowed: no rule yet
    seq_before = broker.audit_events()[-1]["seq"]

    broker.stop()
    broker.env["DOCBROKER_APPROVAL_REQUIRE_DISTINCT_APPROVER"] = "1"
    broker.start()

    with approver(broker) as http:
        states = {
            a["approval_id"]: a["state"]
            for a in http.get("/v1/approvals", params={"state": "all"}).json()["approvals"]
        }
    assert states == {pending: "pending", approved: "approved"}

    # the environment's rule now holds for every tenant
    own = decide(broker, pending, subject="alice")
    assert (own.status_code, own.json()) == (403, {"error": "approver_is_requester"})
    assert decide(broker, pending, subject="bob").status_code == 200

    # both approvals still write their reports, once
    assert (await save(broker, approved_name, "approved before the restart"))["status"] == "ok"
    assert (await save(broker, pending_name, "decided after the restart"))["status"] == "ok"
    assert (broker.reports("acme") / approved_name).read_text() == "approved before the restart"
    assert (broker.reports("acme") / pending_name).read_text() == "decided after the restart"

    # and in-band is off: the caller would approve their own write
    asked: list[Any] = []

    async def human(_ctx: Any, params: Any) -> mcp_types.ElicitResult:
        asked.append(params)
        return mcp_types.ElicitResult(action="accept", content={"decision": "approve"})

    result = await save(broker, unique("no-in-band"), "x", elicitation_callback=human)
    assert result["status"] == "waiting_approval" and asked == []

    # one audit chain across both lives of the broker
    report = verify_file(broker.audit_file)
    assert report.ok, report
    assert broker.audit_events()[-1]["seq"] > seq_before


def test_master_key_and_store_are_private(restartable: Broker) -> None:
    for path in (restartable.data_dir / "master.key", restartable.data_dir / "approvals.sqlite3"):
        assert Path(path).stat().st_mode & 0o077 == 0, path


DISTINCT = "DOCBROKER_APPROVAL_REQUIRE_DISTINCT_APPROVER"


def restart(broker: Broker, **env: str | None) -> None:
    broker.stop()
    for name, value in env.items():
        if value is None:
            broker.env.pop(name, None)
        else:
            broker.env[name] = value
    broker.start()


async def test_distinct_approver_rule_holds_for_an_in_band_answer(restartable: Broker) -> None:
    broker = restartable
    restart(broker, **{DISTINCT: None})
    name, content = unique("inband-four-eyes"), "asked while one person could approve"
    async with open_mcp(broker, broker.token(), mode="auto", elicitation_callback=approve_in_band()) as c:
        first = await c.session.call_tool(
            "save_report", {"filename": name, "content": content}, allow_input_required=True
        )
    assert isinstance(first, mcp_types.InputRequiredResult) and first.request_state

    restart(broker, **{DISTINCT: "1"})
    # the requester answers its own question, now that a second person is required
    responses = {"approval": mcp_types.ElicitResult(action="accept", content={"decision": "approve"})}
    async with open_mcp(broker, broker.token(), mode="auto", elicitation_callback=approve_in_band()) as c:
        answered = await c.session.call_tool(
            "save_report",
            {"filename": name, "content": content},
            input_responses=responses,
            request_state=first.request_state,
            allow_input_required=True,
        )
    assert isinstance(answered, mcp_types.CallToolResult)
    result = structured(answered)
    assert (result["status"], result["message"]) == (
        "rejected",
        "this report must be approved by someone other than its requester",
    )
    assert not (broker.reports("acme") / name).exists()


def listed(broker: Broker) -> dict[str, str]:
    """Every record the tenant's approvers can list, paging to the end: id -> state."""
    states: dict[str, str] = {}
    params: dict[str, Any] = {"state": "all", "limit": 100}
    with approver(broker) as http:
        while True:
            body = http.get("/v1/approvals", params=params).json()
            states.update({a["approval_id"]: a["state"] for a in body["approvals"]})
            if body["next_cursor"] is None:
                return states
            params["cursor"] = body["next_cursor"]


async def test_closed_records_are_purged_after_the_retention_and_audited(restartable: Broker) -> None:
    broker = restartable
    restart(broker, **{DISTINCT: None})

    async def waiting(content: str) -> tuple[str, str]:
        name = unique("kept")
        return name, (await save(broker, name, content))["data"]["approval_id"]

    _, still_pending = await waiting("open: never purged")
    consumed_name, consumed = await waiting("consumed long ago")
    assert decide(broker, consumed).status_code == 200
    assert (await save(broker, consumed_name, "consumed long ago"))["status"] == "ok"
    recent_name, recently_consumed = await waiting("consumed just now")
    assert decide(broker, recently_consumed).status_code == 200
    assert (await save(broker, recent_name, "consumed just now"))["status"] == "ok"
    _, denied = await waiting("denied, and expired long ago")
    assert decide(broker, denied, approve=False).status_code == 200
    _, expired = await waiting("never answered, expired long ago")
    _, denied_open = await waiting("denied: the no stands until it expires")
    assert decide(broker, denied_open, approve=False).status_code == 200

    broker.stop()
    long_ago = time.time() - 2 * 3600  # older than the retention below
    with sqlite3.connect(broker.data_dir / "approvals.sqlite3") as db:
        db.execute("UPDATE approvals SET consumed_at = ? WHERE id = ?", (long_ago, consumed))
        db.execute("UPDATE approvals SET expires_at = ? WHERE id IN (?, ?)", (long_ago, denied, expired))
        db.execute("UPDATE approvals SET decided_at = ? WHERE id = ?", (long_ago, denied_open))
    before = last_seq(broker)
    restart(broker, DOCBROKER_APPROVAL_RETENTION="3600")  # the purge runs at start-up

    assert wait_for(lambda: any(e["event"] == "approval.purged" for e in events_since(broker, before)))
    [purged] = [e for e in events_since(broker, before) if e["event"] == "approval.purged"]
    assert (purged["count"], purged["outcome"], purged["reason"]) == (3, "ok", "retention")
    assert set(purged) <= {"v", "seq", "ts", "prev", "event", "outcome", "reason", "count", "replica"}
    states = listed(broker)
    assert not {consumed, denied, expired} & states.keys()
    assert states[still_pending] == "pending" and states[recently_consumed] == "consumed"
    assert states[denied_open] == "denied"
    with approver(broker) as http:
        for gone_id in (consumed, denied, expired):
            assert http.get(f"/v1/approvals/{gone_id}").status_code == 404
        assert http.get(f"/v1/approvals/{still_pending}").json()["state"] == "pending"
    report = verify_file(broker.audit_file)
    assert report.ok, report
