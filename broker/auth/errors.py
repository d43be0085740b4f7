"""How authentication refuses: fixed reason codes, one status each.

    AuthError(status, reason)   the request is not authenticated (401), forbidden (403) or
                                cannot be checked right now (503); `reason` is a fixed code
    KeysUnavailable             a key source has no usable keys at all (the IdP has not
                                answered yet); `Authenticator` turns it into a 503 AuthError

Reasons are for the audit log. Callers send the client only the status and a challenge
(`broker.auth.challenge`): telling a client *which* check failed would hand an attacker an
oracle. No error of this package carries any part of a token, a key or a claim value.
"""

from __future__ import annotations

from collections.abc import Iterable
from enum import StrEnum

from broker.types import OAuthScope


class AuthReason(StrEnum):
    # (noqa S105: these are reason codes that contain the word "token", not secrets)
    MISSING_TOKEN = "missing_token"  # noqa: S105 -- no Authorization header, or not Bearer
    MALFORMED_TOKEN = "malformed_token"  # noqa: S105
    HEADER_TOO_LARGE = "header_too_large"  # the JOSE header segment, checked before decoding
    TOKEN_TOO_LARGE = "token_too_large"  # noqa: S105
    BAD_ALGORITHM = "bad_algorithm"
    FORBIDDEN_HEADER = "forbidden_header"  # jku, x5u, jwk, x5c, crit, b64
    BAD_TOKEN_TYPE = "bad_token_type"  # noqa: S105
    UNKNOWN_KEY = "unknown_key"
    BAD_SIGNATURE = "bad_signature"
    EXPIRED = "expired"
    NOT_YET_VALID = "not_yet_valid"  # nbf or iat in the future beyond the leeway
    BAD_ISSUER = "bad_issuer"
    BAD_AUDIENCE = "bad_audience"
    MISSING_CLAIM = "missing_claim"
    BAD_CLAIM_TYPE = "bad_claim_type"
    LIFETIME_TOO_LONG = "lifetime_too_long"
    BAD_SUBJECT = "bad_subject"  # too long or carries control characters
    BAD_TENANT = "bad_tenant"
    UNKNOWN_TENANT = "unknown_tenant"
    INSUFFICIENT_SCOPE = "insufficient_scope"
    KEYS_UNAVAILABLE = "keys_unavailable"
    PREAUTH_LIMITED = "preauth_limited"  # the client address failed too often (broker.auth.preauth)


STATUS: dict[AuthReason, int] = {reason: 401 for reason in AuthReason} | {
    AuthReason.UNKNOWN_TENANT: 403,
    AuthReason.INSUFFICIENT_SCOPE: 403,
    AuthReason.KEYS_UNAVAILABLE: 503,
    AuthReason.PREAUTH_LIMITED: 429,
}


class AuthError(Exception):
    """A request was refused by authentication. `str()` and `repr()` show status and code only."""

    def __init__(
        self,
        status: int,
        reason: AuthReason | str,
        *,
        required_scopes: Iterable[OAuthScope] = (),
        retry_after: int = 0,
    ) -> None:
        # AuthReason(...) refuses free text, so no caller can smuggle a value into a reason.
        self.reason = AuthReason(reason)
        self.status = status
        self.required_scopes = frozenset(required_scopes)
        self.retry_after = retry_after  # seconds, for a 429
        # Set by `AuthService` when the pre-auth limiter counts this refusal for an interval's
        # aggregated `auth.denied` line: the caller then writes no line of its own.
        self.counted = False
        super().__init__(f"{status} {self.reason.value}")

    @classmethod
    def of(cls, reason: AuthReason) -> AuthError:
        """The error for `reason` with its one status from `STATUS`."""
        return cls(STATUS[reason], reason)

    def __repr__(self) -> str:
        return f"AuthError(status={self.status}, reason={self.reason.value!r})"


def insufficient_scope(*required: OAuthScope) -> AuthError:
    """What a caller raises when a valid principal lacks a scope (403 with a scope challenge)."""
    return AuthError(403, AuthReason.INSUFFICIENT_SCOPE, required_scopes=required)


class KeysUnavailable(Exception):
    """A key source holds no usable keys (never fetched successfully). Carries no key material."""
