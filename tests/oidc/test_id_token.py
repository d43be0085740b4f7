"""The id_token must be for docbroker, from the configured issuer, for this sign-in (issue 26
item 6): real token responses from real providers, checked by the broker's relying party
(broker/web/oidc.py). A token endpoint that hands back another application's id_token, or
one from another provider, signs nobody in."""

from __future__ import annotations

import secrets
import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from authlib.integrations.httpx_client import AsyncOAuth2Client

from broker.settings import OidcSettings
from broker.testing import Broker
from broker.web.oidc import OidcProvider, SignInFailed
from tests.oidc.support import Browser, Provider, start_provider

pytestmark = pytest.mark.anyio


@pytest.fixture(scope="module")
def other_provider(tmp_path_factory: pytest.TempPathFactory, broker: Broker) -> Iterator[Provider]:
    """Another organisation's provider, where the same client id is registered too."""
    other = start_provider(tmp_path_factory.mktemp("other-idp"), [broker.url])
    try:
        yield other
    finally:
        other.stop()


async def token_response(provider: Provider, broker: Broker, client_id: str, nonce: str) -> dict[str, Any]:
    """A real code flow at `provider` for `client_id`, as another relying party would run it."""
    redirect = f"{broker.url}/approvals/callback"
    async with AsyncOAuth2Client(
        client_id, provider.secret, scope="openid groups", redirect_uri=redirect, code_challenge_method="S256"
    ) as client:
        verifier = secrets.token_urlsafe(48)
        url, _ = client.create_authorization_url(
            f"{provider.issuer}/auth", nonce=nonce, code_verifier=verifier
        )
        browser = Browser(broker)
        try:
            callback = browser.authenticate(url, "ann")
        finally:
            browser.close()
        code = dict(urllib.parse.parse_qsl(urllib.parse.urlsplit(callback).query))["code"]
        token: dict[str, Any] = await client.fetch_token(
            f"{provider.issuer}/token", code=code, code_verifier=verifier
        )
        return token


def relying_party(provider: Provider, tmp_path: Path) -> OidcProvider:
    secret = tmp_path / "secret"
    secret.write_text(provider.secret)
    secret.chmod(0o600)
    settings = OidcSettings(issuer=provider.issuer, client_id="docbroker", client_secret_file=secret)
    return OidcProvider(settings, redirect_uri="unused", post_logout_uri="unused")


async def test_only_an_id_token_for_docbroker_from_its_issuer_and_this_sign_in_is_accepted(
    provider: Provider, other_provider: Provider, broker: Broker, tmp_path: Path
) -> None:
    rp = relying_party(provider, tmp_path)
    ours = await token_response(provider, broker, "docbroker", "nonce-1")
    identity = await rp.verify(ours, "nonce-1")  # the control: the real thing passes
    assert (identity.issuer, identity.subject) == (provider.issuer, "ann")
    assert "acme-approvers" in identity.claims["groups"]

    refused = {
        "another audience": (await token_response(provider, broker, "other-app", "nonce-2"), "nonce-2"),
        "another issuer": (await token_response(other_provider, broker, "docbroker", "nonce-3"), "nonce-3"),
        "another sign-in's nonce": (ours, "nonce-of-another-sign-in"),
        "no id_token": ({"access_token": ours["access_token"], "token_type": "Bearer"}, "nonce-1"),
    }
    for case, (token, nonce) in refused.items():
        with pytest.raises(SignInFailed) as failed:
            await rp.verify(token, nonce)
        assert failed.value.reason in ("bad_id_token", "no_id_token"), case
