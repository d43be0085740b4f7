"""Authenticator: hostile and malformed tokens are refused with the right status and reason;
valid ones from every allowed algorithm become the right Principal."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from broker.auth import Authenticator, AuthError, authorization_header, bearer_token, require_scope
from broker.settings import SettingsError
from broker.types import OAuthScope, Principal
from tests.broker.auth.jwt_forge import (
    AUDIENCE,
    DEV_SECRET,
    DROP,
    ISSUER,
    NOW,
    Forge,
    b64,
    dumps,
    public_jwk,
    public_pem,
    sign_raw,
)

Build = Callable[[Forge], str | None]


@dataclass(frozen=True)
class Case:
    id: str
    build: Build
    reason: str
    status: int = 401


def _flip_middle(segment: str) -> str:
    i = len(segment) // 2
    return segment[:i] + ("A" if segment[i] != "A" else "B") + segment[i + 1 :]


def _tamper_signature(f: Forge, alg: str) -> str:
    h, p, s = f.token(alg).split(".")
    return f"Bearer {h}.{p}.{_flip_middle(s)}"


def _truncate_signature(token: str) -> str:
    h, p, s = token.split(".")
    return f"Bearer {h}.{p}.{s[: len(s) - len(s) % 4 - 4]}"  # whole base64 groups: still canonical


def _tamper_payload(f: Forge) -> str:
    h, _, s = f.token().split(".")
    forged = b64(dumps(f.claims(tenant="globex", scope="docs:read docs:write reports:approve")))
    return f"Bearer {h}.{forged}.{s}"


def _raw(header: str | bytes, payload: str | bytes, f: Forge, alg: str = "RS256") -> str:
    """A signed token from raw header/payload bytes (JSON a normal library would not write)."""
    h = header.encode() if isinstance(header, str) else header
    p = payload.encode() if isinstance(payload, str) else payload
    return "Bearer " + sign_raw(b64(h), b64(p), alg, f.key_for(alg))


def _valid_header() -> str:
    return '{"alg":"RS256","kid":"rsa-1"}'


def _valid_payload(f: Forge) -> str:
    return json.dumps(f.claims())


def _non_canonical_header(f: Forge) -> str:
    head = dumps(f.header("RS256"))
    while len(head) % 3 != 1:  # 1 byte over a multiple of 3: the last char has 4 unused bits
        head = head[:-1] + b" }"
    seg = b64(head)
    alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
    seg = seg[:-1] + alphabet[alphabet.index(seg[-1]) + 1]  # same bytes, second spelling
    return "Bearer " + sign_raw(seg, b64(dumps(f.claims())), "RS256", f.rsa)


def _jwk_header(f: Forge) -> str:
    # The attacker embeds their own public key and signs with its private half.
    return f.bearer(header={"jwk": public_jwk(f.rsa_other, "rsa-1")}, key=f.rsa_other)


def _without(claim: str) -> Build:
    return lambda f: f.bearer(claims={claim: DROP})


CASES: list[Case] = [
    # --- the Authorization header itself
    Case("no-header", lambda f: None, "missing_token"),
    Case("empty-header", lambda f: "", "missing_token"),
    Case("bearer-without-token", lambda f: "Bearer", "missing_token"),
    Case("bearer-blank-token", lambda f: "Bearer    ", "missing_token"),
    Case("basic-scheme", lambda f: "Basic dXNlcjpwYXNzd29yZA==", "missing_token"),
    Case("token-scheme-with-valid-jwt", lambda f: "Token " + f.token(), "missing_token"),
    Case("jwt-without-scheme", lambda f: f.token(), "missing_token"),
    Case("two-tokens", lambda f: f"Bearer {f.token()} {f.token()}", "malformed_token"),
    Case("two-bearer-values", lambda f: f"Bearer {f.token()}, Bearer {f.token()}", "malformed_token"),
    # --- structure and encoding
    Case("garbage-base64", lambda f: "Bearer !!!!.@@@@.####", "malformed_token"),
    Case("not-a-jwt", lambda f: "Bearer hello-world", "malformed_token"),
    Case("two-segments", lambda f: "Bearer " + ".".join(f.token().split(".")[:2]), "malformed_token"),
    Case("four-segments", lambda f: f"Bearer {f.token()}.AAAA", "malformed_token"),
    Case("jwe-five-segments", lambda f: "Bearer eyJhbGciOiJSU0EtT0FFUCJ9.a.b.c.d", "malformed_token"),
    Case(
        "empty-payload-segment",
        lambda f: "Bearer {}..{}".format(*f.token().split(".")[::2]),
        "malformed_token",
    ),
    Case("padded-segments", lambda f: "Bearer " + f.token().replace(".", "==."), "malformed_token"),
    Case(
        "header-len-mod-4-is-1",
        lambda f: "Bearer eyJhb." + ".".join(f.token().split(".")[1:]),
        "malformed_token",
    ),
    Case("non-ascii-in-token", lambda f: "Bearer " + f.token() + "\u00e9", "malformed_token"),
    Case("non-canonical-base64-header", _non_canonical_header, "malformed_token"),
    Case("header-not-json", lambda f: _raw("not json", _valid_payload(f), f), "malformed_token"),
    Case("header-json-array", lambda f: _raw('["RS256"]', _valid_payload(f), f), "malformed_token"),
    Case(
        "header-not-utf8",
        lambda f: _raw(b'{"alg":"RS256","x":"\xff"}', _valid_payload(f), f),
        "malformed_token",
    ),
    Case(
        "header-deep-nesting",
        lambda f: _raw("[" * 3000 + "]" * 3000, _valid_payload(f), f),
        "malformed_token",
    ),
    Case(
        "header-duplicate-alg",
        lambda f: _raw('{"alg":"none","alg":"RS256","kid":"rsa-1"}', _valid_payload(f), f),
        "malformed_token",
    ),
    Case("payload-not-json-signed", lambda f: _raw(_valid_header(), "not json", f), "malformed_token"),
    Case("payload-json-array-signed", lambda f: _raw(_valid_header(), "[1,2,3]", f), "malformed_token"),
    Case(
        "payload-duplicate-tenant-signed",
        lambda f: _raw(_valid_header(), _valid_payload(f)[:-1] + ',"tenant":"globex"}', f),
        "malformed_token",
    ),
    Case(
        "exp-nan",
        lambda f: _raw(_valid_header(), _valid_payload(f).replace('"exp": ', '"exp": NaN, "x": '), f),
        "malformed_token",
    ),
    Case(
        "exp-1e400",
        lambda f: _raw(_valid_header(), _valid_payload(f).replace('"exp": ', '"exp": 1e400, "x": '), f),
        "malformed_token",
    ),
    Case("kid-int", lambda f: f.bearer(header={"kid": 1}), "malformed_token"),
    Case("kid-null", lambda f: f.bearer(header={"kid": None}), "malformed_token"),
    Case("kid-list", lambda f: f.bearer(header={"kid": ["rsa-1"]}), "malformed_token"),
    # --- sizes
    Case("header-over-8-KiB", lambda f: f.bearer(header={"pad": "x" * 6200}), "header_too_large"),
    Case("no-dot-over-8-KiB", lambda f: "Bearer " + "A" * 9000, "header_too_large"),
    Case("token-over-16-KiB", lambda f: f.bearer(claims={"pad": "x" * 13000}), "token_too_large"),
    # --- algorithm
    Case("alg-none", lambda f: f.bearer("none", key=None), "bad_algorithm"),
    Case("alg-None", lambda f: f.bearer("None", key=None), "bad_algorithm"),
    Case("alg-NONE", lambda f: f.bearer("NONE", key=None), "bad_algorithm"),
    Case("alg-nOnE", lambda f: f.bearer("nOnE", key=None), "bad_algorithm"),
    Case("alg-none-with-signature", lambda f: f.bearer("none", sign_as="RS256"), "bad_algorithm"),
    Case("alg-missing", lambda f: f.bearer(header={"alg": DROP}), "bad_algorithm"),
    Case("alg-null", lambda f: f.bearer(header={"alg": None}), "bad_algorithm"),
    Case("alg-int", lambda f: f.bearer(header={"alg": 256}), "bad_algorithm"),
    Case("alg-lowercase", lambda f: f.bearer(header={"alg": "rs256"}), "bad_algorithm"),
    Case(
        "hs256-keyed-with-rsa-public-pem", lambda f: f.bearer("HS256", key=public_pem(f.rsa)), "bad_algorithm"
    ),
    Case(
        "hs512-keyed-with-rsa-public-pem", lambda f: f.bearer("HS512", key=public_pem(f.rsa)), "bad_algorithm"
    ),
    Case("rs512", lambda f: f.bearer(header={"alg": "RS512"}), "bad_algorithm"),
    Case("ps256", lambda f: f.bearer(header={"alg": "PS256"}), "bad_algorithm"),
    Case("es384", lambda f: f.bearer(header={"alg": "ES384"}), "bad_algorithm"),
    Case("es256-naming-rsa-kid", lambda f: f.bearer("ES256", header={"kid": "rsa-1"}), "unknown_key"),
    Case("rs256-naming-ec-kid", lambda f: f.bearer("RS256", header={"kid": "ec-1"}), "unknown_key"),
    # --- headers that carry or locate keys, extensions, types
    Case("jku", lambda f: f.bearer(header={"jku": "https://evil.example/jwks.json"}), "forbidden_header"),
    Case("x5u", lambda f: f.bearer(header={"x5u": "https://evil.example/cert.pem"}), "forbidden_header"),
    Case("jwk-embedded-attacker-key", _jwk_header, "forbidden_header"),
    Case("x5c", lambda f: f.bearer(header={"x5c": ["MIIB"]}), "forbidden_header"),
    Case("crit", lambda f: f.bearer(header={"crit": ["exp"], "exp": 1}), "forbidden_header"),
    Case("b64-false", lambda f: f.bearer(header={"b64": False, "crit": ["b64"]}), "forbidden_header"),
    Case("typ-secevent", lambda f: f.bearer(header={"typ": "secevent+jwt"}), "bad_token_type"),
    Case("typ-int", lambda f: f.bearer(header={"typ": 1}), "bad_token_type"),
    # --- key id tricks
    Case("kid-unknown", lambda f: f.bearer(header={"kid": "rsa-2"}), "unknown_key"),
    Case("kid-path-traversal", lambda f: f.bearer(header={"kid": "../../../../etc/passwd"}), "unknown_key"),
    Case("kid-dev-null", lambda f: f.bearer(header={"kid": "/dev/null"}), "unknown_key"),
    Case("kid-sql", lambda f: f.bearer(header={"kid": "' OR '1'='1' --"}), "unknown_key"),
    Case("kid-very-long", lambda f: f.bearer(header={"kid": "k" * 5000}), "unknown_key"),
    Case("kid-empty", lambda f: f.bearer(header={"kid": ""}), "unknown_key"),
    Case("kid-nul-suffix", lambda f: f.bearer(header={"kid": "rsa-1\u0000"}), "unknown_key"),
    # --- signature
    Case("tampered-payload", _tamper_payload, "bad_signature"),
    Case("tampered-signature-rs256", lambda f: _tamper_signature(f, "RS256"), "bad_signature"),
    Case("tampered-signature-es256", lambda f: _tamper_signature(f, "ES256"), "bad_signature"),
    Case("tampered-signature-eddsa", lambda f: _tamper_signature(f, "EdDSA"), "bad_signature"),
    Case("empty-signature-rs256", lambda f: "Bearer " + f.token().rsplit(".", 1)[0] + ".", "bad_signature"),
    Case("truncated-signature-es256", lambda f: _truncate_signature(f.token("ES256")), "bad_signature"),
    Case("signed-by-other-rsa-key", lambda f: f.bearer(key=f.rsa_other), "bad_signature"),
    # --- required claims
    *[
        Case(f"missing-{c}", _without(c), "missing_claim")
        for c in ("iss", "aud", "exp", "iat", "sub", "tenant")
    ],
    Case("sub-empty", lambda f: f.bearer(claims={"sub": ""}), "missing_claim"),
    # --- claim types
    Case("exp-string", lambda f: f.bearer(claims={"exp": str(NOW + 600)}), "bad_claim_type"),
    Case("exp-bool", lambda f: f.bearer(claims={"exp": True}), "bad_claim_type"),
    Case("exp-null", lambda f: f.bearer(claims={"exp": None}), "bad_claim_type"),
    Case("exp-list", lambda f: f.bearer(claims={"exp": [NOW + 600]}), "bad_claim_type"),
    Case("iat-bool", lambda f: f.bearer(claims={"iat": False}), "bad_claim_type"),
    Case("iat-string", lambda f: f.bearer(claims={"iat": str(NOW)}), "bad_claim_type"),
    Case("nbf-string", lambda f: f.bearer(claims={"nbf": str(NOW)}), "bad_claim_type"),
    Case("sub-int", lambda f: f.bearer(claims={"sub": 42}), "bad_claim_type"),
    Case("sub-null", lambda f: f.bearer(claims={"sub": None}), "bad_claim_type"),
    Case("aud-int", lambda f: f.bearer(claims={"aud": 1}), "bad_claim_type"),
    Case("aud-object", lambda f: f.bearer(claims={"aud": {"aud": AUDIENCE}}), "bad_claim_type"),
    Case("aud-list-with-non-string", lambda f: f.bearer(claims={"aud": [AUDIENCE, 7]}), "bad_claim_type"),
    Case("iss-int", lambda f: f.bearer(claims={"iss": 1}), "bad_claim_type"),
    Case("iss-list", lambda f: f.bearer(claims={"iss": [ISSUER]}), "bad_claim_type"),
    Case("tenant-list", lambda f: f.bearer(claims={"tenant": ["acme"]}), "bad_claim_type"),
    Case("tenant-int", lambda f: f.bearer(claims={"tenant": 7}), "bad_claim_type"),
    Case("scope-list", lambda f: f.bearer(claims={"scope": ["docs:read"]}), "bad_claim_type"),
    Case(
        "scp-list-with-int",
        lambda f: f.bearer(claims={"scope": DROP, "scp": ["docs:read", 1]}),
        "bad_claim_type",
    ),
    # --- issuer and audience
    Case("iss-trailing-slash", lambda f: f.bearer(claims={"iss": ISSUER + "/"}), "bad_issuer"),
    Case("iss-uppercase", lambda f: f.bearer(claims={"iss": ISSUER.upper()}), "bad_issuer"),
    Case("iss-prefix-of-ours", lambda f: f.bearer(claims={"iss": ISSUER[:-1]}), "bad_issuer"),
    Case("iss-ours-as-prefix", lambda f: f.bearer(claims={"iss": ISSUER + "-evil"}), "bad_issuer"),
    Case(
        "iss-http-scheme", lambda f: f.bearer(claims={"iss": ISSUER.replace("https", "http")}), "bad_issuer"
    ),
    Case("aud-wrong", lambda f: f.bearer(claims={"aud": "https://other.example.com/mcp"}), "bad_audience"),
    Case("aud-list-without-ours", lambda f: f.bearer(claims={"aud": ["a", "b"]}), "bad_audience"),
    Case("aud-empty-list", lambda f: f.bearer(claims={"aud": []}), "bad_audience"),
    Case("aud-trailing-slash", lambda f: f.bearer(claims={"aud": AUDIENCE + "/"}), "bad_audience"),
    # --- time
    Case("expired", lambda f: f.bearer(claims={"iat": NOW - 700, "exp": NOW - 100}), "expired"),
    Case(
        "expired-just-past-leeway", lambda f: f.bearer(claims={"iat": NOW - 700, "exp": NOW - 10}), "expired"
    ),
    Case("exp-before-iat", lambda f: f.bearer(claims={"iat": NOW, "exp": NOW - 1}), "expired"),
    Case("nbf-future", lambda f: f.bearer(claims={"nbf": NOW + 120}), "not_yet_valid"),
    Case("iat-future", lambda f: f.bearer(claims={"iat": NOW + 120, "exp": NOW + 600}), "not_yet_valid"),
    Case(
        "lifetime-too-long",
        lambda f: f.bearer(claims={"iat": NOW - 10, "exp": NOW + 3600}),
        "lifetime_too_long",
    ),
    # --- subject and tenant
    Case("sub-too-long", lambda f: f.bearer(claims={"sub": "u" * 257}), "bad_subject"),
    Case("sub-bidi-override", lambda f: f.bearer(claims={"sub": "admin\u202etxt"}), "bad_subject"),
    Case("sub-newline", lambda f: f.bearer(claims={"sub": "user\nevent=forged"}), "bad_subject"),
    Case("tenant-uppercase", lambda f: f.bearer(claims={"tenant": "Acme"}), "bad_tenant"),
    Case("tenant-underscore", lambda f: f.bearer(claims={"tenant": "ac_me"}), "bad_tenant"),
    Case("tenant-64-chars", lambda f: f.bearer(claims={"tenant": "a" * 64}), "bad_tenant"),
    Case("tenant-leading-dash", lambda f: f.bearer(claims={"tenant": "-acme"}), "bad_tenant"),
    Case("tenant-trailing-dash", lambda f: f.bearer(claims={"tenant": "acme-"}), "bad_tenant"),
    Case("tenant-trailing-newline", lambda f: f.bearer(claims={"tenant": "acme\n"}), "bad_tenant"),
    Case("tenant-empty", lambda f: f.bearer(claims={"tenant": ""}), "bad_tenant"),
    Case("tenant-path", lambda f: f.bearer(claims={"tenant": "../globex"}), "bad_tenant"),
    Case("tenant-non-ascii", lambda f: f.bearer(claims={"tenant": "acm\u00e9"}), "bad_tenant"),
    Case("tenant-unknown", lambda f: f.bearer(claims={"tenant": "initech"}), "unknown_tenant", 403),
]


def test_there_are_many_distinct_hostile_cases() -> None:
    assert len({c.id for c in CASES}) == len(CASES) >= 30


@pytest.mark.anyio
@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
async def test_hostile_tokens_are_refused(auth: Authenticator, forge: Forge, case: Case) -> None:
    with pytest.raises(AuthError) as caught:
        await auth.authenticate(case.build(forge))
    assert (caught.value.status, caught.value.reason) == (case.status, case.reason)


# --- dev mode: HS256 only, never a public-key algorithm


@pytest.mark.anyio
async def test_dev_mode_accepts_hs256(dev_auth: Authenticator, forge: Forge) -> None:
    principal = await dev_auth.authenticate(forge.bearer("HS256"))
    scopes = frozenset({OAuthScope.DOCS_READ, OAuthScope.DOCS_WRITE})
    assert principal == Principal("acme", "user-1", scopes, issuer=ISSUER)


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("build", "reason"),
    [
        (lambda f: f.bearer("RS256"), "bad_algorithm"),
        (lambda f: f.bearer("EdDSA"), "bad_algorithm"),
        (lambda f: f.bearer("none", key=None), "bad_algorithm"),
        (lambda f: f.bearer("HS512", key=DEV_SECRET), "bad_algorithm"),
        (lambda f: f.bearer("HS256", key=b"another-secret-of-at-least-32-bytes!!"), "bad_signature"),
        (lambda f: f.bearer("HS256", key=public_pem(f.rsa)), "bad_signature"),
        (lambda f: f.bearer("HS256", claims={"tenant": "initech"}), "unknown_tenant"),
    ],
    ids=["rs256", "eddsa", "none", "hs512", "wrong-secret", "pem-secret", "unknown-tenant"],
)
async def test_dev_mode_refuses(dev_auth: Authenticator, forge: Forge, build: Build, reason: str) -> None:
    with pytest.raises(AuthError) as caught:
        await dev_auth.authenticate(build(forge))
    assert caught.value.reason == reason


# --- valid tokens


READ_WRITE = frozenset({OAuthScope.DOCS_READ, OAuthScope.DOCS_WRITE})


@pytest.mark.anyio
@pytest.mark.parametrize("alg", ["RS256", "ES256", "EdDSA"])
async def test_each_public_algorithm_is_accepted(auth: Authenticator, forge: Forge, alg: str) -> None:
    assert await auth.authenticate(forge.bearer(alg)) == Principal(
        "acme", "user-1", READ_WRITE, issuer=ISSUER
    )


@pytest.mark.anyio
async def test_ed448_key_is_accepted(auth: Authenticator, forge: Forge) -> None:
    token = forge.bearer("EdDSA", header={"kid": "ed448-1"}, key=forge.ed448)
    assert (await auth.authenticate(token)).tenant == "acme"


@pytest.mark.anyio
@pytest.mark.parametrize(
    "claims",
    [
        {"aud": ["https://other.example", AUDIENCE]},
        {"exp": NOW - 5, "iat": NOW - 600},  # expired 5 s ago: inside the 10 s leeway
        {"iat": NOW + 5},  # issued by a clock 5 s fast
        {"nbf": NOW + 5},
        {"exp": NOW + 600.5, "iat": NOW - 0.25, "nbf": NOW - 1.5},  # NumericDate may be fractional
        {"exp": NOW + 3590},  # lifetime exactly at the maximum
        {"tenant": "a" * 63},
        {"sub": "ünïcode user@example.com"},
    ],
    ids=["aud-list", "leeway-exp", "leeway-iat", "leeway-nbf", "floats", "max-lifetime", "tenant-63", "sub"],
)
async def test_valid_edge_cases_are_accepted(
    make_auth: Callable[..., Authenticator], jwks_file: Path, forge: Forge, claims: dict[str, Any]
) -> None:
    auth = make_auth(jwks_file=jwks_file, known_tenant=lambda tenant: True)
    principal = await auth.authenticate(forge.bearer(claims=claims))
    assert principal.subject == claims.get("sub", "user-1")


@pytest.mark.anyio
@pytest.mark.parametrize(
    "header",
    [
        {"typ": DROP},
        {"typ": "at+jwt"},
        {"typ": "application/at+JWT"},
        {"x5t": "dGh1bWJwcmludA"},  # a thumbprint names nothing the broker would fetch
        {"kid": DROP},  # one RS256 key in the set: unambiguous
    ],
    ids=["no-typ", "at+jwt", "application-at+jwt", "x5t", "no-kid"],
)
async def test_harmless_header_variants_are_accepted(
    auth: Authenticator, forge: Forge, header: dict[str, Any]
) -> None:
    assert (await auth.authenticate(forge.bearer(header=header))).subject == "user-1"


@pytest.mark.anyio
@pytest.mark.parametrize("scheme", ["Bearer", "bearer", "BEARER", "bEaReR"])
async def test_scheme_is_case_insensitive(auth: Authenticator, forge: Forge, scheme: str) -> None:
    assert (await auth.authenticate(f"{scheme} {forge.token()}")).tenant == "acme"


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("claims", "scopes"),
    [
        ({"scope": "docs:read"}, {OAuthScope.DOCS_READ}),
        ({"scope": "docs:read  reports:approve docs:write"}, set(OAuthScope)),
        ({"scope": "docs:read admin openid docs:READ"}, {OAuthScope.DOCS_READ}),
        ({"scope": ""}, set()),
        ({"scope": DROP}, set()),
        (
            {"scope": DROP, "scp": ["docs:write", "reports:approve", "other"]},
            {OAuthScope.DOCS_WRITE, OAuthScope.REPORTS_APPROVE},
        ),
        ({"scope": DROP, "scp": "docs:read docs:write"}, {OAuthScope.DOCS_READ, OAuthScope.DOCS_WRITE}),
        ({"scope": "docs:read", "scp": ["reports:approve"]}, {OAuthScope.DOCS_READ}),
    ],
    ids=["one", "all", "unknown-ignored", "empty", "none", "scp-list", "scp-string", "scope-wins"],
)
async def test_scopes(
    auth: Authenticator, forge: Forge, claims: dict[str, Any], scopes: set[OAuthScope]
) -> None:
    assert (await auth.authenticate(forge.bearer(claims=claims))).scopes == frozenset(scopes)


@pytest.mark.anyio
async def test_algorithm_allow_list_from_settings(
    make_auth: Callable[..., Authenticator], jwks_file: Path, forge: Forge
) -> None:
    only_es = make_auth(jwks_file=jwks_file, algorithms=("ES256",))
    assert (await only_es.authenticate(forge.bearer("ES256"))).tenant == "acme"
    with pytest.raises(AuthError) as caught:
        await only_es.authenticate(forge.bearer("RS256"))
    assert caught.value.reason == "bad_algorithm"


@pytest.mark.anyio
async def test_custom_tenant_claim_and_header_limit(
    make_auth: Callable[..., Authenticator], jwks_file: Path, forge: Forge
) -> None:
    auth = make_auth(jwks_file=jwks_file, tenant_claim="org", max_header_bytes=1024)
    token = forge.bearer(claims={"tenant": DROP, "org": "globex"})
    assert (await auth.authenticate(token)).tenant == "globex"
    with pytest.raises(AuthError) as caught:
        await auth.authenticate(forge.bearer(claims={"org": "globex"}, header={"pad": "x" * 800}))
    assert caught.value.reason == "header_too_large"


# --- helpers for callers


def test_authorization_header_refuses_duplicates() -> None:
    assert authorization_header([]) is None
    assert authorization_header(["Bearer x"]) == "Bearer x"
    with pytest.raises(AuthError) as caught:
        authorization_header(["Bearer a", "Bearer b"])
    assert caught.value.reason == "malformed_token"


def test_bearer_token_accepts_surrounding_whitespace() -> None:
    assert bearer_token("  Bearer\tabc.def.ghi  ") == "abc.def.ghi"


def test_require_scope() -> None:
    principal = Principal("acme", "u", frozenset({OAuthScope.DOCS_READ}))
    require_scope(principal, OAuthScope.DOCS_READ)
    with pytest.raises(AuthError) as caught:
        require_scope(principal, OAuthScope.REPORTS_APPROVE)
    assert (caught.value.status, caught.value.reason) == (403, "insufficient_scope")
    assert caught.value.required_scopes == {OAuthScope.REPORTS_APPROVE}


@pytest.mark.parametrize(
    "overrides",
    [
        {"leeway_seconds": 31},
        {"leeway_seconds": -1},
        {"algorithms": ("RS256", "HS256")},
        {"algorithms": ()},
        {"max_lifetime_seconds": 0},
        {"issuer": ""},
    ],
    ids=["leeway-31", "leeway-negative", "hs256-in-public-mode", "no-algorithms", "lifetime-0", "no-issuer"],
)
def test_unsafe_settings_are_refused(
    make_auth: Callable[..., Authenticator], jwks_file: Path, overrides: dict[str, Any]
) -> None:
    with pytest.raises(SettingsError):
        make_auth(jwks_file=jwks_file, **overrides)
