"""The verified-token cache: a reused token skips decoding and the signature check, yet every
reuse re-checks what can change (key, clock, tenant); failures are never cached and keep their
exact reasons; the cache is bounded and holds digests, never tokens.

Verification is counted, not timed: `jwt.PyJWS.decode_complete` (the one call that decodes
and checks a signature) is wrapped with a counter, and so is the key source's `get_key`.
"""

from __future__ import annotations

import gc
import hashlib
import json
import secrets
import types
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jwt
import pytest
from test_auth_jwt import CASES, Case

from broker.auth import Authenticator, AuthError, KeysUnavailable, StaticKeySource, VerificationKey
from broker.auth.cache import DEFAULT_MAX_ENTRIES, Verified, VerifiedTokens, token_digest
from broker.auth.keys import DEV_ALGORITHM, PUBLIC_ALGORITHMS, parse_jwks
from broker.settings import AuthSettings
from broker.types import OAuthScope, Principal
from tests.broker.auth.jwt_forge import AUDIENCE, DEV_SECRET, DROP, ISSUER, NOW, TENANTS, Forge, public_jwk

LEEWAY = 10


class Clock:
    def __init__(self, now: float = NOW) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


class CountingKeys:
    """A key source whose keys can be swapped (rotation) and whose lookups are counted."""

    def __init__(self, source: Any) -> None:
        self.source = source
        self.calls = 0

    async def get_key(self, kid: str | None, algorithm: str) -> VerificationKey | None:
        self.calls += 1
        key: VerificationKey | None = await self.source.get_key(kid, algorithm)
        return key

    async def ready(self) -> bool:
        return True


class NoKeys:
    async def get_key(self, kid: str | None, algorithm: str) -> VerificationKey | None:
        raise KeysUnavailable

    async def ready(self) -> bool:
        return False


@dataclass
class Decodes:
    count: int = 0


@pytest.fixture
def decodes(monkeypatch: pytest.MonkeyPatch) -> Decodes:
    counter = Decodes()
    original = jwt.PyJWS.decode_complete

    def counting(self: jwt.PyJWS, *args: Any, **kwargs: Any) -> Any:
        counter.count += 1
        return original(self, *args, **kwargs)

    monkeypatch.setattr(jwt.PyJWS, "decode_complete", counting)
    return counter


def jwks_source(jwks: dict[str, Any]) -> StaticKeySource:
    """A fresh source: every call builds new key objects from the JWK set."""
    return StaticKeySource(parse_jwks(json.dumps(jwks).encode(), PUBLIC_ALGORITHMS))


@dataclass
class Rig:
    auth: Authenticator
    keys: CountingKeys
    clock: Clock
    tenants: set[str]

    async def reason(self, authorization: str) -> tuple[int, str]:
        with pytest.raises(AuthError) as caught:
            await self.auth.authenticate(authorization)
        return caught.value.status, caught.value.reason


@pytest.fixture
def rig_factory(forge: Forge) -> Callable[..., Rig]:
    def make(*, cache_size: int = DEFAULT_MAX_ENTRIES, leeway: int = LEEWAY, source: Any = None) -> Rig:
        settings = AuthSettings(issuer=ISSUER, audience=AUDIENCE, leeway_seconds=leeway)
        keys = CountingKeys(source if source is not None else jwks_source(forge.jwks()))
        clock = Clock()
        tenants = set(TENANTS)
        auth = Authenticator(settings, tenants.__contains__, keys, clock=clock, cache_size=cache_size)
        return Rig(auth, keys, clock, tenants)

    return make


@pytest.fixture
def rig(rig_factory: Callable[..., Rig]) -> Rig:
    return rig_factory()


READ_WRITE = frozenset({OAuthScope.DOCS_READ, OAuthScope.DOCS_WRITE})


# --- hits


@pytest.mark.anyio
@pytest.mark.parametrize("alg", ["RS256", "ES256", "EdDSA"])
async def test_reused_token_is_verified_once(rig: Rig, forge: Forge, decodes: Decodes, alg: str) -> None:
    token = forge.bearer(alg)
    for _ in range(5):
        assert await rig.auth.authenticate(token) == Principal("acme", "user-1", READ_WRITE, issuer=ISSUER)
    assert decodes.count == 1
    assert rig.keys.calls == 5  # the key is still looked up on every hit
    assert len(rig.auth.cache) == 1


@pytest.mark.anyio
async def test_dev_mode_token_is_cached(
    make_auth: Callable[..., Authenticator], dev_secret_file: Path, forge: Forge, decodes: Decodes
) -> None:
    auth = make_auth(dev_hs256_secret_file=dev_secret_file)
    for _ in range(3):
        assert (await auth.authenticate(forge.bearer("HS256"))).tenant == "acme"
    assert decodes.count == 1
    assert [e.algorithm for e in auth.cache.entries()] == [DEV_ALGORITHM]


@pytest.mark.anyio
async def test_default_authenticator_caches(auth: Authenticator, forge: Forge, decodes: Decodes) -> None:
    assert auth.cache.max_entries == DEFAULT_MAX_ENTRIES == 10_000
    await auth.authenticate(forge.bearer())
    await auth.authenticate(forge.bearer())
    assert decodes.count == 1


@pytest.mark.anyio
@pytest.mark.parametrize(
    "claims",
    [
        {},
        {"scope": "docs:read reports:approve openid", "sub": "ünïcode"},
        {"scope": DROP, "scp": ["docs:write", "x"], "tenant": "globex"},
        {"scope": "", "nbf": NOW - 5, "exp": NOW + 600.5, "iat": NOW - 0.25},
    ],
    ids=["default", "scope", "scp-list", "no-scope-float-times"],
)
async def test_cached_principal_is_exactly_what_the_full_path_produced(
    rig_factory: Callable[..., Rig], forge: Forge, decodes: Decodes, claims: dict[str, Any]
) -> None:
    token = forge.bearer(claims=claims)
    uncached = await rig_factory(cache_size=0).auth.authenticate(token)
    cached = rig_factory()
    first = await cached.auth.authenticate(token)
    again = await cached.auth.authenticate(token)
    assert first == again == uncached
    assert decodes.count == 2  # once uncached, once to fill the cache
    (entry,) = cached.auth.cache.entries()
    assert entry.principal == uncached
    assert (entry.kid, entry.algorithm) == ("rsa-1", "RS256")


@pytest.mark.anyio
async def test_size_zero_disables_the_cache(
    rig_factory: Callable[..., Rig], forge: Forge, decodes: Decodes
) -> None:
    rig = rig_factory(cache_size=0)
    for _ in range(3):
        await rig.auth.authenticate(forge.bearer())
    assert decodes.count == 3
    assert len(rig.auth.cache) == 0


def test_negative_size_is_refused(forge: Forge) -> None:
    settings = AuthSettings(issuer=ISSUER, audience=AUDIENCE)
    with pytest.raises(ValueError, match="max_entries"):
        Authenticator(settings, TENANTS.__contains__, jwks_source(forge.jwks()), cache_size=-1)


# --- the clock, re-checked on every hit


@pytest.mark.anyio
@pytest.mark.parametrize("leeway", [0, LEEWAY])
async def test_cached_token_expires_at_the_exact_moment(
    rig_factory: Callable[..., Rig], forge: Forge, decodes: Decodes, leeway: int
) -> None:
    rig = rig_factory(leeway=leeway)
    token = forge.bearer(claims={"iat": NOW - 10, "exp": NOW + 600})
    await rig.auth.authenticate(token)
    rig.clock.now = NOW + 600 + leeway - 0.001  # the last instant the full path would accept
    assert (await rig.auth.authenticate(token)).tenant == "acme"
    assert decodes.count == 1
    rig.clock.now = NOW + 600 + leeway
    assert await rig.reason(token) == (401, "expired")
    assert len(rig.auth.cache) == 0
    assert await rig.reason(token) == (401, "expired")
    assert decodes.count == 3  # both refusals came from the full path


@pytest.mark.anyio
async def test_nbf_in_the_future_on_a_cached_entry(rig: Rig, forge: Forge, decodes: Decodes) -> None:
    # Accepted at NOW + 95 (nbf within the leeway); then the wall clock is stepped back.
    token = forge.bearer(claims={"iat": NOW - 10, "nbf": NOW + 100, "exp": NOW + 600})
    rig.clock.now = NOW + 95
    await rig.auth.authenticate(token)
    rig.clock.now = NOW + 100 - LEEWAY  # nbf == now + leeway: still valid
    assert (await rig.auth.authenticate(token)).tenant == "acme"
    assert decodes.count == 1
    rig.clock.now = NOW + 100 - LEEWAY - 0.5
    assert await rig.reason(token) == (401, "not_yet_valid")
    assert len(rig.auth.cache) == 0 and decodes.count == 2


@pytest.mark.anyio
async def test_iat_in_the_future_on_a_cached_entry(rig: Rig, forge: Forge, decodes: Decodes) -> None:
    token = forge.bearer(claims={"iat": NOW, "exp": NOW + 600})
    await rig.auth.authenticate(token)
    rig.clock.now = NOW - LEEWAY - 1
    assert await rig.reason(token) == (401, "not_yet_valid")
    assert decodes.count == 2


@pytest.mark.anyio
async def test_expired_entries_are_swept_when_others_are_added(rig: Rig, forge: Forge) -> None:
    old = forge.bearer(claims={"sub": "old", "iat": NOW - 10, "exp": NOW + 60})
    await rig.auth.authenticate(old)
    rig.clock.now = NOW + 60 + LEEWAY
    await rig.auth.authenticate(forge.bearer(claims={"sub": "new", "iat": NOW + 60, "exp": NOW + 600}))
    assert [e.principal.subject for e in rig.auth.cache.entries()] == ["new"]


# --- the tenant, re-checked on every hit


@pytest.mark.anyio
async def test_tenant_that_becomes_unknown_is_refused_on_the_next_hit(
    rig: Rig, forge: Forge, decodes: Decodes
) -> None:
    token = forge.bearer()
    await rig.auth.authenticate(token)
    rig.tenants.discard("acme")
    assert await rig.reason(token) == (403, "unknown_tenant")
    assert len(rig.auth.cache) == 0
    assert await rig.reason(token) == (403, "unknown_tenant")
    assert decodes.count == 3
    rig.tenants.add("acme")  # known again: verified in full once, then cached again
    await rig.auth.authenticate(token)
    await rig.auth.authenticate(token)
    assert decodes.count == 4


# --- the key, re-checked on every hit


@pytest.mark.anyio
async def test_refetched_equal_keys_keep_the_entry(rig: Rig, forge: Forge, decodes: Decodes) -> None:
    token = forge.bearer()
    await rig.auth.authenticate(token)
    before = rig.auth.cache.entries()[0].key
    rig.keys.source = jwks_source(forge.jwks())  # e.g. a JWKS refetch: new objects, same keys
    after = await rig.keys.source.get_key("rsa-1", "RS256")
    assert after is not before and after == before
    assert (await rig.auth.authenticate(token)).tenant == "acme"
    assert decodes.count == 1


@pytest.mark.anyio
async def test_key_replaced_under_the_same_kid_means_full_verification(
    rig: Rig, forge: Forge, decodes: Decodes
) -> None:
    token = forge.bearer()
    await rig.auth.authenticate(token)
    original = rig.keys.source
    rig.keys.source = jwks_source({"keys": [public_jwk(forge.rsa_other, "rsa-1")]})
    assert await rig.reason(token) == (401, "bad_signature")
    assert decodes.count == 2 and len(rig.auth.cache) == 0
    rig.keys.source = original  # rotated back: verified in full and cached again
    await rig.auth.authenticate(token)
    await rig.auth.authenticate(token)
    assert decodes.count == 3


@pytest.mark.anyio
async def test_key_rotated_out_means_unknown_key(rig: Rig, forge: Forge, decodes: Decodes) -> None:
    token = forge.bearer()
    await rig.auth.authenticate(token)
    rig.keys.source = jwks_source({"keys": [public_jwk(forge.rsa_other, "rsa-2")]})
    calls = rig.keys.calls
    assert await rig.reason(token) == (401, "unknown_key")
    assert rig.keys.calls == calls + 2  # the hit's re-check, then the full path's lookup
    assert decodes.count == 1 and len(rig.auth.cache) == 0


@pytest.mark.anyio
async def test_kidless_token_whose_key_became_ambiguous(rig: Rig, forge: Forge) -> None:
    token = forge.bearer(header={"kid": DROP})
    await rig.auth.authenticate(token)
    assert rig.auth.cache.entries()[0].kid is None
    jwks = forge.jwks()
    rig.keys.source = jwks_source({"keys": [*jwks["keys"], public_jwk(forge.rsa_other, "rsa-2")]})
    assert await rig.reason(token) == (401, "unknown_key")


@pytest.mark.anyio
async def test_key_source_losing_all_keys_is_a_503(rig: Rig, forge: Forge) -> None:
    token = forge.bearer()
    await rig.auth.authenticate(token)
    rig.keys.source = NoKeys()
    assert await rig.reason(token) == (503, "keys_unavailable")
    assert len(rig.auth.cache) == 0


# --- failures are never cached, and keep their reasons


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("claims", "key_other", "reason", "status"),
    [
        ({}, True, "bad_signature", 401),
        ({"iat": NOW - 700, "exp": NOW - 100}, False, "expired", 401),
        ({"tenant": "initech"}, False, "unknown_tenant", 403),
        ({"aud": "https://other.example"}, False, "bad_audience", 401),
        ({"nbf": NOW + 120}, False, "not_yet_valid", 401),
    ],
    ids=["bad-signature", "expired", "unknown-tenant", "bad-audience", "nbf-future"],
)
async def test_failures_are_never_cached(
    rig: Rig,
    forge: Forge,
    decodes: Decodes,
    claims: dict[str, Any],
    key_other: bool,
    reason: str,
    status: int,
) -> None:
    token = forge.bearer(claims=claims, **({"key": forge.rsa_other} if key_other else {}))
    for attempt in range(1, 4):
        assert await rig.reason(token) == (status, reason)
        assert decodes.count == attempt
    assert len(rig.auth.cache) == 0


@pytest.mark.anyio
async def test_token_that_became_valid_is_then_cached(rig: Rig, forge: Forge, decodes: Decodes) -> None:
    token = forge.bearer(claims={"tenant": "initech"})
    assert await rig.reason(token) == (403, "unknown_tenant")
    rig.tenants.add("initech")
    assert (await rig.auth.authenticate(token)).tenant == "initech"
    assert (await rig.auth.authenticate(token)).tenant == "initech"
    assert decodes.count == 2


@pytest.fixture
async def warm(auth: Authenticator, forge: Forge) -> Authenticator:
    for alg in ("RS256", "ES256", "EdDSA"):
        await auth.authenticate(forge.bearer(alg))
    assert len(auth.cache) == 3
    return auth


@pytest.mark.anyio
@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
async def test_a_warm_cache_changes_no_refusal(warm: Authenticator, forge: Forge, case: Case) -> None:
    """Every hostile case of test_auth_jwt, against an Authenticator that has cached valid tokens
    signed by the same keys: same status, same reason, and nothing new in the cache."""
    before = warm.cache.digests()
    with pytest.raises(AuthError) as caught:
        await warm.authenticate(case.build(forge))
    assert (caught.value.status, caught.value.reason) == (case.status, case.reason)
    assert warm.cache.digests() == before


@pytest.mark.anyio
async def test_size_caps_apply_before_any_lookup(
    rig: Rig, forge: Forge, monkeypatch: pytest.MonkeyPatch
) -> None:
    hashed: list[int] = []

    def spy(token: str) -> bytes | None:
        hashed.append(len(token))
        return token_digest(token)

    monkeypatch.setattr("broker.auth.jwt.token_digest", spy)
    assert await rig.reason(forge.bearer(header={"pad": "x" * 9000})) == (401, "header_too_large")
    assert await rig.reason("Bearer " + "A" * 100_000) == (401, "header_too_large")
    assert await rig.reason(forge.bearer(claims={"pad": "x" * 20_000})) == (401, "token_too_large")
    assert await rig.reason("Bearer abc") == (401, "malformed_token")
    assert hashed == []
    assert rig.keys.calls == 0
    await rig.auth.authenticate(forge.bearer())
    assert len(hashed) == 1


@pytest.mark.anyio
async def test_non_ascii_tokens_are_not_hashed_or_cached(rig: Rig, forge: Forge) -> None:
    assert token_digest("abc.d\u00e9f.ghi") is None
    assert token_digest("a.b.\ud800") is None  # a lone surrogate must not raise either
    assert await rig.reason("Bearer " + forge.token() + "\u00e9") == (401, "malformed_token")
    assert len(rig.auth.cache) == 0


# --- the bound


@pytest.mark.anyio
async def test_bound_evicts_the_least_recently_used(
    rig_factory: Callable[..., Rig], forge: Forge, decodes: Decodes
) -> None:
    rig = rig_factory(cache_size=3)
    t1, t2, t3, t4 = (forge.bearer(claims={"sub": f"user-{i}"}) for i in range(1, 5))
    for token in (t1, t2, t3):
        await rig.auth.authenticate(token)
    await rig.auth.authenticate(t1)  # a hit: t1 is now the most recently used
    await rig.auth.authenticate(t4)  # full: evicts t2, the least recently used
    assert decodes.count == 4 and len(rig.auth.cache) == 3
    assert [e.principal.subject for e in rig.auth.cache.entries()] == ["user-3", "user-1", "user-4"]
    for token in (t1, t3, t4):
        await rig.auth.authenticate(token)
    assert decodes.count == 4
    await rig.auth.authenticate(t2)  # evicted: verified in full again
    assert decodes.count == 5 and len(rig.auth.cache) == 3


@pytest.mark.anyio
async def test_many_tokens_never_exceed_the_bound(rig_factory: Callable[..., Rig], forge: Forge) -> None:
    rig = rig_factory(cache_size=16)
    for i in range(50):
        await rig.auth.authenticate(forge.bearer(claims={"sub": f"user-{i}"}))
        assert len(rig.auth.cache) <= 16
    assert [e.principal.subject for e in rig.auth.cache.entries()] == [f"user-{i}" for i in range(34, 50)]


def test_discard_keeps_a_newer_entry() -> None:
    cache = VerifiedTokens(4)
    key = VerificationKey(None, DEV_ALGORITHM, DEV_SECRET)
    principal = Principal("acme", "u", frozenset())
    old = Verified(principal, NOW + 60, NOW, None, None, DEV_ALGORITHM, key)
    new = Verified(principal, NOW + 90, NOW, None, None, DEV_ALGORITHM, key)
    digest = hashlib.sha256(b"t").digest()
    cache.put(digest, old, NOW)
    cache.put(digest, new, NOW)
    cache.discard(digest, old)  # e.g. a task that looked at `old` before another replaced it
    assert cache.entries() == [new]
    cache.discard(digest, new)
    assert len(cache) == 0


# --- no token in memory


def _reachable_text(root: object) -> list[str | bytes]:
    """Every str and bytes reachable from `root` through containers and instances."""
    found: list[str | bytes] = []
    seen: set[int] = set()
    stack = [root]
    while stack:
        obj = stack.pop()
        if id(obj) in seen or isinstance(obj, type | types.ModuleType | types.FunctionType):
            continue
        seen.add(id(obj))
        if isinstance(obj, str | bytes):
            found.append(obj)
            continue
        stack.extend(gc.get_referents(obj))
    return found


@pytest.mark.anyio
async def test_canary_token_is_never_stored_in_plain_form(rig: Rig, forge: Forge) -> None:
    canary = "canary-" + secrets.token_hex(8)
    token = forge.token(claims={"jti": canary, "sub": "user-1"})
    await rig.auth.authenticate("Bearer " + token)
    assert rig.auth.cache.digests() == [hashlib.sha256(token.encode()).digest()]
    _, payload_seg, signature_seg = token.split(".")
    texts = _reachable_text(rig.auth.cache)
    assert texts  # the walk did reach the entries (the subject, the tenant, the kid…)
    assert "user-1" in texts and "rsa-1" in texts
    for text in texts:
        raw = text.encode("utf-8", "surrogatepass") if isinstance(text, str) else text
        for secret in (token, payload_seg, signature_seg, canary):
            assert secret.encode() not in raw
    assert token not in repr(rig.auth.cache.entries())
    assert signature_seg not in repr(rig.auth.cache.entries())
