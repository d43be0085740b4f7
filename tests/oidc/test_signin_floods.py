"""Floods at the page's sign-in, from the attacker's side (issue 34 items 10 and 11), with a
real OpenID Provider and a real broker.

- Sign-ins begun and never finished used to be rows under one broker-wide cap (10,000 living
  10 minutes, ~17 GETs a second kept it full): every approver then got 503. A sign-in under
  way is now sealed into its own cookie: there is nothing to fill.
- A cookie that names no session, and a POST without the session's CSRF token, were one
  `auth.denied` line each, outside the pre-auth limiter that bounds bad bearer tokens. They
  are counted like bad tokens: past the interval's burst, one line per reason with `count`.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx2
import pytest

from broker.testing import Broker
from tests.oidc.support import SESSION_COOKIE, Browser, provider_and_broker

BURST = 5
INTERVAL = 3.0
FLOOD = 200


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Broker]:
    tmp: Path = tmp_path_factory.mktemp("floods")
    env = {
        # The pre-auth limiter as shipped bounds the log per interval; tight here to see it.
        "DOCBROKER_PREAUTH_BURST": str(BURST),
        "DOCBROKER_PREAUTH_RATE": "1",
        "DOCBROKER_PREAUTH_INTERVAL": str(INTERVAL),
        # Not DOCBROKER_OIDC_MAX_OPEN_SIGNINS: the cap on sign-ins under way that an older main
        # had (gone with the rows it counted) was set low here so the flood that filled it stayed
        # small; a broker now refuses a variable no setting reads (issue 36 item 2).
    }
    with provider_and_broker(tmp, **env) as (_, started):
        yield started


def from_address(address: str) -> httpx2.Client:
    """A client whose connections come from `address` (any 127/8 address is this machine)."""
    return httpx2.Client(transport=httpx2.HTTPTransport(local_address=address), timeout=30)


def test_a_flood_of_sign_ins_from_one_address_locks_no_other_approver_out(broker: Broker) -> None:
    with from_address("127.0.0.2") as attacker:
        answers = [attacker.get(f"{broker.url}/approvals/login").status_code for _ in range(FLOOD // 4)]
    assert set(answers) == {302}  # each a sign-in begun, never finished: nothing kept for it
    approver = Browser(broker)  # from 127.0.0.1
    assert approver.sign_in("ann").status_code == 303
    assert approver.session()["signed_in"] is True


def refusals(broker: Broker, reason: str) -> tuple[int, int]:
    """(audit lines, requests they stand for) of `reason`: a line of its own stands for one,
    an interval's counted line for its `count`."""
    lines = [e for e in broker.audit_events() if e.get("reason") == reason]
    return len(lines), sum(int(e.get("count", 1)) for e in lines)


def most_lines(seconds: float) -> int:
    """What the limiter allows in `seconds`: the burst and one counted line per interval (and
    an interval begun before, one after)."""
    return int((BURST + 1) * (seconds / INTERVAL + 2))


def wait_for_count(broker: Broker, reason: str, total: int) -> tuple[int, int]:
    """Until the interval's counted lines are out, or 30 s."""
    deadline = time.monotonic() + 30
    seen = refusals(broker, reason)
    while seen[1] < total and time.monotonic() < deadline:
        time.sleep(0.1)
        seen = refusals(broker, reason)
    return seen


def test_bogus_session_cookies_are_counted_like_bad_tokens(broker: Broker) -> None:
    began = time.monotonic()
    with from_address("127.0.0.3") as attacker:
        for i in range(FLOOD):
            cookie = {"cookie": f"{SESSION_COOKIE}=forged-{i:04d}"}
            assert attacker.get(f"{broker.url}/v1/approvals", headers=cookie).status_code == 401
    bound = most_lines(time.monotonic() - began)
    lines, requests = wait_for_count(broker, "session_invalid", FLOOD)
    assert requests == FLOOD  # every one accounted for ...
    assert lines <= bound < FLOOD, f"{lines} audit lines for {FLOOD} forged cookies"  # ... in few lines
    counted: list[dict[str, Any]] = [
        e for e in broker.audit_events() if e.get("reason") == "session_invalid" and "count" in e
    ]
    assert counted and {e["event"] for e in counted} == {"auth.denied"}


def test_posts_without_the_csrf_token_are_counted_like_bad_tokens(broker: Broker) -> None:
    approver = Browser(broker)
    assert approver.sign_in("ann").status_code == 303
    assert approver.session()["signed_in"] is True
    began = time.monotonic()
    for _ in range(FLOOD):
        # any id: the token is checked before the record is looked for
        assert approver.post(f"/v1/approvals/{'0' * 32}/approve", csrf="wrong").status_code == 403
    bound = most_lines(time.monotonic() - began)
    lines, requests = wait_for_count(broker, "csrf_token_invalid", FLOOD)
    assert requests == FLOOD
    assert lines <= bound < FLOOD, f"{lines} audit lines for {FLOOD} requests without the CSRF token"
    # The session itself is still good: the token it was given works.
    assert approver.request("GET", "/v1/approvals").status_code == 200
