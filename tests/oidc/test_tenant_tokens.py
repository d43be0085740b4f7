"""Tenants' tokens from the real provider too (issue 26 items 5 and 2): the broker verifies
access tokens against the provider's `jwks_uri` and finds the tenant through the claims
mapping (a nested team claim); a tenant's service gets a token with client credentials and
uses it through a real MCP client; a person signed in at the same provider approves; and a
person's own MCP client works with the access token of their authorization-code sign-in."""

from __future__ import annotations

from collections.abc import Iterator

import httpx2
import pytest

from broker.testing import Broker, structured
from tests.broker.support import open_mcp, unique
from tests.oidc.support import Browser, Provider, person_token, provider_and_broker, service_token

pytestmark = pytest.mark.anyio


@pytest.fixture(scope="module")
def oidc(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Provider, Broker]]:
    # the tenant from a nested team claim through the mapping, as for signed-in approvers
    mapping = {
        "DOCBROKER_AUTH_TENANT_CLAIM": "org.teams",
        "DOCBROKER_AUTH_TENANT_MAP": "acme-team=acme,globex-team=globex",
    }
    with provider_and_broker(tmp_path_factory.mktemp("tenant-tokens"), tenant_tokens=True, **mapping) as pair:
        yield pair


async def test_a_service_saves_with_client_credentials_once_a_signed_in_approver_approves(
    provider: Provider, broker: Broker
) -> None:
    name, content = unique("service"), "from acme's service\n"
    token = await service_token(provider, "acme-service")
    async with open_mcp(broker, token) as client:
        found = structured(await client.call_tool("search_documents", {"query": "anything"}))
        assert found["status"] == "ok", found
        waiting = structured(await client.call_tool("save_report", {"filename": name, "content": content}))
    assert waiting["status"] == "waiting_approval", waiting

    ann = Browser(broker)
    assert ann.sign_in("ann").status_code == 303
    csrf = ann.session()["csrf"]
    assert ann.request("GET", f"/v1/approvals/{waiting['data']['approval_id']}").status_code == 200
    assert ann.post(f"/v1/approvals/{waiting['data']['approval_id']}/approve", csrf).status_code == 200

    async with open_mcp(broker, token) as client:
        saved = structured(await client.call_tool("save_report", {"filename": name, "content": content}))
    assert saved["status"] == "ok", saved
    assert (broker.reports("acme") / name).read_text() == content
    calls = [
        e for e in broker.audit_events() if e["event"] == "mcp.request" and e.get("tool") == "save_report"
    ]
    assert {(e["tenant"], e["subject"]) for e in calls[-2:]} == {("acme", "acme-service")}


async def test_the_providers_tokens_without_a_tenant_or_for_another_resource_are_refused(
    provider: Provider, broker: Broker
) -> None:
    for token in (
        await service_token(provider, "stray-service"),  # in a team no tenant maps
        await service_token(provider, "acme-service", resource="urn:another-api"),
    ):
        answer = httpx2.post(
            broker.mcp_url,
            headers={"authorization": f"Bearer {token}", "accept": "application/json, text/event-stream"},
            json={"jsonrpc": "2.0", "id": 1, "method": "ping"},
        )
        assert answer.status_code == 401 and "invalid_token" in answer.headers["www-authenticate"]
    reasons = [e["reason"] for e in broker.audit_events() if e["event"] == "auth.denied"]
    assert reasons[-2:] == ["bad_tenant", "bad_audience"]


async def test_a_person_signed_in_at_the_provider_uses_an_mcp_client_with_its_access_token(
    provider: Provider, broker: Broker
) -> None:
    # authorization code + PKCE for a public MCP client, the broker as the resource
    token = await person_token(provider, broker, "bob")
    async with open_mcp(broker, token) as client:
        found = structured(await client.call_tool("search_documents", {"query": "anything"}))
    assert found["status"] == "ok", found
    calls = [
        e
        for e in broker.audit_events()
        if e["event"] == "mcp.request" and e.get("tool") == "search_documents"
    ]
    assert (calls[-1]["tenant"], calls[-1]["subject"]) == ("globex", "bob")
