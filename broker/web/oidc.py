"""The broker as an OpenID Connect relying party, through authlib (DESIGN §12).

Authorization code flow with PKCE (S256), `state` and `nonce`; the provider found by
discovery from the configured issuer. authlib does the protocol (the authorization URL, the
code exchange with client authentication, the id_token's signature against the provider's
JWKS and its claims); this module adds what authlib leaves to its caller:

- discovery's `issuer` must be exactly the configured one (OpenID Connect Discovery §4.3),
  or anyone who can answer at that URL could name another issuer's keys;
- the id_token's `aud` must hold our client id and `iss` be the issuer (authlib checks them
  only when told to), within 30 s of leeway;
- only asymmetric signatures, whatever the provider advertises (never `none`, never HS*
  with the client secret as key);
- `sub` is printable and bounded, as bearer tokens' are (it is audited and shown).

Every failure is `SignInFailed` with a fixed reason code: provider messages never reach a
log, an audit line or the browser.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import httpx2
from authlib.integrations.base_client import OAuthError
from authlib.integrations.starlette_client import OAuth

from broker.files import UnsafeFileError, read_secret
from broker.settings import PREFIX, OidcSettings, SettingsError

DISCOVERY = "/.well-known/openid-configuration"
SIGNING_ALGORITHMS = ("RS256", "PS256", "ES256", "EdDSA")
LEEWAY_SECONDS = 30
MAX_SUBJECT_CHARS = 256
MAX_SECRET_BYTES = 4096


class SignInFailed(Exception):
    """A sign-in that cannot complete; `reason` is a fixed code, safe to audit and show."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True)
class Identity:
    issuer: str
    subject: str
    claims: dict[str, Any]  # the verified id_token's, for the tenant mapping


def load_client_secret(settings: OidcSettings) -> str | None:
    if settings.client_secret_file is None:
        return None
    try:
        secret = read_secret(settings.client_secret_file, MAX_SECRET_BYTES)
    except UnsafeFileError as exc:  # the reason names no content: safe in the one line
        raise SettingsError(f"{PREFIX}OIDC_CLIENT_SECRET_FILE {exc.reason}") from None
    if not secret:
        raise SettingsError(f"{PREFIX}OIDC_CLIENT_SECRET_FILE is empty")
    return secret


class OidcProvider:
    def __init__(self, settings: OidcSettings, *, redirect_uri: str, post_logout_uri: str) -> None:
        self._settings = settings
        self._redirect_uri = redirect_uri
        self._post_logout_uri = post_logout_uri
        secret = load_client_secret(settings)
        self._client = OAuth().register(
            name="docbroker",
            client_id=settings.client_id,
            client_secret=secret,
            server_metadata_url=settings.issuer.rstrip("/") + DISCOVERY,
            client_kwargs={
                "scope": settings.scopes,
                "code_challenge_method": "S256",
                "token_endpoint_auth_method": "client_secret_basic" if secret else "none",
                "timeout": settings.fetch_timeout_seconds,
            },
        )
        self._checked = False

    async def _metadata(self) -> dict[str, Any]:
        try:
            metadata: dict[str, Any] = await self._client.load_server_metadata()
        except (httpx2.HTTPError, ValueError):
            raise SignInFailed("provider_unavailable") from None
        if not self._checked:
            if metadata.get("issuer") != self._settings.issuer:
                self._client.server_metadata.clear()  # asked again next time, never trusted
                raise SignInFailed("provider_issuer_mismatch")
            offered = metadata.get("id_token_signing_alg_values_supported") or ["RS256"]
            # authlib verifies with what discovery offers: never `none` or a shared secret.
            metadata["id_token_signing_alg_values_supported"] = [
                a for a in offered if a in SIGNING_ALGORITHMS
            ]
            self._checked = True
        return metadata

    async def authorization_url(self, *, state: str, nonce: str, verifier: str) -> str:
        await self._metadata()
        found = await self._client.create_authorization_url(
            self._redirect_uri, state=state, nonce=nonce, code_verifier=verifier
        )
        return str(found["url"])

    async def redeem(self, *, code: str, verifier: str, nonce: str) -> Identity:
        """The person the code proves: exchanged once at the token endpoint (with the PKCE
        verifier), the id_token verified. Raises SignInFailed."""
        await self._metadata()
        try:
            token = await self._client.fetch_access_token(
                redirect_uri=self._redirect_uri, code=code, code_verifier=verifier
            )
        except OAuthError:
            raise SignInFailed("code_refused") from None  # replayed, expired, or not ours
        except (httpx2.HTTPError, ValueError):
            raise SignInFailed("provider_unavailable") from None
        return await self.verify(token, nonce)

    async def verify(self, token: Any, nonce: str) -> Identity:
        """The person a token response's id_token names, if it is for us, from our issuer, for
        this sign-in (`nonce`), signed with the provider's key. Raises SignInFailed."""
        if not isinstance(token, dict) or not isinstance(token.get("id_token"), str):
            raise SignInFailed("no_id_token")
        await self._metadata()
        options = {
            "iss": {"essential": True, "value": self._settings.issuer},
            "aud": {"essential": True, "value": self._settings.client_id},
            "sub": {"essential": True},
            "nonce": {"essential": True},
        }
        try:
            claims = await self._client.parse_id_token(
                token, nonce, claims_options=options, leeway=LEEWAY_SECONDS
            )
        except (httpx2.HTTPError, RuntimeError):
            raise SignInFailed("provider_unavailable") from None
        except Exception:  # signature, algorithm, iss, aud, azp, exp, nonce, at_hash: all one answer
            raise SignInFailed("bad_id_token") from None
        subject = claims.get("sub") if claims else None
        if not isinstance(subject, str) or not subject or len(subject) > MAX_SUBJECT_CHARS:
            raise SignInFailed("bad_subject")
        if not subject.isprintable():
            raise SignInFailed("bad_subject")
        return Identity(self._settings.issuer, subject, dict(claims))

    async def logout_url(self) -> str | None:
        """RP-initiated logout at the provider, when it offers it (`end_session_endpoint`)."""
        try:
            metadata = await self._metadata()
        except SignInFailed:
            return None  # the local session is gone either way
        if not metadata.get("end_session_endpoint"):
            return None
        found = await self._client.create_logout_url(
            post_logout_redirect_uri=self._post_logout_uri, client_id=self._settings.client_id
        )
        return str(found["url"])
