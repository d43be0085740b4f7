"""A session ends by itself (issue 26 item 1): at its idle timeout without requests, and at
its lifetime however busy it is; the cookie is refused from then on, by every surface. And
sign-ins begun but never finished cannot pile up without bound."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from broker.testing import Broker
from tests.oidc.support import Browser, provider_and_broker

LIFETIME, IDLE = 10, 5
MAX_OPEN = 3


@pytest.fixture(scope="module")
def short_lived(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Broker]:
    tmp: Path = tmp_path_factory.mktemp("expiry")
    env = {
        "DOCBROKER_OIDC_SESSION_LIFETIME": str(LIFETIME),
        "DOCBROKER_OIDC_SESSION_IDLE": str(IDLE),
        "DOCBROKER_OIDC_MAX_OPEN_SIGNINS": str(MAX_OPEN),
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


def test_sign_ins_that_never_finish_are_bounded(short_lived: Broker) -> None:
    started = [Browser(short_lived) for _ in range(MAX_OPEN)]
    urls = [browser.start() for browser in started]  # each a row until its callback or expiry
    refused = Browser(short_lived).request("GET", "/approvals/login")
    assert refused.status_code == 503 and "too_many_signins" in refused.text
    # one finishes: room for the next
    assert started[0].request("GET", started[0].authenticate(urls[0], "ann")).status_code == 303
    assert Browser(short_lived).request("GET", "/approvals/login").status_code == 302
