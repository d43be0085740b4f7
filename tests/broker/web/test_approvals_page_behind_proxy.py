"""The approvals page behind an authenticating proxy (issue 26 item 1), in a real browser.

An organisation may put its own authenticating reverse proxy in front of the broker: the proxy
signs the approver in and sets `Authorization: Bearer <their token>` on what it forwards. The
page must then work with its token field empty, and must send no `Authorization` of its own —
many proxies set the header only when the request has none, so an empty `Bearer ` from the page
would be the one the broker sees. The proxy here (`forwarding_proxy.py`, on 127.0.0.2) is such
a one: it keeps a client's header and counts it.

Without the proxy, the same page with the same empty field gets nothing: the identity is the
proxy's, not the browser's.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from selenium import webdriver
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webelement import WebElement
from selenium.webdriver.support.ui import WebDriverWait

from broker.testing import Broker, make_broker, structured
from tests.broker.forwarding_proxy import ForwardingProxy
from tests.broker.support import APPROVER_SCOPE, UNLIMITED, open_http, open_mcp, unique, write_policies

pytestmark = pytest.mark.anyio

PROXY = "127.0.0.2"
CONTENT = "Quarterly numbers: 1234 9876\n"


@pytest.fixture
def proxied(tmp_path: Path) -> Iterator[tuple[Broker, ForwardingProxy]]:
    """A broker whose public address is the proxy's (so the page's POSTs carry the origin the
    broker expects), and the proxy in front of it signing every request in as approver carol."""
    broker = make_broker(tmp_path)
    write_policies(broker, {"acme": UNLIMITED})
    upstream = ("127.0.0.1", int(broker.url.rsplit(":", 1)[1]))
    approver = broker.token(subject="carol", scope=APPROVER_SCOPE)
    with ForwardingProxy(PROXY, upstream, authorization=f"Bearer {approver}") as proxy:
        broker.env["DOCBROKER_PUBLIC_URL"] = proxy.url
        broker.start()
        try:
            yield broker, proxy
        finally:
            broker.stop()


def load_empty(driver: webdriver.Chrome, base: str) -> str:
    """Opens the page at `base` and loads with the token field left empty; the status line."""
    driver.get(f"{base}/approvals")
    field = driver.find_element(By.ID, "token")
    assert field.is_displayed() and field.get_attribute("value") == ""
    driver.find_element(By.ID, "load").click()

    def settled(d: webdriver.Chrome) -> str | None:
        text = str(d.find_element(By.ID, "status").text)
        return text if text and text != "Loading…" else None

    return str(WebDriverWait(driver, 30).until(settled))


def cards(driver: webdriver.Chrome) -> dict[str, WebElement]:
    return {
        c.find_element(By.CSS_SELECTOR, ".filename").text: c
        for c in driver.find_elements(By.CSS_SELECTOR, ".approval")
    }


async def test_page_behind_an_authenticating_proxy_approves_with_an_empty_token_field(
    proxied: tuple[Broker, ForwardingProxy], chromium: webdriver.Chrome
) -> None:
    broker, proxy = proxied
    name = unique("proxied")
    async with open_mcp(broker, broker.token(subject="alice")) as client:
        result = structured(await client.call_tool("save_report", {"filename": name, "content": CONTENT}))
    assert result["status"] == "waiting_approval", result
    approval_id = str(result["data"]["approval_id"])

    # straight to the broker, the empty field is no one: refused, nothing listed
    assert load_empty(chromium, broker.url) == "Could not load: unauthorized"
    assert cards(chromium) == {}
    assert proxy.forwarded == 0

    # through the proxy, the same empty field is the approver the proxy signed in
    status = load_empty(chromium, proxy.url)
    assert status.endswith("pending"), status
    card = cards(chromium)[name]
    card.find_element(By.CSS_SELECTOR, ".reveal").click()
    content = card.find_element(By.CSS_SELECTOR, ".content")
    WebDriverWait(chromium, 20).until(lambda _: content.is_displayed())
    assert content.get_attribute("textContent") == CONTENT
    card.find_element(By.CSS_SELECTOR, ".approve").click()
    WebDriverWait(chromium, 20).until(
        lambda _: card.find_element(By.CSS_SELECTOR, ".state").text == "approved"
    )
    assert chromium.find_element(By.ID, "status").text == "Recorded: approved"

    # the page sent no Authorization of its own: every request was signed in by the proxy
    assert proxy.client_authorized == 0 < proxy.injected

    # the decision is the proxy's approver's, and the client's save completes
    with open_http(broker, broker.token(subject="carol", scope=APPROVER_SCOPE)) as http:
        decided = http.get(f"/v1/approvals/{approval_id}").json()
    assert (decided["state"], decided["decided_by"]) == ("approved", "carol"), decided
    async with open_mcp(broker, broker.token(subject="alice")) as client:
        result = structured(await client.call_tool("save_report", {"filename": name, "content": CONTENT}))
    assert result["status"] == "ok", result
    assert (broker.reports("acme") / name).read_text() == CONTENT
