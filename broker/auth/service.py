"""The broker's one entry to identity: authenticate a request, answer refusals correctly.

Wraps `Authenticator` with the pieces every surface (the `/mcp` gateway, the approvals API)
needs alike: the raw header list → principal, the WWW-Authenticate challenge for an
`AuthError`, the RFC 9728 metadata, and key-source readiness.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from broker.auth.challenge import protected_resource_metadata, resource_metadata_url, www_authenticate
from broker.auth.errors import AuthError, insufficient_scope
from broker.auth.jwt import Authenticator, authorization_header
from broker.auth.keys import key_source
from broker.settings import AuthSettings
from broker.types import Principal, Scope


class AuthService:
    def __init__(
        self, settings: AuthSettings, *, known_tenant: Callable[[str], bool], public_url: str
    ) -> None:
        self._keys = key_source(settings)
        self._authenticator = Authenticator(settings, known_tenant, self._keys)
        self._metadata_url = resource_metadata_url(public_url)
        self._metadata = protected_resource_metadata(public_url, settings.issuer)

    async def authenticate(self, authorization: Sequence[str]) -> Principal:
        """The principal for the request's Authorization header values. Raises AuthError."""
        return await self._authenticator.authenticate(authorization_header(list(authorization)))

    async def approver(self, authorization: Sequence[str]) -> Principal:
        principal = await self.authenticate(authorization)
        if not principal.has(Scope.REPORTS_APPROVE):
            raise insufficient_scope(Scope.REPORTS_APPROVE)
        return principal

    def challenge(self, error: AuthError) -> dict[str, str]:
        value = www_authenticate(error, self._metadata_url)
        return {"www-authenticate": value} if value else {}

    def resource_metadata(self) -> dict[str, Any]:
        return self._metadata

    async def ready(self) -> bool:
        return await self._keys.ready()
