"""Approving is a policy decision too (the `approve` action): the shipped example "only the
legal group approves for tenant acme" through a real broker — over REST and in-band — with
the determining policy ids and the set's hash on every decision's audit line."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from broker.policy import Policies, PolicyEngine
from broker.testing import ROOT, Broker, make_broker, structured
from tests.broker.support import (
    APPROVER_SCOPE,
    WRITE_SCOPE,
    approve_in_band,
    call_modern,
    open_http,
    open_mcp,
    tool_status,
    unique,
)

pytestmark = pytest.mark.anyio

EXAMPLE = ROOT / "policies" / "examples" / "legal-approves-acme.cedar"
FORBID_ID = "examples.acme.legal_approves"


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Broker]:
    b = make_broker(tmp_path_factory.mktemp("cedar-approvals"))
    shutil.copy(EXAMPLE, Path(b.env["DOCBROKER_POLICIES_DIR"]) / EXAMPLE.name)
    b.start()
    try:
        yield b
    finally:
        b.stop()


def set_hash(broker: Broker) -> str:
    folder = Path(broker.env["DOCBROKER_POLICIES_DIR"])
    return PolicyEngine.load(folder, Policies.load(folder)).hash


def decided_lines(broker: Broker, approval_id: str) -> list[dict[str, object]]:
    return [
        e for e in broker.audit_events()
        if e["event"] == "approval.decided" and e.get("approval_id", approval_id) == approval_id
    ]  # fmt: skip


def test_only_legal_approves_for_acme_over_rest(broker: Broker) -> None:
    name = unique()
    requester = broker.token("acme", "rita", WRITE_SCOPE)
    with open_http(broker, requester) as http:
        waiting = tool_status(call_modern(http, "save_report", {"filename": name, "content": "q3 figures"}))
    assert waiting["status"] == "waiting_approval"
    approval_id = waiting["data"]["approval_id"]
    before = len(decided_lines(broker, approval_id))

    finance = broker.token("acme", "carol", APPROVER_SCOPE, groups=["finance"])
    with open_http(broker, finance) as http:
        refused = http.post(f"/v1/approvals/{approval_id}/approve")
    assert refused.status_code == 403 and refused.json() == {"error": "forbidden"}
    legal = broker.token("acme", "lena", APPROVER_SCOPE, groups=["legal"])
    with open_http(broker, legal) as http:
        assert http.post(f"/v1/approvals/{approval_id}/approve").status_code == 200
    with open_http(broker, requester) as http:
        saved = tool_status(call_modern(http, "save_report", {"filename": name, "content": "q3 figures"}))
    assert saved["status"] == "ok"

    lines = decided_lines(broker, approval_id)[before:]
    carol = [e for e in lines if e["subject"] == "carol"]
    lena = [e for e in lines if e["subject"] == "lena"]
    assert len(carol) == 1 and len(lena) == 1
    assert carol[0]["outcome"] == "denied" and carol[0]["reason"] == "approver_not_permitted"
    assert "approval_id" not in carol[0]  # refused before the store: the id was never looked up
    assert carol[0]["policy_ids"] == [FORBID_ID] and carol[0]["policy_hash"] == set_hash(broker)
    assert lena[0]["decision"] == "approved" and lena[0]["policy_ids"] == ["toml.tenants.acme"]
    assert lena[0]["policy_hash"] == set_hash(broker)


def test_other_tenants_approvers_are_not_concerned(broker: Broker) -> None:
    requester = broker.token("globex", "gus", WRITE_SCOPE)
    with open_http(broker, requester) as http:
        waiting = tool_status(call_modern(http, "save_report", {"filename": unique(), "content": "x"}))
    with open_http(broker, broker.token("globex", "carol", APPROVER_SCOPE)) as http:
        assert http.post(f"/v1/approvals/{waiting['data']['approval_id']}/approve").status_code == 200


async def test_only_legal_approves_for_acme_in_band(broker: Broker) -> None:
    both = f"{WRITE_SCOPE} {APPROVER_SCOPE}"
    name = unique()
    outsider = broker.token("acme", "oscar", both, groups=["sales"])
    async with open_mcp(broker, outsider, "auto", elicitation_callback=approve_in_band()) as client:
        refused = structured(await client.call_tool("save_report", {"filename": name, "content": "memo"}))
    assert refused["status"] == "rejected"
    assert not (broker.reports("acme") / name).exists()
    lawyer = broker.token("acme", "lena", both, groups=["legal"])
    async with open_mcp(broker, lawyer, "auto", elicitation_callback=approve_in_band()) as client:
        saved = structured(await client.call_tool("save_report", {"filename": name, "content": "memo"}))
    assert saved["status"] == "ok"

    oscar = [e for e in broker.audit_events() if e.get("subject") == "oscar" and e["event"] == "mcp.request"]
    answered = [e for e in oscar if e.get("reason") == "approver_not_permitted"]
    assert len(answered) == 1 and answered[0]["policy_ids"] == [FORBID_ID]
    lena = [
        e for e in broker.audit_events() if e.get("subject") == "lena" and e["event"] == "approval.decided"
    ]
    assert lena and lena[-1]["policy_ids"] == ["toml.tenants.acme"]
