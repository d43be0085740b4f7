"""Who may approve what, from the provider's claims (issue 26 item 2), for signed-in approvers:
only the mapped tenants, the distinct-approver rule still holds, and every decision's audit
event names the approver's subject and issuer."""

from __future__ import annotations

import httpx2
import pytest

from broker.testing import Broker
from tests.oidc.support import Browser, Provider, pending_approval, state_of

pytestmark = pytest.mark.anyio


def signed_in(broker: Broker, login: str) -> tuple[Browser, dict[str, object]]:
    browser = Browser(broker)
    assert browser.sign_in(login).status_code == 303
    return browser, browser.session()


async def test_an_approver_acts_only_for_the_tenants_the_claims_map(broker: Broker) -> None:
    acme_id = await pending_approval(broker, "acme")
    globex_id = await pending_approval(broker, "globex")
    bob, session = signed_in(broker, "bob")
    assert session["tenants"] == ["globex"]
    listed = bob.request("GET", "/v1/approvals").json()["approvals"]
    assert globex_id in {a["approval_id"] for a in listed} and acme_id not in {
        a["approval_id"] for a in listed
    }
    assert bob.request("GET", "/v1/approvals?tenant=acme").status_code == 403
    assert bob.request("GET", f"/v1/approvals/{acme_id}").status_code == 404
    assert bob.post(f"/v1/approvals/{acme_id}/approve", str(session["csrf"])).status_code == 404
    assert state_of(broker, acme_id, "acme") == "pending"
    assert bob.post(f"/v1/approvals/{globex_id}/deny", str(session["csrf"])).status_code == 200


async def test_a_person_mapped_to_several_tenants_names_one_per_listing_and_decides_in_each(
    broker: Broker,
) -> None:
    alice, session = signed_in(broker, "alice")  # acme's and strict's approver
    assert session["tenants"] == ["acme", "strict"]
    assert alice.request("GET", "/v1/approvals").status_code == 403  # which tenant's listing?
    acme_id = await pending_approval(broker, "acme", subject="dave")
    listed = alice.request("GET", "/v1/approvals?tenant=acme").json()["approvals"]
    assert acme_id in {a["approval_id"] for a in listed}
    assert alice.request("GET", f"/v1/approvals/{acme_id}").status_code == 200  # read first
    assert alice.post(f"/v1/approvals/{acme_id}/approve", str(session["csrf"])).status_code == 200


async def test_the_distinct_approver_rule_holds_for_signed_in_approvers(
    broker: Broker, provider: Provider
) -> None:
    # "alice" of the tenants' tokens (the broker's dev key) and "alice" signed in at the provider
    # are two people (issue 34): the rule refuses a person their own report, which
    # tests/oidc/test_people.py shows with a token and a sign-in of one provider.
    namesake = await pending_approval(broker, "strict", subject="alice")
    alice, session = signed_in(broker, "alice")
    assert alice.request("GET", f"/v1/approvals/{namesake}").status_code == 200
    assert alice.post(f"/v1/approvals/{namesake}/approve", str(session["csrf"])).status_code == 200
    assert state_of(broker, namesake, "strict") == "approved"

    other = await pending_approval(broker, "strict", subject="dave")
    assert alice.request("GET", f"/v1/approvals/{other}").status_code == 200  # read first
    assert alice.post(f"/v1/approvals/{other}/approve", str(session["csrf"])).status_code == 200
    decided = [
        e for e in broker.audit_events() if e["event"] == "approval.decided" and e.get("approval_id") == other
    ]
    assert [(e["subject"], e["issuer"], e["tenant"], e["outcome"]) for e in decided] == [
        ("alice", provider.issuer, "strict", "ok")
    ]
    # and a decision by bearer token names the issuer of the tenants' tokens
    operator = broker.token(tenant="strict", subject="erin", scope="reports:approve")
    third = await pending_approval(broker, "strict", subject="dave")
    answer = httpx2.post(
        f"{broker.url}/v1/approvals/{third}/deny", headers={"authorization": f"Bearer {operator}"}
    )
    assert answer.status_code == 200
    by_token = [
        e for e in broker.audit_events() if e["event"] == "approval.decided" and e.get("approval_id") == third
    ]
    assert [(e["subject"], e["issuer"]) for e in by_token] == [("erin", broker.env["DOCBROKER_AUTH_ISSUER"])]
