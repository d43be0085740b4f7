"""Legacy session ids (`broker/gateway/sessions.py`): sealed to the principal, opened by any
replica that holds the master key, and nothing for anyone else.

In-process tests of the sealer, then the same properties over HTTP through a real broker.
"""

from __future__ import annotations

import base64
import os
import time
from pathlib import Path

import pytest

from broker.gateway.sessions import MAX_SESSION_ID_CHARS, SessionSealer
from broker.master_key import load_master_key, session_key
from broker.testing import Broker, running_broker
from broker.types import Principal
from tests.broker.support import LegacySession, open_http, rpc_reply

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
