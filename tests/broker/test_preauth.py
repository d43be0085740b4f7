"""Requests that fail before authentication cannot fill the audit disk (`broker/auth/preauth.py`).

Each unauthenticated request used to write its own `auth.denied` line (~316 B; 1.7 GB an hour
from one sequential client), and the audit log fails closed: one client with no token could
stop every tenant. Now a client address that fails too often gets 429 for each token that fails
(one that verifies is served all the same), and past a broker-wide budget of lines per interval
the denials are counted, one line per reason and interval with `count`. Each test owns a broker
(the counts are checked after its shutdown, which writes the last interval's), and floods from
its own loopback address (127.0.0.x are all this host) so the tenant on 127.0.0.1 is another
client.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx2
import pytest

from broker.auth.preauth import PreAuthLimiter
from broker.settings import PreAuthSettings, Settings, SettingsError
from broker.testing import Broker, running_broker
from tests.broker.support import events_since, last_seq, modern_body, modern_headers

BURST = 5
INTERVAL = 1.0
ENV = {
    "DOCBROKER_PREAUTH_RATE": "1",
    "DOCBROKER_PREAUTH_BURST": str(BURST),
    "DOCBROKER_PREAUTH_INTERVAL": str(INTERVAL),
    "DOCBROKER_PREAUTH_MAX_ADDRESSES": "16",
}


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[Broker]:
    with running_broker(tmp_path, env=ENV) as b:
        yield b


def client(broker: Broker, source: str, token: str | None = None) -> httpx2.Client:
    headers = {"authorization": f"Bearer {token}"} if token else {}
    transport = httpx2.HTTPTransport(local_address=source)
    return httpx2.Client(base_url=broker.url, headers=headers, transport=transport, timeout=30)


def tools_list(http: httpx2.Client, **headers: str) -> httpx2.Response:
    return http.post(
        "/mcp", json=modern_body("tools/list"), headers={**modern_headers("tools/list"), **headers}
    )


def denied_lines(broker: Broker, since: int) -> list[dict[str, Any]]:
    return [e for e in events_since(broker, since) if e["event"] == "auth.denied"]


def counted(lines: list[dict[str, Any]]) -> int:
    """How many requests the lines stand for: one each, or the aggregated line's `count`."""
    return sum(line.get("count", 1) for line in lines)


def test_a_flood_without_tokens_gets_429_and_the_audit_grows_by_lines_per_interval(broker: Broker) -> None:
    before = last_seq(broker)
    known = broker.token(subject="behind-the-same-nat")
    with client(broker, "127.0.0.2", known) as same_address:
        assert tools_list(same_address).status_code == 200  # verified once, before the flood
    with client(broker, "127.0.0.1", broker.token()) as tenant:
        assert tools_list(tenant).status_code == 200  # the tenant's sandbox is up

    flood, statuses = 300, []
    started = time.monotonic()
    with client(broker, "127.0.0.2") as attacker, client(broker, "127.0.0.1", broker.token()) as tenant:
        for i in range(flood):
            bad = {} if i % 2 else {"authorization": "Bearer " + "e30." * 3}  # none, or a bogus one
            reply = tools_list(attacker, **bad)
            statuses.append(reply.status_code)
            if reply.status_code == 429:
                assert int(reply.headers["retry-after"]) >= 1
                assert reply.json()["error"]["message"] == "Too many requests"
            if i % 50 == 0:  # another client's tenant keeps working throughout
                assert tools_list(tenant).status_code == 200
        again = [tools_list(attacker).status_code for _ in range(BURST + 1)]  # dry now, whatever refilled
        assert again[-1] == 429
        with client(broker, "127.0.0.2", known) as same_address:
            # A token that verifies passes the limit, one verified before or a new one.
            assert tools_list(same_address).status_code == 200
            fresh = broker.token(subject="new-at-the-limited-address")
            same_address.headers["authorization"] = f"Bearer {fresh}"
            assert tools_list(same_address).status_code == 200
    elapsed = time.monotonic() - started
    assert statuses[:BURST] == [401] * BURST
    assert statuses.count(429) > flood // 2
    assert set(statuses) == {401, 429}

    broker.stop()  # writes the last interval's counts
    lines = denied_lines(broker, before)
    assert counted(lines) == flood + len(again)  # every refused request counted, none twice
    intervals = elapsed / INTERVAL + 2
    reasons = {line["reason"] for line in lines}
    assert reasons <= {"missing_token", "malformed_token", "bad_algorithm", "preauth_limited"}
    assert len(lines) <= (BURST + len(reasons)) * intervals  # whatever the flood's size
    aggregated = [line for line in lines if "count" in line]
    assert all(line["outcome"] == "denied" for line in aggregated)
    assert {line["reason"] for line in aggregated} >= {"preauth_limited"}
    assert counted(aggregated) > flood // 2 and len(aggregated) < counted(aggregated) / 4


def test_addresses_past_the_table_share_one_bucket(broker: Broker) -> None:
    # 40 addresses, each failing fewer times than its own burst: the first 16 fit the table
    # and are never limited; the others share one overflow bucket, which runs dry.
    before = last_seq(broker)
    statuses: dict[str, list[int]] = {}
    for n in range(40):
        source = f"127.0.0.{10 + n}"
        with client(broker, source) as http:
            statuses[source] = [tools_list(http).status_code for _ in range(BURST - 1)]
    tracked = [statuses[f"127.0.0.{10 + n}"] for n in range(16)]
    overflow = [statuses[f"127.0.0.{10 + n}"] for n in range(16, 40)]
    assert all(s == [401] * (BURST - 1) for s in tracked)
    assert sum(s.count(429) for s in overflow) > 0
    broker.stop()
    assert counted(denied_lines(broker, before)) == 40 * (BURST - 1)


def test_the_approvals_api_shares_the_limit(broker: Broker) -> None:
    before = last_seq(broker)
    with client(broker, "127.0.0.3") as http:
        replies = [http.get("/v1/approvals") for _ in range(BURST + 10)]
    assert [r.status_code for r in replies[:BURST]] == [401] * BURST
    limited = [r for r in replies if r.status_code == 429]
    assert limited and all(r.json() == {"error": "too_many_requests"} for r in limited)
    assert all(int(r.headers["retry-after"]) >= 1 for r in limited)
    broker.stop()
    assert counted(denied_lines(broker, before)) == BURST + 10


def test_an_unauthenticated_request_refused_for_another_reason_is_counted_too(broker: Broker) -> None:
    # A PUT was refused (405) before authentication, with an audit line of its own each time.
    before = last_seq(broker)
    with client(broker, "127.0.0.4") as http:
        statuses = [http.put("/mcp", content=b"{}").status_code for _ in range(30)]
    assert statuses[:BURST] == [401] * BURST and 429 in statuses
    broker.stop()
    events = events_since(broker, before)
    assert counted(denied_lines(broker, before)) == 30
    assert len(events) <= BURST + 2 * 3  # own lines, then one per reason and interval


def test_the_table_of_addresses_stays_bounded() -> None:
    now = [0.0]
    limiter = PreAuthLimiter(PreAuthSettings(rate=1, burst=2, max_addresses=64), clock=lambda: now[0])
    for n in range(100_000):
        limiter.failed(f"10.{n >> 16}.{(n >> 8) & 255}.{n & 255}", "missing_token")
    assert len(limiter) == 64
    now[0] += 10  # every bucket refilled: the next interval starts with an empty table
    assert sum(limiter.drain().values()) == 100_000 - 2  # the first `burst` had lines of their own
    assert len(limiter) == 0


SETTINGS_BASE = {
    "DOCBROKER_AUTH_ISSUER": "https://issuer.example",
    "DOCBROKER_AUTH_AUDIENCE": "docbroker",
    "DOCBROKER_AUTH_JWKS_URL": "https://issuer.example/jwks.json",
}


def test_the_preauth_limit_has_defaults_and_is_read_from_the_environment() -> None:
    assert Settings.from_env(SETTINGS_BASE).preauth == PreAuthSettings(1.0, 20, 60.0, 4096)
    env = SETTINGS_BASE | {
        "DOCBROKER_PREAUTH_RATE": "0.5",
        "DOCBROKER_PREAUTH_BURST": "3",
        "DOCBROKER_PREAUTH_INTERVAL": "10",
        "DOCBROKER_PREAUTH_MAX_ADDRESSES": "100",
    }
    assert Settings.from_env(env).preauth == PreAuthSettings(0.5, 3, 10.0, 100)


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("DOCBROKER_PREAUTH_RATE", "-2"),
        ("DOCBROKER_PREAUTH_RATE", "fast"),
        ("DOCBROKER_PREAUTH_BURST", "-5"),
        ("DOCBROKER_PREAUTH_INTERVAL", "0.1"),
        ("DOCBROKER_PREAUTH_INTERVAL", "7200"),
        ("DOCBROKER_PREAUTH_MAX_ADDRESSES", "4"),
    ],
)
def test_bad_preauth_settings_are_refused_naming_the_variable_only(name: str, value: str) -> None:
    with pytest.raises(SettingsError) as caught:
        Settings.from_env(SETTINGS_BASE | {name: value})
    assert name in str(caught.value) and value not in str(caught.value).replace(name, "")
