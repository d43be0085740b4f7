"""One person, whichever way they come in; two people, whoever gave them their ids (issue 34
items 1 and 2), with the real provider.

- The same provider for tokens and sign-ins, its id_tokens naming people by a pairwise `sub`
  (as Entra ID's do), the person named by `oid` on both sides (DOCBROKER_AUTH_PERSON_CLAIM,
  DOCBROKER_OIDC_PERSON_CLAIM): ann's own report is refused to ann on the page, and ann's yes
  by bearer token and ann's yes on the page are one yes.
- The tenants' tokens from another issuer (the broker's dev key) than the sign-ins: "bob" of
  one and "bob" of the other are two people, two yeses.
- The shipped `legal-approves-acme` example through the page: the id_token's groups ride in
  the session, so a legal member approves and a non-member of legal is refused.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx2
import pytest
from selenium import webdriver
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait

from broker.testing import Broker, structured
from tests.broker.support import open_mcp, unique
from tests.oidc.support import (
    Browser,
    Provider,
    pending_approval,
    person_token,
    provider_and_broker,
    service_token,
    state_of,
)
from tests.oidc.test_signin_browser import settled, sign_in

pytestmark = pytest.mark.anyio
ROOT = Path(__file__).resolve().parents[2]
TWO_APPROVERS = """
@id("tests.{tenant}.two_approvers")
@approvers("2")
permit (principal, action == Docbroker::Action::"approve", resource in Docbroker::Tenant::"{tenant}");
"""


@pytest.fixture(scope="module")
def same_idp(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Provider, Broker]]:
    settings = {
        "DOCBROKER_AUTH_TENANT_CLAIM": "org.teams",
        "DOCBROKER_AUTH_TENANT_MAP": "acme-team=acme,globex-team=globex",
        "DOCBROKER_AUTH_PERSON_CLAIM": "oid",
        "DOCBROKER_OIDC_PERSON_CLAIM": "oid",
        "DOCBROKER_APPROVAL_REQUIRE_DISTINCT_APPROVER": "true",
    }
    with provider_and_broker(
        tmp_path_factory.mktemp("people-same"), tenant_tokens=True, pairwise=True,
        cedar={"two.cedar": TWO_APPROVERS.format(tenant="acme")}, **settings,
    ) as pair:  # fmt: skip
        yield pair


@pytest.fixture(scope="module")
def two_idps(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Provider, Broker]]:
    legal = (ROOT / "policies/examples/legal-approves-acme.cedar").read_text()
    cedar = {"two.cedar": TWO_APPROVERS.format(tenant="globex"), "legal-approves-acme.cedar": legal}
    with provider_and_broker(tmp_path_factory.mktemp("people-two"), cedar=cedar) as pair:
        yield pair


def signed_in(broker: Broker, login: str) -> tuple[Browser, str]:
    browser = Browser(broker)
    assert browser.sign_in(login).status_code == 303
    return browser, str(browser.session()["csrf"])


def decide_on_page(browser: Browser, csrf: str, approval_id: str) -> httpx2.Response:
    """As the page does: the content is fetched (and read), then approved."""
    assert browser.request("GET", f"/v1/approvals/{approval_id}").status_code == 200
    return browser.post(f"/v1/approvals/{approval_id}/approve", csrf)


def decide_by_token(broker: Broker, token: str, approval_id: str) -> httpx2.Response:
    headers = {"authorization": f"Bearer {token}"}
    assert httpx2.get(f"{broker.url}/v1/approvals/{approval_id}", headers=headers).status_code == 200
    return httpx2.post(f"{broker.url}/v1/approvals/{approval_id}/approve", headers=headers)


async def save(broker: Broker, token: str) -> str:
    async with open_mcp(broker, token) as client:
        result = structured(
            await client.call_tool("save_report", {"filename": unique("people"), "content": "n\n"})
        )
    assert result["status"] == "waiting_approval", result
    return str(result["data"]["approval_id"])


async def test_a_persons_token_and_sign_in_are_one_person(same_idp: tuple[Provider, Broker]) -> None:
    provider, broker = same_idp
    ann_token = await person_token(provider, broker, "ann", "docs:read docs:write reports:approve")
    ann, csrf = signed_in(broker, "ann")
    assert ann.session()["subject"] == "ann"  # the id_token's `sub` is pairwise; its `oid` is ann

    # Her own report: refused to her on the page, though the page's `sub` is not her token's.
    own = await save(broker, ann_token)
    refused = decide_on_page(ann, csrf, own)
    assert (refused.status_code, refused.json()) == (403, {"error": "approver_is_requester"})

    # A service's report needing two approvers: ann's yes by token and on the page are one yes.
    service = await save(broker, await service_token(provider, "acme-service"))
    first = decide_by_token(broker, ann_token, service)
    assert first.status_code == 200 and (first.json()["approvals"], first.json()["state"]) == (1, "pending")
    again = decide_on_page(ann, csrf, service)
    assert (again.status_code, again.json()) == (409, {"error": "already_decided"})
    lena, lena_csrf = signed_in(broker, "lena")
    second = decide_on_page(lena, lena_csrf, service)
    assert second.status_code == 200 and (second.json()["approvals"], second.json()["state"]) == (
        2,
        "approved",
    )
    decided = [
        (e["subject"], e["issuer"])
        for e in broker.audit_events()
        if e["event"] == "approval.decided" and e.get("approval_id") == service and e["outcome"] == "ok"
    ]
    assert decided == [("ann", provider.issuer), ("lena", provider.issuer)]


async def test_one_id_at_two_issuers_is_two_people(two_idps: tuple[Provider, Broker]) -> None:
    provider, broker = two_idps
    approval_id = await pending_approval(broker, "globex", subject="dave")
    # "bob" of the tenants' token issuer, then "bob" signed in at the provider: two people.
    by_token = decide_by_token(broker, broker.token(tenant="globex", subject="bob", scope="reports:approve"),
                               approval_id)  # fmt: skip
    assert by_token.status_code == 200 and by_token.json()["state"] == "pending"
    bob, csrf = signed_in(broker, "bob")
    on_page = decide_on_page(bob, csrf, approval_id)
    assert on_page.status_code == 200, on_page.text  # was: 409 already_decided
    assert (on_page.json()["approvals"], on_page.json()["state"]) == (2, "approved")
    issuers = {
        e["issuer"]
        for e in broker.audit_events()
        if e["event"] == "approval.decided" and e.get("approval_id") == approval_id
    }
    assert issuers == {broker.env["DOCBROKER_AUTH_ISSUER"], provider.issuer}


async def test_the_shipped_legal_example_holds_on_the_page(two_idps: tuple[Provider, Broker]) -> None:
    _, broker = two_idps
    approval_id = await pending_approval(broker, "acme", subject="dave")
    ann, ann_csrf = signed_in(broker, "ann")  # acme's approver, not in legal
    refused = decide_on_page(ann, ann_csrf, approval_id)
    assert (refused.status_code, refused.json()) == (403, {"error": "forbidden"})
    denied = [
        e
        for e in broker.audit_events()
        if e["event"] == "approval.decided" and e.get("approval_id") == approval_id
    ]
    assert denied[-1]["policy_ids"] == ["examples.acme.legal_approves"]
    lena, lena_csrf = signed_in(broker, "lena")  # acme's approver, in legal
    approved = decide_on_page(lena, lena_csrf, approval_id)
    assert approved.status_code == 200 and approved.json()["state"] == "approved", approved.text
    assert lena.session()["groups"] == ["acme-approvers", "docbroker-approvers", "legal"]


@pytest.mark.parametrize(
    ("login", "shown"), [("ann", "Not recorded: forbidden"), ("lena", "Recorded: approved")]
)
async def test_the_shipped_legal_example_in_a_real_browser(
    two_idps: tuple[Provider, Broker], chromium: webdriver.Chrome, login: str, shown: str
) -> None:
    """The same, as a person does it: sign in on the provider's form in Chromium, read the
    report on the page, press Approve. Only the legal member's yes is recorded."""
    provider, broker = two_idps
    approval_id = await pending_approval(broker, "acme", subject="dave")
    sign_in(chromium, provider, f"{broker.url}/approvals?id={approval_id}", login)
    WebDriverWait(chromium, 20).until(settled)
    chromium.find_element(By.CSS_SELECTOR, ".approval .approve").click()
    WebDriverWait(chromium, 20).until(lambda d: d.find_element(By.ID, "status").text == shown)
    assert state_of(broker, approval_id) == ("approved" if login == "lena" else "pending")
