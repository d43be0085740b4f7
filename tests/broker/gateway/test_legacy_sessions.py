"""Legacy session ids (`broker/gateway/legacy_sessions.py`): sealed to the principal, opened by any
replica that holds the master key, and nothing for anyone else.

In-process tests of the sealer, then the same properties over HTTP through a real broker.
"""

from __future__ import annotations

import base64
import os
import time
from collections.abc import Callable
from pathlib import Path

import httpx2
import pytest

from broker.gateway.legacy_sessions import MAX_SESSION_ID_CHARS, SessionSealer
from broker.master_key import load_master_key, session_key
from broker.testing import Broker, running_broker
from broker.testing.replicas import running_replicas
from broker.types import Principal
from tests.broker.support import (
    LegacySession,
    decide,
    events_since,
    last_seq,
    open_http,
    rpc_reply,
    terminal,
    tool_status,
    unique,
)

KEY = os.urandom(32)


def who(tenant: str, subject: str = "alice") -> Principal:
    return Principal(tenant=tenant, subject=subject, scopes=frozenset())


def test_only_the_principal_that_opened_a_session_can_open_its_id() -> None:
    sealer = SessionSealer(KEY)
    sealed = sealer.seal("s1", who("acme"))
    assert sealed is not None and "s1" not in sealed
    assert sealer.open(sealed, who("acme")) == "s1"
    assert sealer.open(sealed, who("acme", "mallory")) is None  # same tenant, another subject
    assert sealer.open(sealed, who("globex")) is None  # same subject name, another tenant


def test_another_replica_with_the_same_key_opens_it_and_one_with_another_key_does_not() -> None:
    sealed = SessionSealer(KEY).seal("s1", who("acme"))
    assert sealed is not None
    assert SessionSealer(KEY).open(sealed, who("acme")) == "s1"
    assert SessionSealer(os.urandom(32)).open(sealed, who("acme")) is None


def test_tenant_and_subject_cannot_be_shifted_into_each_other() -> None:
    sealer = SessionSealer(KEY)
    sealed = sealer.seal("s1", who("ab", "c"))
    assert sealed is not None
    assert sealer.open(sealed, who("a", "bc")) is None


def test_an_altered_or_forged_id_opens_to_nothing() -> None:
    sealer = SessionSealer(KEY)
    sealed = sealer.seal("s1", who("acme"))
    assert sealed is not None
    raw = bytearray(base64.urlsafe_b64decode(sealed[5:] + "=" * (-len(sealed[5:]) % 4)))
    for i in range(len(raw)):
        flipped = raw.copy()
        flipped[i] ^= 0x01
        altered = "dbm1." + base64.urlsafe_b64encode(bytes(flipped)).decode().rstrip("=")
        assert sealer.open(altered, who("acme")) is None
    for forged in ("s1", "dbm1.", "dbm1.AAAA", "dbm1." + "A" * 200, "dbm1.!!!!", "dbm1." + "A" * 600):
        assert sealer.open(forged, who("acme")) is None


def respellings(sealed: str) -> dict[str, str]:
    """Other strings a lenient base64 decoder reads as the same bytes as `sealed` (issue 24
    item 11): each must be a different, unknown id."""
    body = sealed.removeprefix("dbm1.")
    mid = len(body) // 2
    spellings = {
        "!!!! inserted": f"dbm1.{body[:mid]}!!!!{body[mid:]}",
        ".... inserted": f"dbm1.{body[:mid]}....{body[mid:]}",
        "== appended": sealed + "==",
        "+/ for -_": "dbm1." + body.replace("-", "+").replace("_", "/"),
    }
    if len(body) % 4:  # the last character carries bits of no byte: the lowest one of them
        alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
        spellings["unused bit set"] = f"dbm1.{body[:-1]}{alphabet[alphabet.index(body[-1]) ^ 1]}"
    assert sealed not in spellings.values()
    return spellings


def sealed_with_dash_or_underscore(sealer: SessionSealer, session_id: str, principal: Principal) -> str:
    """A seal of `session_id` that holds `-` or `_` (most do), so `+/` can stand in for them."""
    for _ in range(100):
        sealed = sealer.seal(session_id, principal)
        assert sealed is not None
        if "-" in sealed or "_" in sealed:
            return sealed
    raise AssertionError("no seal with - or _ in 100 tries")


def test_a_sealed_id_opens_under_its_one_spelling_only() -> None:
    sealer = SessionSealer(KEY)
    sealed = sealed_with_dash_or_underscore(sealer, "s1", who("acme"))
    assert sealer.open(sealed, who("acme")) == "s1"
    for name, spelling in respellings(sealed).items():
        assert sealer.open(spelling, who("acme")) is None, name


def test_an_expired_id_opens_to_nothing() -> None:
    now = [1_000_000.0]
    sealer = SessionSealer(KEY, ttl_seconds=60, clock=lambda: now[0])
    sealed = sealer.seal("s1", who("acme"))
    assert sealed is not None
    now[0] += 59
    assert sealer.open(sealed, who("acme")) == "s1"
    now[0] += 1
    assert sealer.open(sealed, who("acme")) is None


def test_a_sandbox_id_that_is_too_long_or_not_visible_ascii_is_never_sealed() -> None:
    # The sandbox's answer is not trusted: its id must not grow the header or carry controls.
    sealer = SessionSealer(KEY)
    assert sealer.seal("x" * (MAX_SESSION_ID_CHARS + 1), who("acme")) is None
    for bad in ("", "a b", "a\r\nb", "é", "a\x00"):
        assert sealer.seal(bad, who("acme")) is None
    assert sealer.seal("x" * MAX_SESSION_ID_CHARS, who("acme")) is not None


def test_two_seals_of_one_id_differ() -> None:
    sealer = SessionSealer(KEY)
    assert sealer.seal("s1", who("acme")) != sealer.seal("s1", who("acme"))


# -- over HTTP ------------------------------------------------------------------------------------

PING = {"jsonrpc": "2.0", "id": 3, "method": "ping"}


def test_the_client_holds_a_sealed_id_and_its_session_works(broker: Broker) -> None:
    with open_http(broker, broker.token()) as http:
        session = LegacySession(http)
        assert session.session_id.startswith("dbm1.")
        r = session.post(PING)
        assert r.status_code == 200 and "result" in rpc_reply(r)
        assert r.headers.get("mcp-session-id") in (None, session.session_id)


def test_a_sealed_id_is_nothing_to_another_subject_or_when_altered(broker: Broker) -> None:
    with open_http(broker, broker.token()) as http:
        session = LegacySession(http)
    others = {
        "other subject": broker.token(subject="mallory"),
        "other tenant": broker.token(tenant="globex"),
    }
    for token in others.values():
        with open_http(broker, token) as other:
            assert session.post(PING, other).status_code == 404
    altered = session.session_id[:-2] + ("AA" if not session.session_id.endswith("AA") else "BB")
    with open_http(broker, broker.token()) as http:
        r = http.post("/mcp", json=PING, headers={**session.headers(), "mcp-session-id": altered})
        assert r.status_code == 404
        # the sandbox's own kind of id (not sealed) is refused too
        r = http.post("/mcp", json=PING, headers={**session.headers(), "mcp-session-id": "0" * 32})
        assert r.status_code == 404


def test_every_other_spelling_of_a_sealed_id_gets_404(broker: Broker) -> None:
    with open_http(broker, broker.token()) as http:
        for _ in range(20):  # a session whose id holds `-` or `_` (most do)
            session = LegacySession(http)
            if "-" in session.session_id or "_" in session.session_id:
                break
        else:
            raise AssertionError("no sealed id with - or _ in 20 sessions")
        assert session.post(PING).status_code == 200
        for name, spelling in respellings(session.session_id).items():
            r = http.post("/mcp", json=PING, headers={**session.headers(), "mcp-session-id": spelling})
            assert r.status_code == 404, name
            assert r.json()["error"]["message"] == "Session not found", name
        assert session.post(PING).status_code == 200  # the one spelling still works


def session_requests(
    session: LegacySession, http: httpx2.Client | None = None
) -> dict[str, Callable[[], httpx2.Response]]:
    """One request of each kind a client may send in a session (through `http`: another
    replica, say)."""
    via = http or session.http
    listing = {"jsonrpc": "2.0", "id": 4, "method": "tools/list"}
    initialized = {"jsonrpc": "2.0", "method": "notifications/initialized"}
    return {
        "ping": lambda: session.post(PING, via),
        "tools/list": lambda: session.post(listing, via),
        "tools/call search_documents": lambda: session.call("search_documents", {"query": "hello"}, via),
        "tools/call read_document": lambda: session.call("read_document", {"filename": "notes.md"}, via),
        "a notification": lambda: session.post(initialized, via),
        "GET": lambda: via.get("/mcp", headers=session.headers()),
        "DELETE": lambda: via.delete("/mcp", headers=session.headers()),
    }


def all_not_found(requests: dict[str, Callable[[], httpx2.Response]]) -> None:
    for name, send in requests.items():
        r = send()
        assert r.status_code == 404, (name, r.text)
        assert r.json()["error"]["message"] == "Session not found", name


def test_every_request_in_a_deleted_session_gets_404(broker: Broker) -> None:
    # Issue 24 item 10: a tools/call got 200 "the tool sandbox returned an invalid result"
    # (the sandbox's 404 read as a tool's answer) where tools/list got 404.
    with open_http(broker, broker.token()) as http:
        session = LegacySession(http)
        assert session.call("search_documents", {"query": "hello"}).status_code == 200
        assert http.delete("/mcp", headers=session.headers()).status_code == 200
        seq = last_seq(broker)
        requests = session_requests(session)
        all_not_found(requests)
    ended = [e for e in terminal(events_since(broker, seq)) if e.get("subject") == "alice"]
    assert [(e["outcome"], e["reason"]) for e in ended] == [("denied", "session_ended")] * len(requests)


def test_a_save_in_a_deleted_session_gets_404_and_no_one_is_asked_to_approve_it(broker: Broker) -> None:
    with open_http(broker, broker.token()) as http:
        session = LegacySession(http)
        assert http.delete("/mcp", headers=session.headers()).status_code == 200
        seq = last_seq(broker)
        r = session.call("save_report", {"filename": unique("ended"), "content": "# Never asked\n"})
        assert r.status_code == 404, r.text
        assert r.json()["error"]["message"] == "Session not found"
    since = [e for e in events_since(broker, seq) if e.get("subject") == "alice"]
    assert not [e for e in since if e["event"].startswith("approval.")], since
    assert [(e["outcome"], e["reason"]) for e in terminal(since)] == [("denied", "session_ended")]


def test_an_approved_save_in_a_deleted_session_gets_404_and_keeps_its_approval(broker: Broker) -> None:
    name, content = unique("ended"), "# Written in the next session\n"
    arguments = {"filename": name, "content": content}
    with open_http(broker, broker.token()) as http:
        session = LegacySession(http)
        waiting = tool_status(session.call("save_report", arguments))
        assert waiting["status"] == "waiting_approval", waiting
        assert decide(broker, waiting["data"]["approval_id"]).status_code == 200
        assert http.delete("/mcp", headers=session.headers()).status_code == 200
        r = session.call("save_report", arguments)
        assert r.status_code == 404, r.text
        assert not (broker.reports("acme") / name).exists()
        # the approval was not spent on the ended session: the client's new session uses it
        written = tool_status(LegacySession(http).call("save_report", arguments))
        assert written["status"] == "ok", written
    assert (broker.reports("acme") / name).read_text() == content


def test_a_session_deleted_through_one_replica_is_ended_on_both(tmp_path: Path) -> None:
    with running_replicas(tmp_path, 2) as (a, b):
        token = a.token()
        with open_http(a, token) as via_a, open_http(b, token) as via_b:
            session = LegacySession(via_a)
            for via in (via_a, via_b):  # one session, served by either replica
                assert session.call("search_documents", {"query": "hello"}, via).status_code == 200
            assert via_b.delete("/mcp", headers=session.headers()).status_code == 200
            for via in (via_a, via_b):
                all_not_found(session_requests(session, via))


def test_an_expired_session_id_gets_404(tmp_path: Path) -> None:
    """Time is the test's own: it holds the master key, so it opens and re-seals the broker's
    id with a clock of its choosing (no wait for a real expiry)."""
    ttl = 600
    with running_broker(tmp_path, env={"DOCBROKER_SESSION_TTL": str(ttl)}) as broker:
        key = session_key(load_master_key(broker.data_dir / "master.key"))  # the default place

        def sealer_at(now: float) -> SessionSealer:
            return SessionSealer(key, ttl_seconds=ttl, clock=lambda: now)

        with open_http(broker, broker.token()) as http:
            session = LegacySession(http)
            assert session.post(PING).status_code == 200
            now = time.time()
            # The broker sealed it for DOCBROKER_SESSION_TTL: open just before, nothing just after.
            inner = sealer_at(now + ttl - 10).open(session.session_id, who("acme"))
            assert inner is not None
            assert sealer_at(now + ttl + 10).open(session.session_id, who("acme")) is None
            # The same live session, sealed as if opened a TTL ago: expired, 404.
            expired = sealer_at(now - ttl - 1).seal(inner, who("acme"))
            assert expired is not None
            r = http.post("/mcp", json=PING, headers={**session.headers(), "mcp-session-id": expired})
            assert r.status_code == 404
            # Sealed now, the same id works: only the expiry made the difference.
            fresh = sealer_at(now).seal(inner, who("acme"))
            assert fresh is not None
            r = http.post("/mcp", json=PING, headers={**session.headers(), "mcp-session-id": fresh})
            assert r.status_code == 200


@pytest.mark.parametrize("value", ["0", "31" + "0" * 7])
def test_session_ttl_is_validated_at_start(tmp_path: Path, value: str) -> None:
    with pytest.raises(RuntimeError, match="DOCBROKER_SESSION_TTL"):
        with running_broker(tmp_path, env={"DOCBROKER_SESSION_TTL": value}):
            pass
