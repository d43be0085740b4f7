"""The approvals REST API from a hostile approver's side (DESIGN §4, §6; issue 15 items 4-6, 10, 12).

- REST calls spend the tenant's budget: a flood gets 429, and so do the tenant's /mcp calls;
- listings carry metadata only, are filtered by state in the store and paged with an opaque
  cursor that never reaches another tenant's rows; an old pending approval stays findable
  however many newer records there are;
- listing a tenant's approvals does not slow another tenant's calls;
- one pending cap covers in-band questions and out-of-band approvals;
- every request leaves exactly one audit event, and no response may be cached or sniffed.

This module owns its broker: its tenants' policies differ from the shared broker's.
"""

from __future__ import annotations

import base64
import json
import threading
from collections.abc import Iterator
from typing import Any

import httpx2
import pytest

from broker.testing import Broker, make_broker
from tests.broker.support import (
    APPROVER_SCOPE,
    UNLIMITED,
    WRITE_SCOPE,
    call_modern,
    events_since,
    last_seq,
    open_http,
    rpc_reply,
    tool_status,
    unique,
    write_policies,
)

PENDING_CAP = 50
POLICIES = {
    "acme": UNLIMITED + "[approvals]\nmax_pending = 10000\n",
    "globex": UNLIMITED + "[approvals]\nmax_pending = 10000\n",
    "history": UNLIMITED + "[approvals]\nmax_pending = 10000\n",
    "paced": "[limits]\nrate_per_minute = 60\nburst = 60\n",  # 60 at once, then one a second
    "capped": UNLIMITED + f"[approvals]\nmax_pending = {PENDING_CAP}\n",
}
TOO_MANY = ("rejected", "too many reports are waiting for approval")
NO_STORE = {"cache-control": "no-store", "x-content-type-options": "nosniff"}


@pytest.fixture(scope="module")
def api_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Broker]:
    broker = make_broker(tmp_path_factory.mktemp("approvals-api"), tenants=POLICIES)
    write_policies(broker, POLICIES)
    broker.start()
    try:
        yield broker
    finally:
        broker.stop()


def approver(broker: Broker, tenant: str, subject: str = "carol") -> httpx2.Client:
    return open_http(broker, broker.token(tenant=tenant, subject=subject, scope=APPROVER_SCOPE))


def writer(broker: Broker, tenant: str, subject: str = "alice") -> httpx2.Client:
    return open_http(broker, broker.token(tenant=tenant, subject=subject, scope=WRITE_SCOPE))


def wait_out_of_band(http: httpx2.Client, content: str = "draft") -> str:
    """A save_report call that opens a pending approval (no elicitation: out-of-band)."""
    status = tool_status(call_modern(http, "save_report", {"filename": unique("api"), "content": content}))
    assert status["status"] == "waiting_approval", status
    return str(status["data"]["approval_id"])


def all_pages(http: httpx2.Client, state: str, limit: int = 100) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = []
    params: dict[str, Any] = {"state": state, "limit": limit}
    for _ in range(1000):
        response = http.get("/v1/approvals", params=params)
        assert response.status_code == 200, response.text
        body = response.json()
        assert len(body["approvals"]) <= limit
        items += body["approvals"]
        if body["next_cursor"] is None:
            return items
        params["cursor"] = body["next_cursor"]
    raise AssertionError("the listing never ended")


# -- item 4: REST spends the tenant's budget ----------------------------------------------------


def test_a_rest_flood_gets_429_and_spends_the_tenants_mcp_budget(api_broker: Broker) -> None:
    before = last_seq(api_broker)
    responses, mcp_statuses = [], []
    with approver(api_broker, "paced") as http, writer(api_broker, "paced") as mcp:
        for n in range(300):
            responses.append(http.get("/v1/approvals"))
            if n >= 100 and n % 5 == 0:  # a tool outside every policy: refused after the limiter
                mcp_statuses.append(call_modern(mcp, "no_such_tool", {}).status_code)
    statuses = [r.status_code for r in responses]
    assert statuses.count(429) >= 150, statuses  # 60 at once, then one a second
    assert set(statuses) == {200, 429}
    limited = next(r for r in responses if r.status_code == 429)
    assert limited.json() == {"error": "rate_limited"} and 1 <= int(limited.headers["retry-after"]) <= 60
    # the same budget: the flood over REST also holds up this tenant's /mcp calls
    assert mcp_statuses.count(429) >= len(mcp_statuses) - 5, mcp_statuses
    events = [e for e in events_since(api_broker, before) if e.get("method") == "approvals"]
    assert len(events) == 300  # each refused request is on the record too
    assert sum(e["reason"] == "rate_limited" and e["status"] == 429 for e in events) == statuses.count(429)
    # another tenant is not affected
    with approver(api_broker, "globex") as http:
        assert http.get("/v1/approvals").status_code == 200


# -- item 5: filtered in the store, paged through all --------------------------------------------


def test_an_old_pending_approval_stays_listed_behind_many_newer_decided_ones(api_broker: Broker) -> None:
    with writer(api_broker, "history") as mcp, approver(api_broker, "history") as rest:
        oldest = wait_out_of_band(mcp, "the oldest, still waiting")
        decided = []
        for n in range(210):
            approval_id = wait_out_of_band(mcp, f"newer {n}")
            verb = "approve" if n % 2 else "deny"
            if verb == "approve":  # a yes counts only once the content was shown
                assert rest.get(f"/v1/approvals/{approval_id}").status_code == 200
            assert rest.post(f"/v1/approvals/{approval_id}/{verb}").status_code == 200
            decided.append(approval_id)

        pending = all_pages(rest, "pending", limit=7)
        assert [a["approval_id"] for a in pending] == [oldest]
        assert pending[0]["state"] == "pending" and "content" not in pending[0]
        # the approve_url's record: shown, with its content, and decidable
        shown = rest.get(f"/v1/approvals/{oldest}")
        assert shown.status_code == 200 and shown.json()["content"] == "the oldest, still waiting"

        everything = all_pages(rest, "all")
        ids = [a["approval_id"] for a in everything]
        assert len(ids) == len(set(ids)) == 211  # every record once, none skipped by paging
        assert set(ids) == {oldest, *decided}
        assert all("content" not in a for a in everything)
        assert [a["created_at"] for a in everything] == sorted(
            (a["created_at"] for a in everything), reverse=True
        )
        assert {a["approval_id"] for a in all_pages(rest, "approved", limit=33)} == set(decided[1::2])
        assert {a["approval_id"] for a in all_pages(rest, "denied")} == set(decided[0::2])

        first_page = rest.get("/v1/approvals", params={"state": "all"}).json()
        assert len(first_page["approvals"]) == 50 and first_page["next_cursor"]  # the default page
        assert rest.get(f"/v1/approvals/{oldest}").status_code == 200  # read first
        assert rest.post(f"/v1/approvals/{oldest}/approve").json()["state"] == "approved"
        assert all_pages(rest, "pending") == []


def test_cursors_are_checked_and_never_reach_another_tenant(api_broker: Broker) -> None:
    with writer(api_broker, "acme") as mcp:
        acme_ids = {wait_out_of_band(mcp, f"acme {n}") for n in range(3)}
    with writer(api_broker, "globex") as mcp:
        globex_ids = {wait_out_of_band(mcp, f"globex {n}") for n in range(2)}
    with approver(api_broker, "acme") as acme:
        page = acme.get("/v1/approvals", params={"state": "all", "limit": 1}).json()
        cursor = page["next_cursor"]
        assert cursor and page["approvals"][0]["approval_id"] in acme_ids
    with approver(api_broker, "globex") as globex:
        # acme's cursor, replayed by another tenant's approver: only that tenant's own rows
        moved = globex.get("/v1/approvals", params={"state": "all", "cursor": cursor, "limit": 100}).json()
        assert {a["approval_id"] for a in moved["approvals"]} <= globex_ids
        assert not acme_ids & {a["approval_id"] for a in moved["approvals"]}
        # a cursor forged to name acme's tenant or one of its records reads as a position only
        decoded = json.loads(base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)))
        forged = base64.urlsafe_b64encode(json.dumps([*decoded[:3], next(iter(acme_ids))]).encode()).decode()
        for params in ({"cursor": forged.rstrip("=")}, {"tenant": "acme"}):
            listed = globex.get("/v1/approvals", params={"state": "all", **params}).json()["approvals"]
            assert not acme_ids & {a["approval_id"] for a in listed}

        before = last_seq(api_broker)
        bad = {
            "garbage": {"cursor": "not a cursor!"},
            "second spelling": {"cursor": second_spelling(decoded), "state": "all"},
            "not base64 json": {"cursor": "AAAA"},
            "other state": {"cursor": cursor, "state": "pending"},
            "huge": {"cursor": "A" * 5000},
            "zero limit": {"limit": "0"},
            "big limit": {"limit": "101"},
            "word limit": {"limit": "ten"},
            "unknown state": {"state": "haunted"},
        }
        answers = {what: globex.get("/v1/approvals", params=params) for what, params in bad.items()}
    for what, response in answers.items():
        assert response.status_code == 400, what
        assert response.json()["error"] in ("bad_cursor", "bad_limit", "unknown_state"), what
    events = [e for e in events_since(api_broker, before) if e.get("method") == "approvals"]
    assert [e["status"] for e in events] == [400] * len(bad)
    assert {e["reason"] for e in events} == {"bad_cursor", "bad_limit", "unknown_state"}


def second_spelling(cursor: list[Any]) -> str:
    """A valid cursor in a base64url spelling the broker never writes: unused low bits set."""
    raw = json.dumps(cursor).encode()
    raw += b" " * (-(len(raw) - 1) % 3)  # one byte past whole groups: 4 unused bits at the end
    text = base64.urlsafe_b64encode(raw).decode().rstrip("=")
    alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
    other = text[:-1] + alphabet[alphabet.index(text[-1]) | 1]
    assert base64.urlsafe_b64decode(other + "==") == raw  # Python's lenient decoder reads it
    return other


# -- item 4: listing one tenant's approvals does not slow another's calls --------------------------


def test_listers_of_one_tenant_do_not_hold_up_another_tenants_calls(api_broker: Broker) -> None:
    """Another tenant's calls succeed while eight clients list the largest pending set in a
    tight loop, and each listing is one page of metadata. How much the listers slow those calls
    is a timing, measured by bench/approval_listers.py (with the store on the event loop, ~100
    ms p50 against ~5 ms)."""
    large = "€" * 8000  # 24,000 bytes: the largest report a client may send
    with writer(api_broker, "acme", subject="mallory") as mcp:
        for n in range(200):
            wait_out_of_band(mcp, large[:-6] + f"{n:06d}")
    source = api_broker.sources("globex")
    source.mkdir(parents=True, exist_ok=True)
    (source / "notes.md").write_text("quarterly numbers\n")

    def searches(http: httpx2.Client, rounds: int) -> None:
        for _ in range(rounds):
            reply = rpc_reply(call_modern(http, "search_documents", {"query": "quarterly"}))
            assert reply["result"]["structuredContent"]["status"] == "ok", reply

    stop = threading.Event()
    listed: list[tuple[int, int]] = []  # (status, bytes) of every listing
    listing = threading.Semaphore(0)  # released by each lister once its first listing is back

    def lister() -> None:
        first = True
        with approver(api_broker, "acme") as http:
            while not stop.is_set():
                response = http.get("/v1/approvals", params={"state": "pending"})
                listed.append((response.status_code, len(response.content)))
                if first:
                    listing.release()
                    first = False

    with writer(api_broker, "globex") as b:
        searches(b, rounds=5)  # the sandbox is up and warm
        threads = [threading.Thread(target=lister) for _ in range(8)]
        for t in threads:
            t.start()
        try:
            # The race entered: every lister is listing, and goes on listing through the calls.
            assert all(listing.acquire(timeout=30) for _ in threads)
            before = len(listed)
            searches(b, rounds=30)
            assert len(listed) > before
        finally:
            stop.set()
            for t in threads:
                t.join()
    assert {status for status, _ in listed} == {200}
    assert max(size for _, size in listed) < 30 * 1024  # one page of metadata


# -- item 6: one pending cap for in-band and out-of-band ------------------------------------------


def test_one_pending_cap_covers_in_band_questions_and_out_of_band_approvals(api_broker: Broker) -> None:
    asked, refused = [], []
    elicitation = {"elicitation": {}}
    with open_http(api_broker, api_broker.token(tenant="capped", subject="alice")) as http:
        for n in range(60):
            args = {"filename": unique("capped"), "content": f"question {n}"}
            reply = rpc_reply(call_modern(http, "save_report", args, capabilities=elicitation))
            result = reply["result"]
            if result.get("resultType") == "input_required":
                asked.append(result)
            else:
                refused.append(result["structuredContent"])
    assert len(asked) == PENDING_CAP and len(refused) == 60 - PENDING_CAP
    assert all(
        (r["status"], r["message"]) == ("rejected", "too many reports are waiting for approval")
        for r in refused
    )
    with approver(api_broker, "capped") as rest:
        assert len(all_pages(rest, "pending")) == PENDING_CAP
    # an out-of-band request now meets the same, full cap
    with writer(api_broker, "capped", subject="bob") as bob:
        status = tool_status(call_modern(bob, "save_report", {"filename": unique("oob"), "content": "x"}))
    assert (status["status"], status["message"]) == TOO_MANY


# -- items 10 and 12: one audit event per request; nothing cached or sniffed -------------------


def test_every_rest_request_leaves_one_audit_event_and_forbids_caching(api_broker: Broker) -> None:
    with writer(api_broker, "acme") as mcp:
        mine = wait_out_of_band(mcp, "for the audit")
    with writer(api_broker, "globex") as mcp:
        theirs = wait_out_of_band(mcp, "another tenant's")
    token = api_broker.token(tenant="acme", subject="carol", scope=APPROVER_SCOPE)
    requests: list[tuple[str, str, str | None]] = [
        ("GET", "/v1/approvals", token),
        ("GET", f"/v1/approvals/{mine}", token),
        ("GET", "/v1/approvals/" + "0" * 32, token),  # unknown id: a probe
        ("GET", f"/v1/approvals/{theirs}", token),  # another tenant's id
        ("GET", "/v1/approvals/..%2f..%2fetc%2fpasswd", token),
        ("GET", "/v1/approvals/" + "A" * 32, token),
        ("POST", "/v1/approvals/" + "0" * 32 + "/approve", token),
        ("POST", "/v1/approvals/x/deny", token),
        ("GET", "/v1/approvals?state=haunted", token),
        ("GET", "/v1/approvals/a/b/c", token),
        ("DELETE", "/v1/approvals", token),
        ("GET", f"/v1/approvals/{mine}/approve", token),
        ("GET", "/v1/approvals", None),
        ("GET", "/v1/approvals", api_broker.token(tenant="acme", scope=WRITE_SCOPE)),
        ("POST", f"/v1/approvals/{mine}/deny", token),
        ("POST", f"/v1/approvals/{mine}/approve", token),  # decided already: 409
    ]
    before = last_seq(api_broker)
    responses = []
    with open_http(api_broker) as http:
        for method, path, bearer in requests:
            headers = {"authorization": f"Bearer {bearer}"} if bearer else {}
            responses.append(http.request(method, path, headers=headers))
    statuses = [r.status_code for r in responses]
    assert statuses == [200, 200, 404, 404, 404, 404, 404, 404, 400, 404, 405, 405, 401, 403, 200, 409]
    events = events_since(api_broker, before)
    assert [e["event"] for e in events] == [
        "approval.viewed",
        "approval.viewed",
        "approval.viewed",
        "approval.viewed",
        "approval.viewed",
        "approval.viewed",
        "approval.decided",
        "approval.decided",
        "approval.viewed",
        "approval.viewed",
        "approval.viewed",
        "approval.decided",
        "auth.denied",
        "auth.denied",
        "approval.decided",
        "approval.decided",
    ]
    assert [e["status"] for e in events] == statuses
    assert all(e["method"] == "approvals" and len(e["request_id"]) == 32 for e in events)
    # a probed id is a value the client chose: never recorded; the tenant's own record's id is
    assert [e.get("approval_id") for e in events] == [None, mine] + [None] * 12 + [mine, mine]
    assert events[2]["reason"] == "not_found" and events[2]["outcome"] == "rejected"
    assert theirs not in json.dumps(events)
    for (method, path, _), response in zip(requests, responses, strict=True):
        for name, value in NO_STORE.items():
            assert response.headers.get(name) == value, (method, path, name)


# -- issue 26 item 3: a denial's reason is a code from a fixed list, never text ----------------


def test_a_denial_records_only_a_reason_code_from_the_list(api_broker: Broker) -> None:
    with writer(api_broker, "acme") as mcp, approver(api_broker, "acme") as http:
        approval_id = wait_out_of_band(mcp)
        url = f"/v1/approvals/{approval_id}/deny"
        for body in (
            {"reason": "the CFO's numbers are 1234"},  # free text: it could carry anything
            {"reason": ["other"]},
            {"reason": "other", "note": "x"},
            {"reason": "other" + " " * 300},
            [],
        ):
            refused = http.post(url, json=body)
            assert (refused.status_code, refused.json()) == (400, {"error": "bad_reason"}), body
        assert http.get(f"/v1/approvals/{approval_id}").json()["state"] == "pending"
        before = last_seq(api_broker)
        denied = http.post(url, json={"reason": "hidden_characters"})
        assert denied.status_code == 200 and denied.json()["state"] == "denied"
    (event,) = [e for e in events_since(api_broker, before) if e["event"] == "approval.decided"]
    assert (event["decision"], event["decision_reason"], event["subject"]) == (
        "denied",
        "hidden_characters",
        "carol",
    )
    assert event["issuer"] == api_broker.env["DOCBROKER_AUTH_ISSUER"]
    # without a body, as before: denied with no reason recorded
    with writer(api_broker, "acme") as mcp, approver(api_broker, "acme") as http:
        second = wait_out_of_band(mcp)
        assert http.post(f"/v1/approvals/{second}/deny").status_code == 200
