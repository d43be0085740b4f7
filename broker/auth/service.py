"""The broker's one entry to identity: authenticate a request, answer refusals correctly.

Wraps `Authenticator` with the pieces every surface (the `/mcp` gateway, the approvals API)
needs alike: the raw header list → principal, the WWW-Authenticate challenge for an
`AuthError`, the RFC 9728 metadata, and key-source readiness.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from broker.auth.challenge import protected_resource_metadata, resource_metadata_url, www_authenticate
from broker.auth.errors import AuthError, AuthReason, insufficient_scope
from broker.auth.jwt import Authenticator, authorization_header
from broker.auth.keys import key_source
from broker.auth.preauth import PreAuthLimiter
from broker.settings import AuthSettings, PreAuthSettings
from broker.types import OAuthScope, Principal


class AuthService:
    def __init__(
        self,
        settings: AuthSettings,
        *,
        known_tenant: Callable[[str], bool],
        public_url: str,
        preauth: PreAuthLimiter | None = None,
    ) -> None:
        self._keys = key_source(settings)
        self._authenticator = Authenticator(settings, known_tenant, self._keys)
        self._metadata_url = resource_metadata_url(public_url)
        self._metadata = protected_resource_metadata(public_url, settings.issuer)
        self.preauth = preauth if preauth is not None else PreAuthLimiter(PreAuthSettings())

    async def authenticate(self, authorization: Sequence[str], address: str = "") -> Principal:
        """The principal for the request's Authorization header values. Raises AuthError.

        `address` is the client's (`preauth.client_address`). A token that verifies is served
        whatever the address did before; from an address that failed too often, a token that
        does not gets a 429 AuthError instead of its own reason (counted, never audited alone,
        and not charged again). A refusal the limiter counts for its interval line has
        `counted` set."""
        wait = self.preauth.retry_after(address)
        try:
            return await self._authenticator.authenticate(authorization_header(list(authorization)))
        except AuthError as exc:
            # The identity provider's keys being unavailable is not the client's doing.
            charge = exc.reason is not AuthReason.KEYS_UNAVAILABLE
            if wait and charge:
                self.preauth.limited()
                error = AuthError.of(AuthReason.PREAUTH_LIMITED)
                error.retry_after, error.counted = wait, True
                raise error from None
            exc.counted = not self.preauth.failed(address, exc.reason.value, charge=charge)
            raise

    async def approver(self, authorization: Sequence[str], address: str = "") -> Principal:
        principal = await self.authenticate(authorization, address)
        if not principal.has(OAuthScope.REPORTS_APPROVE):
            raise insufficient_scope(OAuthScope.REPORTS_APPROVE)
        return principal

    def challenge(self, error: AuthError) -> dict[str, str]:
        """The headers of a refusal: the WWW-Authenticate challenge, or a 429's Retry-After."""
        if error.retry_after:
            return {"retry-after": str(error.retry_after)}
        value = www_authenticate(error, self._metadata_url)
        return {"www-authenticate": value} if value else {}

    def resource_metadata(self) -> dict[str, Any]:
        return self._metadata

    async def ready(self) -> bool:
        return await self._keys.ready()
