"""Approvers sign in with the organisation's OpenID Provider in a real browser (issue 26 item 6).

A real provider (npm oidc-provider, started by the test), headless Chromium, a real broker:
an MCP client proposes a save, an approver signs in on the provider's own login form,
approves on the page, and the client's save completes. An approver of another tenant's
group, signed in the same way, sees nothing of it and cannot approve it. Signing out ends
the session at the broker and, RP-initiated, at the provider.
"""

from __future__ import annotations

import json
import re
import urllib.parse

import pytest
from selenium import webdriver
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import Select, WebDriverWait

from broker.testing import Broker, structured
from tests.broker.support import open_mcp, unique
from tests.oidc.support import SESSION_COOKIE, Provider

pytestmark = pytest.mark.anyio

CONTENT = "Quarterly numbers: 1234 9876\n"


async def propose(broker: Broker, name: str) -> dict[str, str]:
    # alice's client cannot be asked in-band: the save waits for a human on the page
    async with open_mcp(broker, broker.token(subject="alice")) as client:
        result = structured(await client.call_tool("save_report", {"filename": name, "content": CONTENT}))
    assert result["status"] == "waiting_approval", result
    return dict(result["data"])


def sign_in(driver: webdriver.Chrome, provider: Provider, url: str, login: str) -> None:
    """Open the page, follow its sign-in link, log in on the provider's form, come back."""
    driver.get(url)
    WebDriverWait(driver, 20).until(lambda d: d.find_element(By.ID, "signin").is_displayed())
    driver.find_element(By.ID, "signin-link").click()
    WebDriverWait(driver, 20).until(lambda d: d.current_url.startswith(provider.issuer))
    driver.find_element(By.NAME, "login").send_keys(login)
    driver.find_element(By.NAME, "password").send_keys("any password: the dev form")
    driver.find_element(By.CSS_SELECTOR, "button[type=submit]").click()
    WebDriverWait(driver, 20).until(lambda d: d.find_element(By.ID, "who").is_displayed())
    assert driver.find_element(By.ID, "who-name").text == login


def settled(driver: webdriver.Chrome) -> bool:
    text = driver.find_element(By.ID, "status").text
    shown = driver.find_elements(By.CSS_SELECTOR, ".content")
    return (
        bool(shown and shown[0].is_displayed())
        or "Could not" in text
        or "pending" in text
        or "Nothing" in text
    )


async def test_approver_signs_in_approves_on_the_page_and_the_client_completes(
    provider: Provider, broker: Broker, chromium: webdriver.Chrome
) -> None:
    name = unique("signed-in")
    waiting = await propose(broker, name)
    sign_in(chromium, provider, waiting["approve_url"], "ann")
    assert (
        urllib.parse.urlsplit(chromium.current_url).query == f"id={waiting['approval_id']}"
    )  # back where she was

    # the session cookie: opaque, __Host-, HttpOnly (the page's script cannot read it), Strict
    cookie = chromium.get_cookie(SESSION_COOKIE)
    assert cookie is not None
    assert (cookie["httpOnly"], cookie["secure"], cookie["sameSite"], cookie["path"]) == (
        True,
        True,
        "Strict",
        "/",
    )
    assert "domain" not in cookie or cookie["domain"] == "127.0.0.1"
    assert SESSION_COOKIE not in chromium.execute_script("return document.cookie")

    WebDriverWait(chromium, 20).until(settled)
    card = chromium.find_element(By.CSS_SELECTOR, ".approval")
    assert card.find_element(By.CSS_SELECTOR, ".filename").text == name
    assert card.find_element(By.CSS_SELECTOR, ".content").get_attribute("textContent") == CONTENT
    card.find_element(By.CSS_SELECTOR, ".approve").click()
    WebDriverWait(chromium, 20).until(
        lambda _: card.find_element(By.CSS_SELECTOR, ".state").text == "approved"
    )

    async with open_mcp(broker, broker.token(subject="alice")) as client:
        result = structured(await client.call_tool("save_report", {"filename": name, "content": CONTENT}))
    assert result["status"] == "ok", result
    assert (broker.reports("acme") / name).read_text() == CONTENT
    decided = [e for e in broker.audit_events() if e["event"] == "approval.decided"
               and e.get("approval_id") == waiting["approval_id"]]  # fmt: skip
    assert [(e["subject"], e["issuer"], e["tenant"], e["decision"]) for e in decided] == [
        ("ann", provider.issuer, "acme", "approved")
    ]

    # signing out ends the broker's session and, RP-initiated, the provider's
    chromium.find_element(By.ID, "logout").click()
    WebDriverWait(chromium, 20).until(lambda d: d.current_url.startswith(provider.issuer))
    chromium.find_element(By.CSS_SELECTOR, "button[name=logout]").click()
    WebDriverWait(chromium, 20).until(lambda d: d.current_url.startswith(broker.url))
    WebDriverWait(chromium, 20).until(lambda d: d.find_element(By.ID, "signin").is_displayed())
    assert chromium.get_cookie(SESSION_COOKIE) is None
    assert [e["reason"] for e in broker.audit_events() if e["event"] == "web.signout"][-1:] == ["signed_out"]


async def test_approver_of_another_tenant_sees_nothing_and_cannot_approve(
    provider: Provider, broker: Broker, chromium: webdriver.Chrome
) -> None:
    name = unique("not-bobs")
    waiting = await propose(broker, name)
    sign_in(chromium, provider, waiting["approve_url"], "bob")  # globex's approver
    WebDriverWait(chromium, 20).until(settled)
    assert chromium.find_element(By.ID, "who-tenants").text == "globex"
    assert "not_found" in chromium.find_element(By.ID, "status").text
    assert chromium.find_elements(By.CSS_SELECTOR, ".approval") == []

    # his listing holds none of acme's; his own session and CSRF token cannot decide it either
    chromium.get(f"{broker.url}/approvals")
    WebDriverWait(chromium, 20).until(settled)
    assert name not in chromium.find_element(By.ID, "list").text
    answer = chromium.execute_async_script(
        """
        const [id, done] = arguments;
        const session = await (await fetch("/approvals/session")).json();
        const response = await fetch("/v1/approvals/" + id + "/approve",
                                     {method: "POST", headers: {"X-CSRF-Token": session.csrf}});
        done(JSON.stringify({status: response.status, body: await response.json()}));
        """,
        waiting["approval_id"],
    )
    assert json.loads(answer) == {"status": 404, "body": {"error": "not_found"}}
    async with open_mcp(broker, broker.token(subject="alice")) as client:
        result = structured(await client.call_tool("save_report", {"filename": name, "content": CONTENT}))
    assert result["status"] == "waiting_approval", result


async def test_the_page_shows_when_a_countdown_and_recent_decisions_and_a_denial_names_a_code(
    provider: Provider, broker: Broker, chromium: webdriver.Chrome
) -> None:
    name = unique("details")
    waiting = await propose(broker, name)
    sign_in(chromium, provider, waiting["approve_url"], "ann")
    WebDriverWait(chromium, 20).until(settled)
    card = chromium.find_element(By.CSS_SELECTOR, ".approval")
    assert card.find_element(By.CSS_SELECTOR, ".requester").text == "alice"
    assert card.find_element(By.CSS_SELECTOR, ".created").text
    expires = card.find_element(By.CSS_SELECTOR, ".expires")
    first = expires.text
    assert re.match(r"in 1[45]:\d\d \(", first), first  # DOCBROKER_APPROVAL_TTL: 900 s
    WebDriverWait(chromium, 10).until(lambda _: expires.text != first)  # it counts down

    Select(card.find_element(By.CSS_SELECTOR, ".reason")).select_by_value("hidden_characters")
    card.find_element(By.CSS_SELECTOR, ".deny").click()
    WebDriverWait(chromium, 20).until(lambda _: card.find_element(By.CSS_SELECTOR, ".state").text == "denied")
    decided = [e for e in broker.audit_events() if e["event"] == "approval.decided"
               and e.get("approval_id") == waiting["approval_id"]]  # fmt: skip
    assert [(e["decision"], e["decision_reason"], e["subject"]) for e in decided] == [
        ("denied", "hidden_characters", "ann")
    ]

    chromium.get(f"{broker.url}/approvals")
    WebDriverWait(chromium, 20).until(lambda d: d.find_element(By.ID, "recent").is_displayed())
    rows = [r.text for r in chromium.find_elements(By.CSS_SELECTOR, "#recent-rows tr")]
    assert any(name in row and "denied" in row and "ann" in row for row in rows), rows
