"""Bearer JWT → Principal (DESIGN §5).

The checks run cheapest and least trusting first, and nothing from the payload is parsed
before its signature has been verified:

    1. `Authorization: Bearer <token>`   one header, scheme case-insensitive, exactly one token
    2. sizes                             the header segment (≤ max_header_bytes) before decoding
                                         anything, then the whole token
       cache                             a token verified before (`broker.auth.cache`) is
                                         answered from there if its key, times and tenant
                                         still hold; anything else takes the full path below
    3. JOSE header                       strict base64url + JSON; alg from the allow-list;
                                         no key-carrying or extension headers; typ; kid a string
    4. key                               by kid AND algorithm from the key source
    5. signature                         pyjwt, with the one algorithm the key is bound to
    6. claims                            presence, JSON types, iss, aud, times, lifetime, sub,
                                         tenant id; then whether the tenant is known (403)

Decisions beyond the design's wording:

- Tokens carrying `jku`, `x5u`, `jwk` or `x5c` are refused, not just "not followed": a token
  that tries to name or embed its own key is either an attack or an IdP setup nobody
  reviewed. `crit` and `b64` are refused as well (no JWS extension is implemented here).
- `typ`, when present, must be a JWT type (`JWT`, `at+jwt`, with or without `application/`).
- `exp <= iat` is treated as expired: such a token was never valid.
- `sub` is at most 256 printable characters (it is written to the audit log and shown to
  approvers; control and bidi characters would let it pose as something else).
- `scope` wins over `scp` when both are present; `scp` may be a list or a space-separated
  string (Entra ID uses the latter). Unknown scope names are ignored.

Nothing here logs, and no error carries any part of the token (see `broker.auth.errors`).
The cache keeps SHA-256 digests of tokens, never the tokens, and only ever answers success.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import jwt

from broker.auth.cache import DEFAULT_MAX_ENTRIES, Verified, VerifiedTokens, token_digest
from broker.auth.claims_map import as_values, claim_at, group_names, person_id
from broker.auth.encoding import json_object
from broker.auth.errors import AuthError, AuthReason, KeysUnavailable, insufficient_scope
from broker.auth.keys import KeySource, VerificationKey, allowed_algorithms
from broker.base64url import b64url_decode
from broker.settings import MAX_LEEWAY_SECONDS, PREFIX, AuthSettings, SettingsError
from broker.types import OAuthScope, Principal, TenantId
from server.contracts import TENANT_RE

R = AuthReason

MAX_TOKEN_BYTES = 16 * 1024
MAX_SUBJECT_CHARS = 256
_FORBIDDEN_HEADERS = frozenset({"jku", "x5u", "jwk", "x5c", "crit", "b64"})
_TOKEN_TYPES = frozenset({"jwt", "at+jwt", "application/jwt", "application/at+jwt"})
_SCOPES = {scope.value: scope for scope in OAuthScope}
_B64URL_CHARS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_")


def authorization_header(values: Sequence[str]) -> str | None:
    """The request's one Authorization value (e.g. `request.headers.getlist("authorization")`).

    Two headers are refused: proxies and frameworks disagree on which one counts.
    """
    if len(values) > 1:
        raise AuthError.of(R.MALFORMED_TOKEN)
    return values[0] if values else None


def bearer_token(authorization: str | None) -> str:
    """The token of `Bearer <token>`; the scheme is case-insensitive (RFC 9110 §11.1)."""
    parts = authorization.split() if authorization else []
    # Another scheme (Basic, DPoP…) means no bearer credentials were presented at all.
    if not parts or parts[0].lower() != "bearer" or len(parts) == 1:
        raise AuthError.of(R.MISSING_TOKEN)
    if len(parts) != 2:
        raise AuthError.of(R.MALFORMED_TOKEN)
    return parts[1]


def require_scope(principal: Principal, scope: OAuthScope) -> None:
    """Raise the 403 insufficient_scope error unless the principal holds `scope`."""
    if not principal.has(scope):
        raise insufficient_scope(scope)


@dataclass(frozen=True)
class _Header:
    alg: str
    kid: str | None


class Authenticator:
    def __init__(
        self,
        settings: AuthSettings,
        known_tenant: Callable[[str], bool],
        keys: KeySource,
        *,
        clock: Callable[[], float] = time.time,
        cache_size: int = DEFAULT_MAX_ENTRIES,
    ) -> None:
        """`cache_size`: how many verified tokens to remember (0: verify every request in full)."""
        if not 0 <= settings.leeway_seconds <= MAX_LEEWAY_SECONDS:
            raise SettingsError(f"{PREFIX}AUTH_LEEWAY must be between 0 and {MAX_LEEWAY_SECONDS}")
        if settings.max_lifetime_seconds <= 0 or settings.max_header_bytes <= 0:
            raise SettingsError(f"{PREFIX}AUTH_MAX_LIFETIME and AUTH_MAX_HEADER_BYTES must be positive")
        if not settings.issuer or not settings.audience or not settings.tenant_claim:
            raise SettingsError(f"{PREFIX}AUTH_ISSUER, AUTH_AUDIENCE and AUTH_TENANT_CLAIM must be set")
        self._settings = settings
        self._known_tenant = known_tenant
        self._keys = keys
        self._clock = clock
        self._algorithms = allowed_algorithms(settings)
        # The PyJWS instance knows only the allowed algorithms, and each call names the one
        # algorithm of the chosen key: the token's alg header never picks the verifier alone.
        self._jws = jwt.PyJWS(
            algorithms=sorted(self._algorithms),
            options={"verify_signature": True, "enforce_minimum_key_length": True},
        )
        self._max_token = max(MAX_TOKEN_BYTES, settings.max_header_bytes + 8 * 1024)
        self._cache = VerifiedTokens(cache_size, leeway=settings.leeway_seconds)

    @property
    def cache(self) -> VerifiedTokens:
        """The verified-token cache (digests only; see `broker.auth.cache`)."""
        return self._cache

    async def authenticate(self, authorization: str | None) -> Principal:
        """The caller the Authorization header proves, or AuthError with a fixed reason."""
        token = bearer_token(authorization)
        # The size caps come first: an oversized token is refused before it is even hashed.
        self._sizes(token)
        digest = token_digest(token) if self._cache.max_entries else None
        if digest is not None:
            cached = await self._reuse(digest)
            if cached is not None:
                return cached
        header = self._header(token)
        key = await self._key(header)
        claims = json_object(self._verify(token, key))
        if claims is None:
            raise AuthError.of(R.MALFORMED_TOKEN)
        principal, exp, iat, nbf = self._principal(claims)
        if not self._known_tenant(principal.tenant):
            raise AuthError.of(R.UNKNOWN_TENANT)
        if digest is not None:  # only here, after every check passed: failures are never cached
            entry = Verified(principal, exp, iat, nbf, header.kid, header.alg, key)
            self._cache.put(digest, entry, self._clock())
        return principal

    async def _reuse(self, digest: bytes) -> Principal | None:
        """The cached principal if everything that can change since still holds, else None.

        The dynamic checks of the full path, in its order: the key source still returns an
        equal key for (kid, alg), the times hold on the current clock, the tenant is still
        known. On any doubt the entry is dropped and the caller runs the full path, which
        either re-verifies the token (and caches it again) or refuses it with the exact
        reason it would have given without a cache.
        """
        entry = self._cache.get(digest)
        if entry is None:
            return None
        try:
            key = await self._keys.get_key(entry.kid, entry.algorithm)
        except KeysUnavailable:
            key = None
        if (
            (key is entry.key or key == entry.key)
            and _time_failure(entry.exp, entry.iat, entry.nbf, self._clock(), self._settings.leeway_seconds)
            is None
            and self._known_tenant(entry.principal.tenant)
        ):
            return entry.principal
        self._cache.discard(digest, entry)
        return None

    def _sizes(self, token: str) -> None:
        limit = self._settings.max_header_bytes
        # Measured on the encoded segment, before any decoding: the search itself is bounded.
        dot = token.find(".", 0, limit + 1)
        if dot < 0:
            raise AuthError.of(R.HEADER_TOO_LARGE if len(token) > limit else R.MALFORMED_TOKEN)
        if len(token) > self._max_token:
            raise AuthError.of(R.TOKEN_TOO_LARGE)

    def _header(self, token: str) -> _Header:
        segments = token.split(".")
        # Three segments (JWE has five), non-empty header and payload; an empty signature is
        # left for the algorithm check below so that alg "none" gets its own reason.
        if (
            len(segments) != 3
            or not segments[0]
            or not segments[1]
            or not set(token) <= _B64URL_CHARS | {"."}
        ):
            raise AuthError.of(R.MALFORMED_TOKEN)
        raw = b64url_decode(segments[0])
        header = json_object(raw) if raw is not None else None
        if header is None:
            raise AuthError.of(R.MALFORMED_TOKEN)
        alg = header.get("alg")
        if not isinstance(alg, str) or alg not in self._algorithms:
            raise AuthError.of(R.BAD_ALGORITHM)  # "none" in any case, HS* vs RS*, unknown
        if _FORBIDDEN_HEADERS & header.keys():
            raise AuthError.of(R.FORBIDDEN_HEADER)
        typ = header.get("typ")
        if typ is not None and (not isinstance(typ, str) or typ.lower() not in _TOKEN_TYPES):
            raise AuthError.of(R.BAD_TOKEN_TYPE)
        kid = header.get("kid")
        if "kid" in header and not isinstance(kid, str):
            raise AuthError.of(R.MALFORMED_TOKEN)
        return _Header(alg, kid)

    async def _key(self, header: _Header) -> VerificationKey:
        try:
            key = await self._keys.get_key(header.kid, header.alg)
        except KeysUnavailable:
            raise AuthError.of(R.KEYS_UNAVAILABLE) from None
        if key is None or key.algorithm != header.alg:
            raise AuthError.of(R.UNKNOWN_KEY)
        return key

    def _verify(self, token: str, key: VerificationKey) -> bytes:
        failure: AuthReason
        try:
            decoded = self._jws.decode_complete(token, key=key.key, algorithms=[key.algorithm])
            payload: bytes = decoded["payload"]
            return payload
        except (jwt.InvalidSignatureError, jwt.InvalidKeyError):
            # pyjwt reports a failed EdDSA check as InvalidKeyError; keys were vetted at load.
            failure = R.BAD_SIGNATURE
        except jwt.InvalidAlgorithmError:
            failure = R.BAD_ALGORITHM
        except jwt.PyJWTError:
            failure = R.MALFORMED_TOKEN
        # Raised outside the handler: pyjwt's messages may quote header values, and they must
        # not ride along as __context__ into a logged traceback.
        raise AuthError.of(failure)

    def _principal(
        self, claims: dict[str, Any]
    ) -> tuple[Principal, int | float, int | float, int | float | None]:
        """The principal, and the token's exp, iat and nbf for the cache's re-checks."""
        s = self._settings
        for name in ("iss", "aud", "exp", "iat", "sub"):
            if name not in claims:
                raise AuthError.of(R.MISSING_CLAIM)
        held = claim_at(claims, s.tenant_claim)
        if held is None:
            raise AuthError.of(R.MISSING_CLAIM)
        iss, sub = claims["iss"], claims["sub"]
        if not isinstance(iss, str) or not isinstance(sub, str):
            raise AuthError.of(R.BAD_CLAIM_TYPE)
        tenant = _tenant(held, s.tenant_map)
        audiences = _audiences(claims["aud"])
        exp, iat = _number(claims["exp"]), _number(claims["iat"])
        nbf = _number(claims["nbf"]) if "nbf" in claims else None
        scopes = _scopes(claims)
        groups = _groups(claims.get(s.groups_claim, []))

        if iss != s.issuer:  # exact: no normalising of case, slashes or prefixes
            raise AuthError.of(R.BAD_ISSUER)
        if s.audience not in audiences:
            raise AuthError.of(R.BAD_AUDIENCE)
        failure = _time_failure(exp, iat, nbf, self._clock(), s.leeway_seconds)
        if failure is not None:
            raise AuthError.of(failure)
        if exp - iat > s.max_lifetime_seconds:
            raise AuthError.of(R.LIFETIME_TOO_LONG)
        if not sub:
            raise AuthError.of(R.MISSING_CLAIM)
        if len(sub) > MAX_SUBJECT_CHARS or not sub.isprintable():
            raise AuthError.of(R.BAD_SUBJECT)
        # The person: `sub` unless the operator names the claim that is one person's across
        # their tokens and their sign-ins (Entra ID's `sub` is per application).
        person = sub if s.person_claim == "sub" else person_id(claims, s.person_claim)
        if person is None:
            raise AuthError.of(R.BAD_SUBJECT)
        if not TENANT_RE.fullmatch(tenant):
            raise AuthError.of(R.BAD_TENANT)
        principal = Principal(
            tenant=TenantId(tenant), subject=person, scopes=scopes, groups=groups, issuer=iss
        )
        return principal, exp, iat, nbf


def _tenant(held: Any, tenant_map: tuple[tuple[str, str], ...]) -> str:
    """The tenant the claim names: itself, or through the mapping the one tenant its values
    (groups, roles, an org id) map to. No mapped value, or values mapping to two tenants, is
    BAD_TENANT: a token acts for exactly one tenant, never for a guess between several."""
    if not tenant_map:
        if not isinstance(held, str):
            raise AuthError.of(R.BAD_CLAIM_TYPE)
        return held
    values = as_values(held)
    if not values and not isinstance(held, str | list):
        raise AuthError.of(R.BAD_CLAIM_TYPE)
    tenants = {tenant for value, tenant in tenant_map if value in values}
    if len(tenants) != 1:
        raise AuthError.of(R.BAD_TENANT)
    return tenants.pop()


def _time_failure(
    exp: int | float, iat: int | float, nbf: int | float | None, now: float, leeway: int
) -> AuthReason | None:
    """Why the token's times refuse it at `now`, or None. Shared by the full path and the cache."""
    if exp <= iat or now >= exp + leeway:
        return R.EXPIRED
    if iat > now + leeway or (nbf is not None and nbf > now + leeway):
        return R.NOT_YET_VALID
    return None


def _number(value: Any) -> int | float:
    # bool is an int in Python, but JSON true is not a NumericDate. Not converted to float:
    # a huge integer would overflow, and int/float comparisons are exact as they stand.
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise AuthError.of(R.BAD_CLAIM_TYPE)
    return value


def _audiences(value: Any) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, list) and all(isinstance(a, str) for a in value):
        return value
    raise AuthError.of(R.BAD_CLAIM_TYPE)


def _groups(value: Any) -> frozenset[str]:
    """The groups claim: a list of printable names (`claims_map.group_names`)."""
    names = group_names(value)
    if names is None:
        raise AuthError.of(R.BAD_CLAIM_TYPE)
    return names


def _scopes(claims: dict[str, Any]) -> frozenset[OAuthScope]:
    names: list[str]
    if "scope" in claims:
        if not isinstance(claims["scope"], str):
            raise AuthError.of(R.BAD_CLAIM_TYPE)
        names = claims["scope"].split(" ")
    elif "scp" in claims:
        scp = claims["scp"]
        if isinstance(scp, str):
            names = scp.split(" ")
        elif isinstance(scp, list) and all(isinstance(n, str) for n in scp):
            names = scp
        else:
            raise AuthError.of(R.BAD_CLAIM_TYPE)
    else:
        names = []
    return frozenset(_SCOPES[n] for n in names if n in _SCOPES)
