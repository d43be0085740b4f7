"""The approval gate in front of `save_report`, end to end (DESIGN §3, §4).

A report lands in the tenant's reports store only after a human with `reports:approve` of the
same tenant approved this exact filename and content: in-band (2026-07-28 clients that
declare elicitation) or out-of-band (REST, then the client calls again). Everything else —
replays, changed content or filename, expired or denied approvals, other tenants, missing
scopes, approval tokens a client brings along — never reaches the sandbox's drop-box.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import secrets
import sqlite3
import time
from typing import Any

import mcp_types
import pytest

from broker.testing import ALL_SCOPES, Broker, structured
from tests.broker.support import (
    LEGACY,
    MODERN,
    MODES,
    WRITE_SCOPE,
    LegacySession,
    approve_in_band,
    approver,
    call_modern,
    decide,
    decline_in_band,
    events_since,
    last_seq,
    open_http,
    open_mcp,
    tool_status,
    unique,
)

pytestmark = pytest.mark.anyio


def sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def landed(broker: Broker, tenant: str, name: str) -> str | None:
    path = broker.reports(tenant) / name
    return path.read_text() if path.exists() else None


def dropbox(broker: Broker, tenant: str) -> set[str]:
    folder = broker.data_dir / "tenants" / tenant / "docs" / "reports"
    return {p.name for p in folder.iterdir()} if folder.exists() else set()


async def save(
    broker: Broker,
    name: str,
    content: str,
    *,
    mode: str = "auto",
    tenant: str = "acme",
    subject: str = "alice",
    scope: str = ALL_SCOPES,
    **client: Any,
) -> dict[str, Any]:
    async with open_mcp(
        broker, broker.token(tenant=tenant, subject=subject, scope=scope), mode=mode, **client
    ) as c:
        return structured(await c.call_tool("save_report", {"filename": name, "content": content}))


async def wait_for_approval(broker: Broker, name: str, content: str, **kwargs: Any) -> str:
    result = await save(broker, name, content, **kwargs)
    assert result["status"] == "waiting_approval", result
    data = result["data"]
    assert (data["filename"], data["bytes"], data["sha256"]) == (name, len(content.encode()), sha(content))
    assert data["approve_url"].endswith(f"/approvals?id={data['approval_id']}")
    return str(data["approval_id"])


def expire(broker: Broker, approval_id: str) -> None:
    """Let time pass for one approval. The shortest TTL the broker accepts is 30 s, so the
    test moves the record's expiry in the broker's on-disk store instead of sleeping."""
    with sqlite3.connect(broker.data_dir / "approvals.sqlite3") as db:
        updated = db.execute(
            "UPDATE approvals SET expires_at = ? WHERE id = ?", (time.time() - 1, approval_id)
        )
        assert updated.rowcount == 1


# -- in-band ------------------------------------------------------------------------------------


async def test_in_band_approval_saves_exactly_the_approved_report(broker: Broker) -> None:
    name, content = unique("inband"), "# Quarterly\n\nnumbers are up ✓\n"
    asked: list[Any] = []

    async def human(_ctx: Any, params: Any) -> mcp_types.ElicitResult:
        asked.append(params)
        return mcp_types.ElicitResult(action="accept", content={"decision": "approve"})

    before = last_seq(broker)
    result = await save(broker, name, content, elicitation_callback=human)
    assert result["status"] == "ok", result
    assert result["data"] == {"filename": name, "bytes": len(content.encode())}
    assert landed(broker, "acme", name) == content
    assert name not in dropbox(broker, "acme")
    # the human saw the full content, the size and the hash
    [question] = asked
    assert content in question.message and sha(content) in question.message and name in question.message
    events = events_since(broker, before)
    kinds = [e["event"] for e in events if e["event"].startswith("approval.")]
    assert kinds == ["approval.requested", "approval.decided", "approval.consumed"]
    assert len({e["approval_id"] for e in events if "approval_id" in e}) == 1
    saves = [e for e in events if e["event"] == "mcp.request" and e.get("tool") == "save_report"]
    assert [(e["outcome"], e["protocol"]) for e in saves] == [("waiting_approval", MODERN), ("ok", MODERN)]


async def test_in_band_denial_writes_nothing(broker: Broker) -> None:
    name = unique("inband-no")
    result = await save(broker, name, "no", elicitation_callback=decline_in_band())
    assert (result["status"], result["message"]) == ("rejected", "the report was not approved")
    assert landed(broker, "acme", name) is None and name not in dropbox(broker, "acme")


async def test_in_band_decline_action_writes_nothing(broker: Broker) -> None:
    async def dismiss(_ctx: Any, _params: Any) -> mcp_types.ElicitResult:
        return mcp_types.ElicitResult(action="decline")

    name = unique("inband-dismiss")
    assert (await save(broker, name, "x", elicitation_callback=dismiss))["status"] == "rejected"
    assert landed(broker, "acme", name) is None


async def test_in_band_needs_the_approve_scope_else_out_of_band(broker: Broker) -> None:
    asked: list[Any] = []

    async def human(_ctx: Any, params: Any) -> mcp_types.ElicitResult:
        asked.append(params)
        return mcp_types.ElicitResult(action="accept", content={"decision": "approve"})

    name = unique("noscope")
    result = await save(broker, name, "x", scope=WRITE_SCOPE, elicitation_callback=human)
    assert result["status"] == "waiting_approval" and asked == []
    assert landed(broker, "acme", name) is None


async def ask(
    broker: Broker,
    name: str,
    content: str,
    subject: str = "alice",
    tenant: str = "acme",
) -> mcp_types.InputRequiredResult:
    async with open_mcp(
        broker,
        broker.token(tenant=tenant, subject=subject),
        mode="auto",
        elicitation_callback=approve_in_band(),
    ) as c:
        first = await c.session.call_tool(
            "save_report", {"filename": name, "content": content}, allow_input_required=True
        )
    assert isinstance(first, mcp_types.InputRequiredResult), first
    assert first.request_state and first.input_requests and set(first.input_requests) == {"approval"}
    return first


async def answer(
    broker: Broker,
    name: str,
    content: str,
    state: str,
    decision: str,
    subject: str = "alice",
    tenant: str = "acme",
    scope: str = ALL_SCOPES,
) -> dict[str, Any]:
    responses = {"approval": mcp_types.ElicitResult(action="accept", content={"decision": decision})}
    async with open_mcp(
        broker,
        broker.token(tenant=tenant, subject=subject, scope=scope),
        mode="auto",
        elicitation_callback=approve_in_band(),
    ) as c:
        result = await c.session.call_tool(
            "save_report",
            {"filename": name, "content": content},
            input_responses=responses,
            request_state=state,
            allow_input_required=True,
        )
    assert isinstance(result, mcp_types.CallToolResult), result
    return structured(result)


async def test_in_band_state_is_answered_once(broker: Broker) -> None:
    name = unique("replay")
    state = (await ask(broker, name, "content")).request_state
    assert state is not None
    assert (await answer(broker, name, "content", state, "deny"))["status"] == "rejected"
    # the same sealed state, now with "approve": the question was answered already
    replayed = await answer(broker, name, "content", state, "approve")
    assert replayed["status"] == "rejected"
    assert landed(broker, "acme", name) is None and name not in dropbox(broker, "acme")


async def test_in_band_state_is_bound_to_content_filename_subject_tenant(broker: Broker) -> None:
    name = unique("bound")
    state = (await ask(broker, name, "approved words")).request_state
    assert state is not None
    other = unique("bound-other")
    attempts = {
        "changed content": await answer(broker, name, "other words", state, "approve"),
        "changed filename": await answer(broker, other, "approved words", state, "approve"),
        "other subject": await answer(broker, name, "approved words", state, "approve", subject="bob"),
        "other tenant": await answer(broker, name, "approved words", state, "approve", tenant="globex"),
        "tampered state": await answer(
            broker,
            name,
            "approved words",
            state[:-6] + ("AAAAAA" if not state.endswith("AAAAAA") else "BBBBBB"),
            "approve",
        ),
        "forged state": await answer(broker, name, "approved words", "dbs1." + "A" * 80, "approve"),
    }
    for what, result in attempts.items():
        assert (result["status"], result["message"]) == (
            "rejected",
            "approval token is missing, invalid, expired or already used",
        ), what
    for tenant, filename in (("acme", name), ("acme", other), ("globex", name)):
        assert landed(broker, tenant, filename) is None and filename not in dropbox(broker, tenant)
    # the genuine answer still works: none of the attempts above used it up
    assert (await answer(broker, name, "approved words", state, "approve"))["status"] == "ok"
    assert landed(broker, "acme", name) == "approved words"


async def test_in_band_answer_needs_the_approve_scope_on_the_answering_token(broker: Broker) -> None:
    name, content = unique("inband-scope"), "approved by whoever holds the state?"
    state = (await ask(broker, name, content)).request_state  # asked with reports:approve
    assert state is not None
    before = last_seq(broker)
    # the same subject, its state, but a token that may only read and write
    for decision in ("approve", "deny"):
        refused = await answer(broker, name, content, state, decision, scope=WRITE_SCOPE)
        assert (refused["status"], refused["message"]) == (
            "rejected",
            "answering an approval needs the reports:approve scope",
        )
    assert landed(broker, "acme", name) is None and name not in dropbox(broker, "acme")
    events = events_since(broker, before)
    assert not [e for e in events if e["event"] in ("approval.decided", "approval.consumed")]
    saves = [e for e in events if e["event"] == "mcp.request" and e.get("tool") == "save_report"]
    assert [e["reason"] for e in saves] == ["approver_lacks_scope"] * 2
    # nothing was recorded: the question is still open for an answer from an approver
    assert (await answer(broker, name, content, state, "approve"))["status"] == "ok"
    assert landed(broker, "acme", name) == content


async def test_in_band_expired_question_cannot_be_answered(broker: Broker) -> None:
    name = unique("inband-exp")
    before = last_seq(broker)
    first = await ask(broker, name, "late")
    [requested] = [e for e in events_since(broker, before) if e["event"] == "approval.requested"]
    expire(broker, requested["approval_id"])
    assert first.request_state is not None
    assert (await answer(broker, name, "late", first.request_state, "approve"))["status"] == "rejected"
    assert landed(broker, "acme", name) is None


# -- out-of-band --------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", MODES)
async def test_out_of_band_full_flow(broker: Broker, mode: str) -> None:
    name, content = unique(f"oob-{mode}"), f"approved out of band ({mode})"
    before = last_seq(broker)
    approval_id = await wait_for_approval(broker, name, content, mode=mode)
    assert landed(broker, "acme", name) is None and name not in dropbox(broker, "acme")

    with approver(broker) as http:
        pending = http.get("/v1/approvals").json()["approvals"]
        [record] = [a for a in pending if a["approval_id"] == approval_id]
        assert (record["state"], record["requester"], record["filename"], record["sha256"]) == (
            "pending",
            "alice",
            name,
            sha(content),
        )
        assert "content" not in record
        assert http.get(f"/v1/approvals/{approval_id}").json()["content"] == content
        decided = http.post(f"/v1/approvals/{approval_id}/approve")
        assert decided.status_code == 200 and decided.json()["state"] == "approved"
        assert decided.json()["decided_by"] == "carol"

    result = await save(broker, name, content, mode=mode)
    assert result["status"] == "ok", result
    assert landed(broker, "acme", name) == content
    assert name not in dropbox(broker, "acme")
    with approver(broker) as http:
        assert http.get(f"/v1/approvals/{approval_id}").json()["state"] == "consumed"

    events = events_since(broker, before)
    trail = [(e["event"], e.get("decision")) for e in events if e.get("approval_id") == approval_id]
    assert [t for t in trail if t[0].startswith("approval.") and t[0] != "approval.viewed"] == [
        ("approval.requested", None),
        ("approval.decided", "approved"),
        ("approval.consumed", None),
    ]
    # Reading a pending report's content over REST is itself on the record.
    assert ("approval.viewed", None) in trail
    saves = [e for e in events if e["event"] == "mcp.request" and e.get("tool") == "save_report"]
    assert [e["outcome"] for e in saves] == ["waiting_approval", "ok"]
    assert all(e["protocol"] == (LEGACY if mode == "legacy" else MODERN) for e in saves)


async def test_waiting_call_repeated_reuses_the_open_approval(broker: Broker) -> None:
    name = unique("again")
    first = await wait_for_approval(broker, name, "same")
    assert await wait_for_approval(broker, name, "same", mode="legacy") == first


async def test_approval_is_consumed_once(broker: Broker) -> None:
    name, content = unique("once"), "only once"
    approval_id = await wait_for_approval(broker, name, content)
    assert decide(broker, approval_id).status_code == 200
    assert (await save(broker, name, content))["status"] == "ok"
    # an operator removes the report; the consumed approval must not write it again
    (broker.reports("acme") / name).unlink()
    again = await save(broker, name, content)
    assert again["status"] == "waiting_approval" and again["data"]["approval_id"] != approval_id
    assert landed(broker, "acme", name) is None and name not in dropbox(broker, "acme")
    assert decide(broker, approval_id).status_code == 409  # consumed: not pending


async def test_saving_over_an_existing_report_is_rejected(broker: Broker) -> None:
    name = unique("exists")
    approval_id = await wait_for_approval(broker, name, "first")
    decide(broker, approval_id)
    assert (await save(broker, name, "first"))["status"] == "ok"
    result = await save(broker, name, "second")
    assert (result["status"], result["message"]) == ("rejected", "a report with this name already exists")
    assert landed(broker, "acme", name) == "first"


async def test_changed_content_or_filename_needs_its_own_approval(broker: Broker) -> None:
    name, content = unique("changed"), "the approved text"
    approval_id = await wait_for_approval(broker, name, content)
    assert decide(broker, approval_id).status_code == 200

    other_name = unique("changed-name")
    for filename, text in ((name, content + " plus an injected line"), (other_name, content)):
        result = await save(broker, filename, text)
        assert result["status"] == "waiting_approval" and result["data"]["approval_id"] != approval_id
    assert landed(broker, "acme", name) is None and landed(broker, "acme", other_name) is None
    assert dropbox(broker, "acme").isdisjoint({name, other_name})
    # the approval was not spent by the mismatching calls
    assert (await save(broker, name, content))["status"] == "ok"
    assert landed(broker, "acme", name) == content


async def test_expired_approval_is_not_used(broker: Broker) -> None:
    name = unique("expired")
    approved = await wait_for_approval(broker, name, "x")
    assert decide(broker, approved).status_code == 200
    expire(broker, approved)
    result = await save(broker, name, "x")
    assert result["status"] == "waiting_approval" and result["data"]["approval_id"] != approved
    assert landed(broker, "acme", name) is None

    pending = await wait_for_approval(broker, unique("expired-pending"), "y")
    expire(broker, pending)
    response = decide(broker, pending)
    assert response.status_code == 410 and response.json() == {"error": "expired"}


async def test_denied_approval_never_writes(broker: Broker) -> None:
    name = unique("denied")
    approval_id = await wait_for_approval(broker, name, "no")
    response = decide(broker, approval_id, approve=False)
    assert response.status_code == 200 and response.json()["state"] == "denied"
    assert decide(broker, approval_id).status_code == 409  # a denial is final
    result = await save(broker, name, "no")  # asking again with the same report: still "no"
    assert result["status"] == "rejected" and result["message"] == "the report was not approved"
    assert result["data"] is None
    assert landed(broker, "acme", name) is None and name not in dropbox(broker, "acme")


async def test_approver_of_another_tenant_gets_404(broker: Broker) -> None:
    name = unique("xtenant")
    approval_id = await wait_for_approval(broker, name, "acme only")
    with approver(broker, tenant="globex", subject="carol") as http:
        assert http.get(f"/v1/approvals/{approval_id}").status_code == 404
        assert http.post(f"/v1/approvals/{approval_id}/approve").status_code == 404
        assert approval_id not in str(http.get("/v1/approvals").json())
    with approver(broker) as http:
        assert http.get(f"/v1/approvals/{approval_id}").json()["state"] == "pending"
    result = await save(broker, name, "acme only")
    assert result["status"] == "waiting_approval" and landed(broker, "acme", name) is None


async def test_approving_needs_the_approve_scope(broker: Broker) -> None:
    approval_id = await wait_for_approval(broker, unique("scope"), "x")
    with open_http(broker, broker.token(subject="carol", scope="docs:read docs:write")) as http:
        response = http.post(f"/v1/approvals/{approval_id}/approve")
    assert response.status_code == 403
    assert 'error="insufficient_scope"' in response.headers["www-authenticate"]
    with approver(broker) as http:
        assert http.get(f"/v1/approvals/{approval_id}").json()["state"] == "pending"


@pytest.mark.parametrize("approval_id", ["0" * 32, "../../etc/passwd", "A" * 32, "x"])
async def test_unknown_or_malformed_approval_ids(broker: Broker, approval_id: str) -> None:
    with approver(broker) as http:
        assert http.post(f"/v1/approvals/{approval_id}/approve").status_code == 404


# -- approval tokens from clients ---------------------------------------------------------------


def mint_like_the_broker(broker: Broker, tenant: str, filename: str, content: str) -> str:
    """A token that would verify in the sandbox (DESIGN §3), made from the broker's own key."""
    master = bytes.fromhex((broker.data_dir / "master.key").read_text().strip())
    secret = hmac.new(master, b"docbroker/approval/v1/" + tenant.encode(), hashlib.sha256).hexdigest()
    payload = {
        "v": 1,
        "scope": tenant,
        "tool": "save_report",
        "filename": filename,
        "sha256": sha(content),
        "expires": int(time.time()) + 120,
        "jti": secrets.token_hex(16),
    }
    encoded = base64.urlsafe_b64encode(
        json.dumps(payload, sort_keys=True, separators=(",", ":")).encode()
    ).decode()
    return encoded + "." + hmac.new(secret.encode(), encoded.encode(), hashlib.sha256).hexdigest()


@pytest.mark.parametrize("mode", MODES)
async def test_client_supplied_approval_token_is_rejected(broker: Broker, mode: str) -> None:
    name, content = unique(f"own-token-{mode}"), "I approve myself"
    before = last_seq(broker)
    for token in ("forged", mint_like_the_broker(broker, "acme", name, content)):
        async with open_mcp(broker, broker.token(), mode=mode) as c:
            args = {"filename": name, "content": content, "approval_token": token}
            result = structured(await c.call_tool("save_report", args))
        assert (result["status"], result["message"]) == ("rejected", "input does not match the tool's schema")
    assert landed(broker, "acme", name) is None and name not in dropbox(broker, "acme")
    saves = [e for e in events_since(broker, before) if e.get("tool") == "save_report"]
    assert [e["reason"] for e in saves] == ["client_supplied_approval_token"] * 2
    assert not any(e["event"].startswith("approval.") for e in events_since(broker, before))


async def test_client_supplied_approval_token_rejected_even_when_approved(broker: Broker) -> None:
    name, content = unique("own-token-approved"), "approved, but the client brings a token"
    approval_id = await wait_for_approval(broker, name, content)
    decide(broker, approval_id)
    with open_http(broker, broker.token()) as http:
        response = call_modern(
            http,
            "save_report",
            {
                "filename": name,
                "content": content,
                "approval_token": mint_like_the_broker(broker, "acme", name, content),
            },
        )
        assert tool_status(response)["status"] == "rejected"
        session = LegacySession(http)
        response = session.call("save_report", {"filename": name, "content": content, "approval_token": "x"})
        assert tool_status(response)["status"] == "rejected"
    assert landed(broker, "acme", name) is None
    with approver(broker) as http:  # not spent by the refused calls
        assert http.get(f"/v1/approvals/{approval_id}").json()["state"] == "approved"


# -- four eyes ----------------------------------------------------------------------------------


async def test_tenant_policy_requires_a_distinct_approver(broker: Broker) -> None:
    asked: list[Any] = []

    async def human(_ctx: Any, params: Any) -> mcp_types.ElicitResult:
        asked.append(params)
        return mcp_types.ElicitResult(action="accept", content={"decision": "approve"})

    name, content = unique("four-eyes"), "needs a second person"
    # never in-band: the caller would be approving their own write
    result = await save(broker, name, content, tenant="strict", elicitation_callback=human)
    assert result["status"] == "waiting_approval" and asked == []
    approval_id = result["data"]["approval_id"]

    own = decide(broker, approval_id, tenant="strict", subject="alice")
    assert own.status_code == 403 and own.json() == {"error": "approver_is_requester"}
    assert (await save(broker, name, content, tenant="strict"))["status"] == "waiting_approval"
    assert decide(broker, approval_id, tenant="strict", subject="bob").status_code == 200
    assert (await save(broker, name, content, tenant="strict"))["status"] == "ok"
    assert landed(broker, "strict", name) == content


async def test_default_policy_lets_requester_approve_out_of_band(broker: Broker) -> None:
    name = unique("self")
    approval_id = await wait_for_approval(broker, name, "mine")
    assert decide(broker, approval_id, subject="alice").status_code == 200
    assert (await save(broker, name, "mine"))["status"] == "ok"


async def test_approval_of_one_requester_is_not_anothers(broker: Broker) -> None:
    name = unique("requester")
    approval_id = await wait_for_approval(broker, name, "alice's")
    decide(broker, approval_id)
    result = await save(broker, name, "alice's", subject="bob")
    assert result["status"] == "waiting_approval" and landed(broker, "acme", name) is None
    assert (await save(broker, name, "alice's", subject="alice"))["status"] == "ok"
