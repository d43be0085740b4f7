"""WWW-Authenticate values and the RFC 9728 protected resource metadata."""

from __future__ import annotations

import pytest

from broker.auth import (
    AuthError,
    AuthReason,
    insufficient_scope,
    metadata_path,
    protected_resource_metadata,
    resource_metadata_url,
    resource_url,
    www_authenticate,
)
from broker.auth.errors import STATUS
from broker.settings import SettingsError
from broker.types import OAuthScope

META = "https://broker.example.com/.well-known/oauth-protected-resource/mcp"


@pytest.mark.parametrize("reason", [r for r in AuthReason if STATUS[r] == 401])
def test_every_401_is_invalid_token_without_the_reason(reason: AuthReason) -> None:
    value = www_authenticate(AuthError.of(reason), META)
    assert value == f'Bearer error="invalid_token", resource_metadata="{META}"'


def test_insufficient_scope_names_the_scopes_to_ask_for() -> None:
    value = www_authenticate(insufficient_scope(OAuthScope.REPORTS_APPROVE, OAuthScope.DOCS_READ), META)
    assert value == (
        f'Bearer error="insufficient_scope", scope="docs:read reports:approve", resource_metadata="{META}"'
    )
    bare = www_authenticate(AuthError(403, "insufficient_scope"), META)
    assert bare == f'Bearer error="insufficient_scope", resource_metadata="{META}"'


@pytest.mark.parametrize("reason", [AuthReason.UNKNOWN_TENANT, AuthReason.KEYS_UNAVAILABLE])
def test_no_challenge_where_a_new_token_cannot_help(reason: AuthReason) -> None:
    assert www_authenticate(AuthError.of(reason), META) is None


def test_challenge_parameters_cannot_split_the_header() -> None:
    assert 'resource_metadata="https://x/\\"a\\\\"' in (
        www_authenticate(AuthError.of(AuthReason.EXPIRED), 'https://x/"a\\') or ""
    )
    with pytest.raises(ValueError):
        www_authenticate(AuthError.of(AuthReason.EXPIRED), "https://x/\r\nSet-Cookie: a=b")


def test_auth_error_accepts_only_fixed_reasons() -> None:
    with pytest.raises(ValueError):
        AuthError(401, "token eyJhbGciOi was bad")
    err = AuthError.of(AuthReason.BAD_SIGNATURE)
    assert (err.status, str(err), repr(err)) == (
        401,
        "401 bad_signature",
        "AuthError(status=401, reason='bad_signature')",
    )
    assert {STATUS[r] for r in AuthReason} == {401, 403, 429, 503}  # 429: the pre-auth limit


def test_protected_resource_metadata() -> None:
    doc = protected_resource_metadata("https://broker.example.com/", "https://idp.example.com/realms/docs")
    assert doc == {
        "resource": "https://broker.example.com/mcp",
        "authorization_servers": ["https://idp.example.com/realms/docs"],
        "scopes_supported": ["docs:read", "docs:write", "reports:approve"],
        "bearer_methods_supported": ["header"],
    }
    assert resource_metadata_url("https://broker.example.com") == META
    assert metadata_path("https://broker.example.com") == "/.well-known/oauth-protected-resource/mcp"


def test_metadata_under_a_path_prefix_follows_rfc_9728() -> None:
    public = "https://gw.example.com/docbroker"
    assert resource_url(public) == "https://gw.example.com/docbroker/mcp"
    assert metadata_path(public) == "/.well-known/oauth-protected-resource/docbroker/mcp"


def test_issuer_is_published_exactly_as_configured() -> None:
    issuer = "https://IdP.Example.com:443/realms/Docs/"
    doc = protected_resource_metadata("https://broker.example.com", issuer)
    assert doc["authorization_servers"] == [issuer]


@pytest.mark.parametrize(
    ("public_url", "issuer"), [("broker", "https://idp.example.com"), ("https://b.example", "dev")]
)
def test_non_url_settings_are_refused(public_url: str, issuer: str) -> None:
    with pytest.raises(SettingsError):
        protected_resource_metadata(public_url, issuer)
