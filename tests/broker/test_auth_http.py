"""Hostile and malformed bearer tokens against the real broker over real HTTP (DESIGN §5).

Every token is tried three ways: a raw POST to /mcp (status, challenge, audit reason), the
approvals REST API (same status), and the real `mcp.Client` in both protocol modes (the
client must fail with the error that status maps to, never reach a session).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import httpx2
import pytest
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import padding, rsa
from jwt.algorithms import RSAAlgorithm

from broker.testing import ALL_SCOPES, AUDIENCE, ISSUER, Broker
from tests.broker.support import MODES, last_seq, mcp_error, modern_body, modern_headers, open_http, open_mcp

_DROP = object()
_OTHER_KEY = rsa.generate_private_key(public_exponent=65537, key_size=2048)


def b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def segment(value: dict[str, Any] | bytes) -> str:
    return b64(value if isinstance(value, bytes) else json.dumps(value, separators=(",", ":")).encode())


def claims(**override: Any) -> dict[str, Any]:
    now = int(time.time())
    payload = {
        "iss": ISSUER,
        "aud": AUDIENCE,
        "sub": "mallory",
        "tenant": "acme",
        "scope": ALL_SCOPES,
        "iat": now,
        "exp": now + 600,
        **override,
    }
    return {k: v for k, v in payload.items() if v is not _DROP}


def rs256(key: rsa.RSAPrivateKey, signing_input: str) -> str:
    return b64(key.sign(signing_input.encode(), padding.PKCS1v15(), hashes.SHA256()))


def forge(
    broker: Broker,
    payload: dict[str, Any] | bytes | None = None,
    *,
    key: rsa.RSAPrivateKey | None = None,
    sign: str = "RS256",
    hmac_key: bytes = b"",
    **header: Any,
) -> str:
    """A JWS with exactly this header and payload, signed however the attack needs."""
    head = {"alg": "RS256", "typ": "JWT", "kid": broker.kid, **header}
    head = {k: v for k, v in head.items() if v is not _DROP}
    signing_input = f"{segment(head)}.{segment(claims() if payload is None else payload)}"
    if sign == "none":
        return signing_input + "."
    if sign.startswith("HS"):
        digest = {"HS256": hashlib.sha256, "HS512": hashlib.sha512}[sign]
        return signing_input + "." + b64(hmac.new(hmac_key, signing_input.encode(), digest).digest())
    return signing_input + "." + rs256(key or broker.private_key, signing_input)


def public_pem(broker: Broker) -> bytes:
    return broker.private_key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )


def tamper_payload(token: str, **override: Any) -> str:
    head, payload, sig = token.split(".")
    claims_ = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
    return f"{head}.{segment({**claims_, **override})}.{sig}"


def flip_signature(token: str) -> str:
    head, payload, sig = token.split(".")
    return f"{head}.{payload}.{sig[:10]}{'A' if sig[10] != 'A' else 'B'}{sig[11:]}"


@dataclass(frozen=True)
class Case:
    name: str
    make: Callable[[Broker], str]
    status: int
    reason: str


def _now() -> int:
    return int(time.time())


CASES = [
    # alg "none" and its spellings, with and without a signature
    Case("alg-none", lambda b: forge(b, sign="none", alg="none"), 401, "bad_algorithm"),
    Case("alg-None", lambda b: forge(b, sign="none", alg="None"), 401, "bad_algorithm"),
    Case("alg-NONE", lambda b: forge(b, sign="none", alg="NONE"), 401, "bad_algorithm"),
    Case("alg-nOnE-signed", lambda b: forge(b, alg="nOnE"), 401, "bad_algorithm"),
    Case("alg-missing", lambda b: forge(b, alg=_DROP), 401, "bad_algorithm"),
    Case("alg-rs256-lowercase", lambda b: forge(b, alg="rs256"), 401, "bad_algorithm"),
    # HS/RS confusion: an HMAC keyed with the public key the broker holds
    Case(
        "hs256-keyed-with-public-pem",
        lambda b: forge(b, sign="HS256", alg="HS256", hmac_key=public_pem(b)),
        401,
        "bad_algorithm",
    ),
    Case(
        "hs512-keyed-with-public-pem",
        lambda b: forge(b, sign="HS512", alg="HS512", hmac_key=public_pem(b)),
        401,
        "bad_algorithm",
    ),
    Case(
        "hs256-keyed-with-jwk",
        lambda b: forge(
            b, sign="HS256", alg="HS256", hmac_key=RSAAlgorithm.to_jwk(b.private_key.public_key()).encode()
        ),
        401,
        "bad_algorithm",
    ),
    Case("ps256-not-allowed", lambda b: forge(b, alg="PS256"), 401, "bad_algorithm"),
    # signatures
    Case("signed-by-another-key-same-kid", lambda b: forge(b, key=_OTHER_KEY), 401, "bad_signature"),
    Case(
        "payload-tampered-tenant",
        lambda b: tamper_payload(b.token(tenant="globex"), tenant="acme"),
        401,
        "bad_signature",
    ),
    Case(
        "payload-tampered-scope",
        lambda b: tamper_payload(b.token(scope="docs:read"), scope=ALL_SCOPES),
        401,
        "bad_signature",
    ),
    Case("signature-flipped", lambda b: flip_signature(b.token()), 401, "bad_signature"),
    Case("signature-stripped", lambda b: b.token().rsplit(".", 1)[0] + ".", 401, "bad_signature"),
    # times
    Case("expired", lambda b: b.token(iat=_now() - 900, exp=_now() - 300), 401, "expired"),
    Case("exp-before-iat", lambda b: b.token(iat=_now(), exp=_now() - 1), 401, "expired"),
    Case("nbf-in-future", lambda b: b.token(nbf=_now() + 600), 401, "not_yet_valid"),
    Case("iat-in-future", lambda b: b.token(iat=_now() + 600, exp=_now() + 900), 401, "not_yet_valid"),
    Case("lifetime-too-long", lambda b: b.token(iat=_now(), exp=_now() + 7200), 401, "lifetime_too_long"),
    # missing and mistyped claims
    *[
        Case(f"missing-{claim}", lambda b, c=claim: forge(b, claims(**{c: _DROP})), 401, "missing_claim")
        for claim in ("iss", "aud", "exp", "iat", "sub", "tenant")
    ],
    Case("sub-empty", lambda b: b.token(sub=""), 401, "missing_claim"),
    Case("exp-string", lambda b: forge(b, claims(exp=str(_now() + 600))), 401, "bad_claim_type"),
    Case("iat-bool", lambda b: forge(b, claims(iat=True)), 401, "bad_claim_type"),
    Case("sub-number", lambda b: forge(b, claims(sub=42)), 401, "bad_claim_type"),
    Case("tenant-list", lambda b: forge(b, claims(tenant=["acme"])), 401, "bad_claim_type"),
    Case("scope-list", lambda b: forge(b, claims(scope=["docs:read"])), 401, "bad_claim_type"),
    Case("sub-control-chars", lambda b: b.token(subject="alice\u202eecila"), 401, "bad_subject"),
    Case(
        "duplicate-tenant-member",
        lambda b: forge(
            b,
            json.dumps(claims()).replace('"tenant": "acme"', '"tenant": "acme", "tenant": "globex"').encode(),
        ),
        401,
        "malformed_token",
    ),
    # audience
    Case("aud-wrong", lambda b: b.token(aud="another-service"), 401, "bad_audience"),
    Case("aud-list-without-ours", lambda b: b.token(aud=["a", "another-service"]), 401, "bad_audience"),
    Case("aud-prefix-of-ours", lambda b: b.token(aud=AUDIENCE[:-1]), 401, "bad_audience"),
    Case("aud-list-mistyped", lambda b: b.token(aud=[AUDIENCE, 7]), 401, "bad_claim_type"),
    # issuer: exact match only
    Case("iss-trailing-slash", lambda b: b.token(iss=ISSUER + "/"), 401, "bad_issuer"),
    Case("iss-upper-case", lambda b: b.token(iss=ISSUER.upper()), 401, "bad_issuer"),
    Case("iss-http", lambda b: b.token(iss=ISSUER.replace("https", "http")), 401, "bad_issuer"),
    Case("iss-other-idp", lambda b: b.token(iss="https://evil.test.invalid"), 401, "bad_issuer"),
    # the JOSE header: size, key-carrying members, kid tricks, typ
    Case("header-oversized", lambda b: forge(b, x_pad="p" * 9000), 401, "header_too_large"),
    Case("jku", lambda b: forge(b, jku="https://evil.test.invalid/jwks.json"), 401, "forbidden_header"),
    Case("x5u", lambda b: forge(b, x5u="https://evil.test.invalid/cert.pem"), 401, "forbidden_header"),
    Case(
        "jwk-embedded",
        lambda b: forge(
            b, key=_OTHER_KEY, kid=_DROP, jwk=json.loads(RSAAlgorithm.to_jwk(_OTHER_KEY.public_key()))
        ),
        401,
        "forbidden_header",
    ),
    Case("crit", lambda b: forge(b, crit=["exp"]), 401, "forbidden_header"),
    Case("kid-unknown", lambda b: forge(b, kid="no-such-key"), 401, "unknown_key"),
    Case("kid-path-traversal", lambda b: forge(b, kid="../../../../dev/null"), 401, "unknown_key"),
    Case("kid-not-a-string", lambda b: forge(b, kid=1), 401, "malformed_token"),
    Case("typ-jwe", lambda b: forge(b, typ="JWE"), 401, "bad_token_type"),
    # not a JWS at all
    Case("not-a-jwt", lambda b: "definitely-not-a-token", 401, "malformed_token"),
    Case("five-segments-jwe", lambda b: b.token() + ".a.b", 401, "malformed_token"),
    Case("padded-base64", lambda b: b.token().replace(".", "=.", 1), 401, "malformed_token"),
    # tenants: known ones only, DNS labels only
    Case("unknown-tenant", lambda b: b.token(tenant="initech"), 403, "unknown_tenant"),
    Case("tenant-upper-case", lambda b: b.token(tenant="Acme"), 401, "bad_tenant"),
    Case("tenant-traversal", lambda b: b.token(tenant="../acme"), 401, "bad_tenant"),
    Case("tenant-underscore", lambda b: b.token(tenant="acme_corp"), 401, "bad_tenant"),
    Case("tenant-trailing-dash", lambda b: b.token(tenant="acme-"), 401, "bad_tenant"),
    Case("tenant-empty", lambda b: b.token(tenant=""), 401, "bad_tenant"),
]


def metadata_url(broker: Broker) -> str:
    return f"{broker.url}/.well-known/oauth-protected-resource/mcp"


def assert_refused(broker: Broker, response: httpx2.Response, status: int, token: str | None) -> None:
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith("application/json")
    if token:
        assert token not in response.text
    challenge = response.headers.get("www-authenticate")
    if status == 401:
        assert challenge == f'Bearer error="invalid_token", resource_metadata="{metadata_url(broker)}"'
    else:
        assert challenge is None  # a new token cannot fix an unknown tenant


def test_enough_distinct_hostile_tokens() -> None:
    assert len({c.name for c in CASES}) == len(CASES) >= 25


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_token_refused_on_mcp_with_reason(broker: Broker, case: Case) -> None:
    token = case.make(broker)
    before = last_seq(broker)
    with open_http(broker, token) as http:
        response = http.post("/mcp", json=modern_body("tools/list"), headers=modern_headers("tools/list"))
    assert_refused(broker, response, case.status, token)
    code = -32003 if case.status == 403 else -32600
    assert response.json() == {
        "jsonrpc": "2.0",
        "id": None,
        "error": {"code": code, "message": response.json()["error"]["message"]},
    }
    events = [e for e in broker.audit_events() if e["seq"] > before]
    assert [(e["event"], e["reason"], e["status"]) for e in events] == [
        ("auth.denied", case.reason, case.status)
    ]
    assert "tenant" not in events[0] and "subject" not in events[0]  # nothing from an unverified token


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_token_refused_on_approvals_api(broker: Broker, case: Case) -> None:
    token = case.make(broker)
    with open_http(broker, token) as http:
        response = http.get("/v1/approvals")
    assert_refused(broker, response, case.status, token)
    assert "approvals" not in response.json()


@pytest.mark.anyio
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
async def test_token_refused_by_mcp_client(broker: Broker, case: Case, mode: str) -> None:
    with pytest.raises(BaseException) as raised:
        async with open_mcp(broker, case.make(broker), mode=mode) as client:
            await client.list_tools()
    error = mcp_error(raised.value)
    assert error is not None, raised.value
    assert (error.code, str(error)) == (
        (-32003, "Forbidden") if case.status == 403 else (-32600, "Unauthorized")
    )


@pytest.mark.parametrize(
    ("headers", "reason"),
    [
        ({}, "missing_token"),
        ({"authorization": "Basic YWxpY2U6c2VjcmV0"}, "missing_token"),
        ({"authorization": "Bearer"}, "missing_token"),
        ({"authorization": "Bearer a b"}, "malformed_token"),
    ],
    ids=["no-header", "basic-scheme", "bearer-without-token", "bearer-two-tokens"],
)
def test_missing_or_malformed_authorization_header(
    broker: Broker, headers: dict[str, str], reason: str
) -> None:
    before = last_seq(broker)
    with open_http(broker) as http:
        response = http.post(
            "/mcp", json=modern_body("tools/list"), headers={**modern_headers("tools/list"), **headers}
        )
    assert_refused(broker, response, 401, None)
    assert [(e["event"], e["reason"]) for e in broker.audit_events() if e["seq"] > before] == [
        ("auth.denied", reason)
    ]


def test_two_authorization_headers_are_refused_not_merged(broker: Broker) -> None:
    good = broker.token()
    headers = [
        *modern_headers("tools/list").items(),
        ("authorization", f"Bearer {good}"),
        ("authorization", f"Bearer {good}"),
    ]
    with open_http(broker) as http:
        response = http.post("/mcp", json=modern_body("tools/list"), headers=headers)
    assert_refused(broker, response, 401, good)


def test_bearer_scheme_is_case_insensitive_and_valid_tokens_pass(broker: Broker) -> None:
    """Controls: the checks above refuse what they should, not everything."""
    tokens = {
        "plain": broker.token(),
        "aud-list-with-ours": broker.token(aud=["another-service", AUDIENCE]),
        "nbf-past": broker.token(nbf=_now() - 5),
        "scp-list": forge(broker, claims(scope=_DROP, scp=["docs:read"])),
        "iat-within-leeway": broker.token(iat=_now() + 5, exp=_now() + 600),
    }
    for name, token in tokens.items():
        with open_http(broker) as http:
            response = http.post(
                "/mcp",
                json=modern_body("tools/list"),
                headers={**modern_headers("tools/list"), "authorization": f"bEaReR {token}"},
            )
        assert response.status_code == 200, (name, response.text)


def test_missing_scope_on_approvals_api_is_403_with_scope_challenge(broker: Broker) -> None:
    with open_http(broker, broker.token(scope="docs:read docs:write")) as http:
        response = http.get("/v1/approvals")
    assert response.status_code == 403
    assert response.headers["www-authenticate"] == (
        'Bearer error="insufficient_scope", scope="reports:approve", '
        f'resource_metadata="{metadata_url(broker)}"'
    )
