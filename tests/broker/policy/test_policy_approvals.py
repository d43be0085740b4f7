"""Approving is a policy decision too (the `approve` action): the shipped example "only the
legal group approves for tenant acme" through a real broker — over REST and in-band — with
the determining policy ids and the set's hash on every decision's audit line."""

from __future__ import annotations

import hashlib
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import mcp_types
import pytest

from broker.testing import ROOT, Broker, make_broker, structured
from tests.broker.cli.cli_helpers import cli, json_out, one_line_error, token_file
from tests.broker.policy.policy_support import broker_with, set_hash, set_in_force
from tests.broker.support import (
    APPROVER_SCOPE,
    WRITE_SCOPE,
    approve_in_band,
    call_modern,
    open_http,
    open_mcp,
    tool_status,
    unique,
    wait_for,
)

pytestmark = pytest.mark.anyio

EXAMPLE = ROOT / "policies" / "examples" / "legal-approves-acme.cedar"
FORBID_ID = "examples.acme.legal_approves"


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Broker]:
    with broker_with(
        tmp_path_factory.mktemp("cedar-approvals"), EXAMPLE, env={"DOCBROKER_POLICY_RELOAD": "0.2"}
    ) as b:
        yield b


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
        assert http.get(f"/v1/approvals/{approval_id}").status_code == 200  # read first
        assert http.post(f"/v1/approvals/{approval_id}/approve").status_code == 200
    with open_http(broker, requester) as http:
        saved = tool_status(call_modern(http, "save_report", {"filename": name, "content": "q3 figures"}))
    assert saved["status"] == "ok"

    lines = decided_lines(broker, approval_id)[before:]
    carol = [e for e in lines if e["subject"] == "carol"]
    lena = [e for e in lines if e["subject"] == "lena"]
    assert len(carol) == 1 and len(lena) == 1
    assert carol[0]["outcome"] == "denied" and carol[0]["reason"] == "approver_not_permitted"
    assert carol[0]["approval_id"] == approval_id  # the tenant's own record, read to decide
    assert carol[0]["policy_ids"] == [FORBID_ID] and carol[0]["policy_hash"] == set_hash(broker)
    assert lena[0]["decision"] == "approved" and lena[0]["policy_ids"] == ["toml.tenants.acme"]
    assert lena[0]["policy_hash"] == set_hash(broker)


def test_other_tenants_approvers_are_not_concerned(broker: Broker) -> None:
    requester = broker.token("globex", "gus", WRITE_SCOPE)
    with open_http(broker, requester) as http:
        waiting = tool_status(call_modern(http, "save_report", {"filename": unique(), "content": "x"}))
    with open_http(broker, broker.token("globex", "carol", APPROVER_SCOPE)) as http:
        assert http.get(f"/v1/approvals/{waiting['data']['approval_id']}").status_code == 200  # read first
        assert http.post(f"/v1/approvals/{waiting['data']['approval_id']}/approve").status_code == 200


async def test_only_legal_approves_for_acme_in_band(broker: Broker) -> None:
    both = f"{WRITE_SCOPE} {APPROVER_SCOPE}"
    name = unique()
    outsider = broker.token("acme", "oscar", both, groups=["sales"])
    async with open_mcp(broker, outsider, "auto", elicitation_callback=approve_in_band()) as client:
        waiting = structured(await client.call_tool("save_report", {"filename": name, "content": "memo"}))
    assert waiting["status"] == "waiting_approval"  # not asked in-band: oscar may not approve it
    lawyer = broker.token("acme", "lena", both, groups=["legal"])
    async with open_mcp(broker, lawyer, "auto", elicitation_callback=approve_in_band()) as client:
        saved = structured(await client.call_tool("save_report", {"filename": unique(), "content": "memo"}))
    assert saved["status"] == "ok"
    lena = [
        e for e in broker.audit_events() if e.get("subject") == "lena" and e["event"] == "approval.decided"
    ]
    assert lena and lena[-1]["policy_ids"] == ["toml.tenants.acme"]


async def test_an_answer_in_band_is_decided_by_the_set_in_force_when_it_comes(broker: Broker) -> None:
    """The question was asked under one set; the answer comes after a reload that forbids the
    approver: it is refused, naming the new set's policy."""
    folder = Path(broker.env["DOCBROKER_POLICIES_DIR"])
    before = set_in_force(broker)
    freeze = folder / "freeze.cedar"

    async def answer_after_a_reload(_ctx: Any, _params: Any) -> mcp_types.ElicitResult:
        freeze.write_text(
            '@id("freeze")\nforbid (principal, action == Docbroker::Action::"approve", resource);\n'
        )
        assert wait_for(lambda: set_in_force(broker) != before)
        return mcp_types.ElicitResult(action="accept", content={"decision": "approve"})

    lawyer = broker.token("acme", "lena", f"{WRITE_SCOPE} {APPROVER_SCOPE}", groups=["legal"])
    name = unique()
    try:
        async with open_mcp(broker, lawyer, "auto", elicitation_callback=answer_after_a_reload) as client:
            refused = structured(await client.call_tool("save_report", {"filename": name, "content": "memo"}))
    finally:
        freeze.unlink()
        assert wait_for(lambda: set_in_force(broker) == before)
    assert refused["status"] == "rejected" and not (broker.reports("acme") / name).exists()
    line = [
        e
        for e in broker.audit_events()
        if e.get("reason") == "approver_not_permitted" and e["event"] == "mcp.request"
    ]
    assert len(line) == 1 and line[0]["subject"] == "lena" and line[0]["policy_ids"] == ["freeze"]


def test_who_may_view_approvals_is_decided_too(broker: Broker) -> None:
    """Listing and reading approvals (their contents) is the action view_approvals: a rule
    keeps interns of acme out, on every replica that loads it, audited with its id."""
    folder = Path(broker.env["DOCBROKER_POLICIES_DIR"])
    before = set_in_force(broker)
    rule = folder / "interns.cedar"
    rule.write_text(
        '@id("acme.interns_do_not_look")\nforbid (principal in Docbroker::Group::"interns", '
        'action == Docbroker::Action::"view_approvals", resource in Docbroker::Tenant::"acme");\n'
    )
    try:
        assert wait_for(lambda: set_in_force(broker) != before)
        now = set_in_force(broker)
        with open_http(broker, broker.token("acme", "ivy", APPROVER_SCOPE, groups=["interns"])) as http:
            listed, shown = http.get("/v1/approvals"), http.get(f"/v1/approvals/{'a' * 32}")
        assert (listed.status_code, listed.json()) == (403, {"error": "forbidden"})
        assert shown.status_code == 403
        with open_http(broker, broker.token("acme", "vic", APPROVER_SCOPE, groups=["staff"])) as http:
            assert http.get("/v1/approvals").status_code == 200
    finally:
        rule.unlink()
        assert wait_for(lambda: set_in_force(broker) == before)
    viewed = [
        e for e in broker.audit_events() if e["event"] == "approval.viewed" and e["subject"] in ("ivy", "vic")
    ]
    assert [(e["subject"], e["reason"], e["policy_ids"]) for e in viewed] == [
        ("ivy", "viewer_not_permitted", ["acme.interns_do_not_look"]),
        ("ivy", "viewer_not_permitted", ["acme.interns_do_not_look"]),
        ("vic", "listed", ["toml.tenants.acme"]),
    ]
    assert {e["policy_hash"] for e in viewed} == {now}


TWO_APPROVERS = ROOT / "policies" / "examples" / "big-reports-two-approvers.cedar"
COUNT_ID, SELF_ID = "examples.big_reports.two_approvers", "examples.big_reports.second_person"


@pytest.fixture(scope="module")
def two_approvers_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Broker]:
    b = make_broker(tmp_path_factory.mktemp("cedar-two-approvers"), env={"DOCBROKER_POLICY_RELOAD": "0.2"})
    shutil.copy(TWO_APPROVERS, Path(b.env["DOCBROKER_POLICIES_DIR"]) / TWO_APPROVERS.name)
    b.start()
    try:
        yield b
    finally:
        b.stop()


def save(broker: Broker, token: str, name: str, content: str) -> dict[str, Any]:
    with open_http(broker, token) as http:
        return tool_status(call_modern(http, "save_report", {"filename": name, "content": content}))


def approve(broker: Broker, who: str, approval_id: str) -> Any:
    with open_http(broker, broker.token("acme", who, APPROVER_SCOPE)) as http:
        assert http.get(f"/v1/approvals/{approval_id}").status_code == 200  # read first
        return http.post(f"/v1/approvals/{approval_id}/approve")


async def test_big_reports_need_two_distinct_approvers(two_approvers_broker: Broker) -> None:
    broker = two_approvers_broker
    rita = broker.token("acme", "rita", f"{WRITE_SCOPE} {APPROVER_SCOPE}")
    small, big = unique(), unique()
    async with open_mcp(broker, rita, "auto", elicitation_callback=approve_in_band()) as client:
        mine = structured(await client.call_tool("save_report", {"filename": small, "content": "s" * 4096}))
        assert mine["status"] == "ok"  # approved in-band by its requester, alone
        waiting = structured(await client.call_tool("save_report", {"filename": big, "content": "b" * 4097}))
    assert waiting["status"] == "waiting_approval"  # not offered in-band: it needs two others
    approval_id = waiting["data"]["approval_id"]

    own = approve(broker, "rita", approval_id)
    assert (own.status_code, own.json()) == (403, {"error": "approver_is_requester"})
    first = approve(broker, "carol", approval_id)
    assert first.status_code == 200
    assert {k: first.json()[k] for k in ("state", "approvals", "required")} == {
        "state": "pending", "approvals": 1, "required": 2,
    }  # fmt: skip
    still = save(broker, rita, big, "b" * 4097)  # one yes of two: the save still waits
    assert still["status"] == "waiting_approval" and still["data"]["approval_id"] == approval_id
    again = approve(broker, "carol", approval_id)
    assert (again.status_code, again.json()) == (409, {"error": "already_decided"})
    assert not (broker.reports("acme") / big).exists()
    second = approve(broker, "dave", approval_id)
    assert second.status_code == 200
    assert (second.json()["state"], second.json()["approvals"]) == ("approved", 2)
    assert save(broker, rita, big, "b" * 4097)["status"] == "ok"
    assert (broker.reports("acme") / big).stat().st_size == 4097

    lines = decided_lines(broker, approval_id)
    by = {(e["subject"], e.get("reason"), e["outcome"]): e for e in lines}
    assert set(by) == {
        ("rita", "approver_is_requester", "denied"),
        ("carol", "more_approvers_required", "ok"),
        ("carol", "already_decided", "rejected"),
        ("dave", "decided", "ok"),
    }
    assert by["rita", "approver_is_requester", "denied"]["policy_ids"] == [SELF_ID]
    for who, reason in (("carol", "more_approvers_required"), ("dave", "decided")):
        line = by[who, reason, "ok"]
        assert line["decision"] == "approved" and line["policy_ids"] == [COUNT_ID, "toml.tenants.acme"]
        assert line["issuer"] and line["policy_hash"] == set_hash(broker)


async def test_one_no_denies_a_report_needing_two(two_approvers_broker: Broker) -> None:
    broker = two_approvers_broker
    rita = broker.token("acme", "rita", WRITE_SCOPE)
    name = unique()
    approval_id = save(broker, rita, name, "n" * 5000)["data"]["approval_id"]
    assert approve(broker, "carol", approval_id).json()["state"] == "pending"
    with open_http(broker, broker.token("acme", "dave", APPROVER_SCOPE)) as http:
        denied = http.post(f"/v1/approvals/{approval_id}/deny")
    assert denied.status_code == 200 and denied.json()["state"] == "denied"
    assert save(broker, rita, name, "n" * 5000)["status"] == "rejected"


def test_an_approval_granted_under_another_set_is_decided_again(two_approvers_broker: Broker) -> None:
    """Approved by carol and dave; then a rule forbids dave to approve. The save is decided
    again under the set in force: refused, naming the forbid, and the record reopened with
    carol's yes only; a third approver completes it under the new set and the save goes on.
    A change that still grants an approval (an unrelated rule) lets its save go on."""
    broker = two_approvers_broker
    folder = Path(broker.env["DOCBROKER_POLICIES_DIR"])
    rita = broker.token("acme", "rita", WRITE_SCOPE)
    name, other = unique(), unique()
    approval_id = save(broker, rita, name, "c" * 5000)["data"]["approval_id"]
    other_id = save(broker, rita, other, "o" * 5000)["data"]["approval_id"]
    for who in ("carol", "dave"):
        assert approve(broker, who, approval_id).status_code == 200
        assert approve(broker, who, other_id).status_code == 200
    granted_under = set_in_force(broker)
    rule = folder / "no-dave.cedar"
    rule.write_text(
        '@id("acme.dave_no_longer_approves")\nforbid (principal == '
        f'Docbroker::User::"acme/dave#{broker.env["DOCBROKER_AUTH_ISSUER"]}", '
        'action == Docbroker::Action::"approve", resource);\n'
    )  # a person is their id at their issuer (docs/identity.md)
    try:
        assert wait_for(lambda: set_in_force(broker) != granted_under)
        refused = save(broker, rita, name, "c" * 5000)
        assert refused["status"] == "rejected" and not (broker.reports("acme") / name).exists()
        line = [
            e for e in broker.audit_events()
            if e["event"] == "mcp.request" and e.get("reason") == "approval_policy_changed"
        ]  # fmt: skip
        assert len(line) == 1 and line[0]["policy_ids"] == ["acme.dave_no_longer_approves"]
        assert line[0]["policy_hash"] == set_in_force(broker) != granted_under
        with open_http(broker, broker.token("acme", "carol", APPROVER_SCOPE)) as http:
            record = http.get(f"/v1/approvals/{approval_id}").json()
        assert (record["state"], record["approvals"], record["required"]) == ("pending", 1, 2)
        assert save(broker, rita, name, "c" * 5000)["status"] == "waiting_approval"
        assert approve(broker, "erin", approval_id).json()["state"] == "approved"
        assert save(broker, rita, name, "c" * 5000)["status"] == "ok"
    finally:
        rule.unlink()
        assert wait_for(lambda: set_in_force(broker) == granted_under)
    unrelated = folder / "unrelated.cedar"
    unrelated.write_text(
        '@id("acme.no_saves_at_all_for_globex")\nforbid (principal in Docbroker::Tenant::"globex", '
        'action == Docbroker::Action::"save_report", resource);\n'
    )
    try:
        assert wait_for(lambda: set_in_force(broker) != granted_under)
        assert save(broker, rita, other, "o" * 5000)["status"] == "ok"  # carol and dave still hold
    finally:
        unrelated.unlink()
        assert wait_for(lambda: set_in_force(broker) == granted_under)


def test_the_cli_shows_the_count_and_says_a_second_yes_is_counted_once(
    two_approvers_broker: Broker, tmp_path: Path
) -> None:
    broker = two_approvers_broker
    rita = broker.token("acme", "rita", WRITE_SCOPE)
    approval_id = save(broker, rita, unique(), "k" * 5000)["data"]["approval_id"]
    carol = token_file(tmp_path, broker.token("acme", "carol", APPROVER_SCOPE))

    def approvals(*args: str) -> Any:
        return cli(broker.env, "approvals", *args, "--url", broker.url, "--token-file", str(carol))

    read = hashlib.sha256(b"k" * 5000).hexdigest()  # the content carol read (no terminal to ask on)
    first = json_out(approvals("approve", approval_id, "--sha256", read, "--json"))
    assert (first["state"], first["approvals"], first["required"]) == ("pending", 1, 2)
    again = one_line_error(approvals("approve", approval_id, "--sha256", read), 1)
    assert again == (
        "docbroker approvals approve: your decision on it is already counted: it waits for other approvers"
    )
