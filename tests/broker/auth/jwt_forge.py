"""Keys and a raw JWS signer for the auth tests.

The signer writes whatever header and payload it is given — including the hostile ones a
normal JWT library refuses to produce (alg none, non-string kid, duplicate members, HS256
keyed with a PEM) — so the tests can show the broker refusing them.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
from dataclasses import dataclass, field
from typing import Any

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.hazmat.primitives.asymmetric.ec import EllipticCurvePrivateKey
from cryptography.hazmat.primitives.asymmetric.ed448 import Ed448PrivateKey
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.asymmetric.rsa import RSAPrivateKey
from jwt.algorithms import get_default_algorithms

ISSUER = "https://idp.example.com/realms/docs"
AUDIENCE = "https://broker.example.com/mcp"
TENANTS = frozenset({"acme", "globex"})
NOW = 1_800_000_000  # the tests' fixed clock
DEV_SECRET = b"dev-secret-for-tests-0123456789abcdef"
DROP = object()  # as a claim or header value: leave the member out

PrivateKey = RSAPrivateKey | EllipticCurvePrivateKey | Ed25519PrivateKey | Ed448PrivateKey


def b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def dumps(value: Any) -> bytes:
    return json.dumps(value, separators=(",", ":")).encode()


def public_jwk(key: PrivateKey, kid: str | None, **extra: Any) -> dict[str, Any]:
    algs = get_default_algorithms()
    if isinstance(key, RSAPrivateKey):
        jwk = algs["RS256"].to_jwk(key.public_key(), as_dict=True)
    elif isinstance(key, EllipticCurvePrivateKey):
        jwk = algs["ES256"].to_jwk(key.public_key(), as_dict=True)
    else:
        jwk = algs["EdDSA"].to_jwk(key.public_key(), as_dict=True)
    if kid is not None:
        jwk["kid"] = kid
    jwk.update(extra)
    return dict(jwk)


def public_pem(key: PrivateKey) -> bytes:
    return key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )


def sign_raw(header_seg: str, payload_seg: str, alg: str, key: Any) -> str:
    """`header.payload.signature` with the given segments, signed as `alg` with `key`."""
    message = f"{header_seg}.{payload_seg}".encode()
    if key is None:
        signature = b""
    elif alg.startswith("HS"):
        # hmac directly: pyjwt refuses PEM-looking HMAC keys, which is the attack under test.
        digest = {"HS256": hashlib.sha256, "HS384": hashlib.sha384, "HS512": hashlib.sha512}[alg]
        signature = hmac.new(key, message, digest).digest()
    else:
        signature = get_default_algorithms()[alg].sign(message, key)
    return f"{header_seg}.{payload_seg}.{b64(signature)}"


@dataclass
class Forge:
    """Valid tokens by default; every part can be overridden or dropped."""

    rsa: RSAPrivateKey
    rsa_other: RSAPrivateKey
    ec: EllipticCurvePrivateKey
    ed: Ed25519PrivateKey
    ed448: Ed448PrivateKey
    now: int = NOW
    kids: dict[str, str] = field(
        default_factory=lambda: {"RS256": "rsa-1", "ES256": "ec-1", "EdDSA": "ed-1", "HS256": "dev"}
    )

    def jwks(self) -> dict[str, Any]:
        return {
            "keys": [
                public_jwk(self.rsa, "rsa-1", use="sig", alg="RS256"),
                public_jwk(self.ec, "ec-1", use="sig"),
                public_jwk(self.ed, "ed-1"),
                public_jwk(self.ed448, "ed448-1"),
            ]
        }

    def key_for(self, alg: str) -> Any:
        return {"RS256": self.rsa, "ES256": self.ec, "EdDSA": self.ed, "HS256": DEV_SECRET}[alg]

    def claims(self, **overrides: Any) -> dict[str, Any]:
        claims: dict[str, Any] = {
            "iss": ISSUER,
            "aud": AUDIENCE,
            "iat": self.now - 10,
            "exp": self.now + 600,
            "sub": "user-1",
            "tenant": "acme",
            "scope": "docs:read docs:write",
        }
        claims.update(overrides)
        return {k: v for k, v in claims.items() if v is not DROP}

    def header(self, alg: str, overrides: dict[str, Any] | None = None) -> dict[str, Any]:
        header: dict[str, Any] = {"alg": alg, "typ": "JWT", "kid": self.kids.get(alg, "rsa-1")}
        header.update(overrides or {})
        return {k: v for k, v in header.items() if v is not DROP}

    def token(
        self,
        alg: str = "RS256",
        *,
        header: dict[str, Any] | None = None,
        claims: dict[str, Any] | None = None,
        key: Any = DROP,
        sign_as: str | None = None,
    ) -> str:
        """A token; `header`/`claims` override members (DROP removes), `key` replaces the signer."""
        head = self.header(alg, header)
        body = self.claims(**(claims or {}))
        signer = self.key_for(sign_as or alg) if key is DROP else key
        return sign_raw(b64(dumps(head)), b64(dumps(body)), sign_as or alg, signer)

    def bearer(self, *args: Any, **kwargs: Any) -> str:
        return "Bearer " + self.token(*args, **kwargs)


def make_forge() -> Forge:
    return Forge(
        rsa=rsa.generate_private_key(public_exponent=65537, key_size=2048),
        rsa_other=rsa.generate_private_key(public_exponent=65537, key_size=2048),
        ec=ec.generate_private_key(ec.SECP256R1()),
        ed=Ed25519PrivateKey.generate(),
        ed448=Ed448PrivateKey.generate(),
    )
