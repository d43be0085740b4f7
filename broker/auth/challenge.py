"""What a refused client is told: the WWW-Authenticate challenge and RFC 9728 metadata.

The challenge names the error class and where to find the authorization server, never which
check failed (that is the audit log's business). RFC 9728 metadata is built with the `mcp`
SDK's `ProtectedResourceMetadata` model so it matches what MCP clients parse.
"""

from __future__ import annotations

from typing import Any

from mcp.server.auth.routes import build_resource_metadata_url
from mcp.shared.auth import ProtectedResourceMetadata
from pydantic import AnyHttpUrl, ValidationError

from broker.auth.errors import AuthError, AuthReason
from broker.settings import PREFIX, SettingsError
from broker.types import OAuthScope

MCP_PATH = "/mcp"


def resource_url(public_url: str) -> str:
    """The protected resource: the broker's MCP endpoint."""
    return public_url.rstrip("/") + MCP_PATH


def resource_metadata_url(public_url: str) -> str:
    """Where RFC 9728 §3.1 puts the metadata: /.well-known/oauth-protected-resource/mcp."""
    return str(build_resource_metadata_url(_url(resource_url(public_url), "PUBLIC_URL")))


def metadata_path(public_url: str) -> str:
    """The path to route the metadata at (a public URL with a path prefix moves it)."""
    url = resource_metadata_url(public_url)
    return url[url.index("/.well-known/") :]


def protected_resource_metadata(public_url: str, issuer: str) -> dict[str, Any]:
    """The JSON document served at `metadata_path(public_url)`."""
    metadata = ProtectedResourceMetadata(
        resource=_url(resource_url(public_url), "PUBLIC_URL"),
        authorization_servers=[_url(issuer, "AUTH_ISSUER")],
        scopes_supported=[scope.value for scope in OAuthScope],
        bearer_methods_supported=["header"],
    )
    document = metadata.model_dump(mode="json", exclude_none=True)
    # Clients compare issuer identifiers as exact strings (RFC 8414 §3.3); URL normalisation
    # (host case, default port) must not change the one we publish.
    document["authorization_servers"] = [issuer]
    return document


def www_authenticate(error: AuthError, resource_metadata: str) -> str | None:
    """The WWW-Authenticate value for `error`, or None when a new token would not help.

    401 → invalid_token; 403 insufficient_scope → the scopes to ask for. A 403 for an unknown
    tenant and a 503 carry no challenge: re-authenticating cannot fix either.
    """
    meta = f'resource_metadata="{_quoted(resource_metadata)}"'
    if error.status == 401:
        return f'Bearer error="invalid_token", {meta}'
    if error.reason is AuthReason.INSUFFICIENT_SCOPE:
        scope = " ".join(sorted(s.value for s in error.required_scopes))
        scope_param = f'scope="{scope}", ' if scope else ""
        return f'Bearer error="insufficient_scope", {scope_param}{meta}'
    return None


def _url(value: str, variable: str) -> AnyHttpUrl:
    try:
        return AnyHttpUrl(value)
    except ValidationError:
        raise SettingsError(f"{PREFIX}{variable} must be an http(s) URL") from None


def _quoted(value: str) -> str:
    # A quoted-string (RFC 9110 §5.6.4); CR/LF or other controls would split the header.
    if any(ord(c) < 0x20 or ord(c) == 0x7F for c in value):
        raise ValueError("header parameter holds control characters")
    return value.replace("\\", "\\\\").replace('"', '\\"')
