"""Sign-in to /approvals from the attacker's side (issue 26 items 1 and 6), over real HTTP
against a real OpenID Provider and a real broker. Each test names the defence it checks;
without that defence the attack succeeds and the test fails."""

from __future__ import annotations

import asyncio
import urllib.parse

import httpx2
import pytest

from broker.settings import OidcSettings
from broker.testing import Broker
from broker.web.oidc import OidcProvider, SignInFailed
from tests.oidc.support import (
    SESSION_COOKIE,
    SIGNIN_COOKIE,
    Browser,
    Provider,
    pending_approval,
    set_cookies,
    state_of,
)

pytestmark = pytest.mark.anyio


@pytest.fixture
def browser(broker: Broker) -> Browser:
    return Browser(broker)


def signed_in(browser: Browser, login: str) -> str:
    """Sign `login` in; the session's CSRF token."""
    response = browser.sign_in(login)
    assert response.status_code == 303, response.text
    session = browser.session()
    assert session["signed_in"] and session["subject"] == login, session
    return str(session["csrf"])


def with_query(url: str, **changes: str) -> str:
    parts = urllib.parse.urlsplit(url)
    query = dict(urllib.parse.parse_qsl(parts.query))
    query.update(changes)
    return urllib.parse.urlunsplit(parts._replace(query=urllib.parse.urlencode(query)))


def test_cookies_are_host_prefixed_httponly_secure_and_as_strict_as_the_flow_allows(browser: Browser) -> None:
    start = browser.request("GET", "/approvals/login")
    signin = set_cookie(start, SIGNIN_COOKIE)
    # Lax: it must come back on the provider's cross-site redirect to the callback
    assert signin["samesite"].lower() == "lax" and {"secure", "httponly"} <= signin.keys()
    callback = browser.authenticate(start.headers["location"], "ann")
    done = browser.request("GET", callback)
    session = set_cookie(done, SESSION_COOKIE)
    assert session["samesite"].lower() == "strict" and {"secure", "httponly"} <= session.keys()
    assert session["path"] == "/" and "domain" not in session
    assert len(session["value"]) >= 43 and "ann" not in session["value"]  # opaque: 32 random bytes


def set_cookie(response: httpx2.Response, name: str) -> dict[str, str]:
    found = set_cookies(response)
    assert name in found, found
    return found[name]


async def test_csrf_a_decision_without_the_token_is_refused(broker: Broker, browser: Browser) -> None:
    csrf = signed_in(browser, "ann")
    approval_id = await pending_approval(broker)
    for forged in (None, "", "x" * 43, csrf[:-1] + ("A" if csrf[-1] != "A" else "B")):
        refused = browser.post(f"/v1/approvals/{approval_id}/approve", forged)
        assert (refused.status_code, refused.json()) == (403, {"error": "csrf"}), forged
        assert state_of(broker, approval_id) == "pending"
    logout = browser.post("/approvals/logout", None)  # logging someone out is a change too
    assert logout.status_code == 403 and browser.session()["signed_in"]
    assert browser.request("GET", f"/v1/approvals/{approval_id}").status_code == 200  # read first
    approved = browser.post(f"/v1/approvals/{approval_id}/approve", csrf)
    assert approved.status_code == 200 and approved.json()["state"] == "approved"


async def test_a_stolen_session_cookie_is_dead_after_logout(broker: Broker, browser: Browser) -> None:
    csrf = signed_in(browser, "ann")
    stolen = browser.cookies[SESSION_COOKIE]
    thief = Browser(broker, cookies={SESSION_COOKIE: stolen})
    assert thief.request("GET", "/v1/approvals").status_code == 200  # it works while she is in
    out = browser.post("/approvals/logout", csrf)
    assert out.status_code == 200 and out.json()["logout_url"].startswith(
        str(browser.broker.env["DOCBROKER_OIDC_ISSUER"])
    )
    assert SESSION_COOKIE not in browser.cookies
    assert thief.request("GET", "/v1/approvals").status_code == 401
    assert thief.session() == {"mode": "oidc", "signed_in": False}
    approval_id = await pending_approval(broker)
    assert thief.post(f"/v1/approvals/{approval_id}/approve", csrf).status_code == 401
    assert state_of(broker, approval_id) == "pending"


def test_a_replayed_callback_or_code_is_refused(broker: Broker, browser: Browser) -> None:
    callback = browser.authenticate(browser.start(), "ann")
    signin_cookie = browser.cookies[SIGNIN_COOKIE]
    assert browser.request("GET", callback).status_code == 303
    # the same callback again, with the sign-in cookie it came with: the cookie still opens
    # (the sign-in travels sealed in it, nothing is stored to take), but the provider
    # redeems a code once
    replay = Browser(broker, cookies={SIGNIN_COOKIE: signin_cookie})
    again = replay.request("GET", callback)
    assert again.status_code == 400 and "code_refused" in again.text and SESSION_COOKIE not in replay.cookies
    # the code inside a fresh sign-in of the attacker's (a state of their own): the provider
    # took it once already
    attacker = Browser(broker)
    state = dict(urllib.parse.parse_qsl(urllib.parse.urlsplit(attacker.start()).query))["state"]
    reused = attacker.request("GET", with_query(callback, state=state))
    assert (
        reused.status_code == 400 and "code_refused" in reused.text and SESSION_COOKIE not in attacker.cookies
    )


def test_a_callback_with_another_state_is_refused(broker: Broker, browser: Browser) -> None:
    # login CSRF: the attacker's own code and state, delivered into the victim's browser
    attacker = Browser(broker)
    attackers_callback = attacker.authenticate(attacker.start(), "bob")
    browser.start()  # the victim's own sign-in is under way
    answer = browser.request("GET", attackers_callback)
    assert answer.status_code == 400 and "bad_state" in answer.text
    assert SESSION_COOKIE not in browser.cookies
    # and the attacker's own sign-in cannot use it either once the state is wrong
    forged = attacker.request("GET", with_query(attackers_callback, state="forged"))
    assert forged.status_code == 400 and "bad_state" in forged.text


def test_a_callback_naming_another_issuer_is_refused(broker: Broker, browser: Browser) -> None:
    callback = browser.authenticate(browser.start(), "ann")
    answer = browser.request("GET", with_query(callback, iss="https://idp.attacker.example"))
    assert answer.status_code == 400 and "bad_issuer" in answer.text and SESSION_COOKIE not in browser.cookies


def test_an_id_token_for_another_nonce_is_refused(broker: Broker, browser: Browser) -> None:
    # The authorization request is public (it crosses the browser): the attacker changes its
    # nonce and has the provider issue a code for it; PKCE and state still match.
    authorization = with_query(browser.start(), nonce="attackers-nonce")
    answer = browser.request("GET", browser.authenticate(authorization, "ann"))
    assert (
        answer.status_code == 400 and "bad_id_token" in answer.text and SESSION_COOKIE not in browser.cookies
    )


def test_return_to_never_leaves_the_page(broker: Broker) -> None:
    hostile = [
        "https://evil.example/approvals",
        "//evil.example/approvals",
        "/\\evil.example",
        "/approvals/../v1/approvals",
        "/approvals?id=1@evil.example",
        "/approvals@evil.example",
        "javascript:alert(1)",
    ]
    for target in hostile:
        answer = Browser(broker).sign_in("ann", return_to=target)
        assert (answer.status_code, answer.headers["location"]) == (303, "/approvals"), target
    one = "/approvals?id=" + "a" * 32
    assert Browser(broker).sign_in("ann", return_to=one).headers["location"] == one


def test_session_fixation_a_planted_cookie_is_never_the_victims_session(broker: Broker) -> None:
    attacker = Browser(broker)
    signed_in(attacker, "bob")
    planted = attacker.cookies[SESSION_COOKIE]
    for value in (planted, "attacker-chosen-value"):
        victim = Browser(broker, cookies={SESSION_COOKIE: value})
        assert victim.sign_in("ann").status_code == 303
        assert victim.cookies[SESSION_COOKIE] != value
        assert victim.session()["subject"] == "ann"
        # what the attacker holds does not open her session (nor, once she signed in over it, his)
        assert Browser(broker, cookies={SESSION_COOKIE: value}).session() == {
            "mode": "oidc",
            "signed_in": False,
        }


def test_people_without_an_approver_mapping_get_no_session(broker: Broker) -> None:
    for login in ("walt", "nobody"):  # in acme's group without the approver role; in no group
        browser = Browser(broker)
        answer = browser.sign_in(login)
        assert answer.status_code == 403 and "no_tenant_mapped" in answer.text, login
        assert SESSION_COOKIE not in browser.cookies
    reasons = [e["reason"] for e in broker.audit_events() if e["event"] == "web.signin"]
    assert reasons[-2:] == ["no_tenant_mapped", "no_tenant_mapped"]


def test_the_provider_answer_issuer_must_be_the_configured_one(provider: Provider) -> None:
    # Discovery at the configured URL naming another issuer is refused before anyone signs in.
    settings = OidcSettings(issuer=provider.issuer + "/", client_id="docbroker")
    client = OidcProvider(settings, redirect_uri="http://127.0.0.1:1/approvals/callback", post_logout_uri="x")
    with pytest.raises(SignInFailed) as refused:
        asyncio.run(client.authorization_url(state="s", nonce="n", verifier="v" * 43))
    assert refused.value.reason == "provider_issuer_mismatch"
