"""A session ends by itself (issue 26 item 1): at its idle timeout without requests, and at
its lifetime however busy it is; the cookie is refused from then on, by every surface. (Sign-ins
begun and never finished: test_signin_floods.py.)"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from broker.testing import Broker
from tests.oidc.support import Browser, provider_and_broker

LIFETIME, IDLE = 10, 5


@pytest.fixture(scope="module")
def short_lived(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Broker]:
    tmp: Path = tmp_path_factory.mktemp("expiry")
    env = {
        "DOCBROKER_OIDC_SESSION_LIFETIME": str(LIFETIME),
        "DOCBROKER_OIDC_SESSION_IDLE": str(IDLE),
    }
    with provider_and_broker(tmp, **env) as (_, broker):
        yield broker


def test_an_idle_session_expires(short_lived: Broker) -> None:
    browser = Browser(short_lived)
    assert browser.sign_in("ann").status_code == 303
    assert browser.request("GET", "/v1/approvals").status_code == 200
    time.sleep(IDLE + 1)  # not a synchronisation: the idle timeout is the thing under test
    assert browser.request("GET", "/v1/approvals").status_code == 401
    assert browser.session() == {"mode": "oidc", "signed_in": False}


def test_a_busy_session_still_ends_at_its_lifetime(short_lived: Broker) -> None:
    browser = Browser(short_lived)
    assert browser.sign_in("ann").status_code == 303
    began = time.monotonic()
    while browser.request("GET", "/v1/approvals").status_code == 200:  # never idle for long
        assert time.monotonic() - began < LIFETIME + 5, "the session outlived its lifetime"
        time.sleep(1)
    assert time.monotonic() - began >= LIFETIME - 2  # ended by the lifetime, not by idling
    assert browser.session()["signed_in"] is False
