"""A unique canary in every place an attacker controls must never come back out: not in an
error's message, repr, traceback or exception chain, and not in any log record."""

from __future__ import annotations

import json
import logging
import os
import secrets
import traceback
from collections.abc import Callable
from pathlib import Path

import pytest

from broker.auth import Authenticator, AuthError, RemoteJWKS, load_key_file
from broker.auth.keys import PUBLIC_ALGORITHMS
from broker.settings import AuthSettings
from tests.broker.auth.jwt_forge import AUDIENCE, ISSUER, Forge, b64, public_jwk, sign_raw

CANARY = "canary-" + secrets.token_hex(8)  # lower-case: also a well-formed tenant id
Build = Callable[[Forge], str]


def _everything_said_about(exc: BaseException) -> str:
    """Messages, reprs and tracebacks of the error and of every exception chained to it."""
    said: list[str] = []
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        said += [str(current), repr(current), *map(repr, current.args), *traceback.format_exception(current)]
        current = current.__cause__ or current.__context__
    return "\n".join(said)


def _tampered(token: str) -> str:
    h, p, s = token.split(".")
    i = len(s) // 2
    return f"Bearer {h}.{p}.{s[:i]}{'A' if s[i] != 'A' else 'B'}{s[i + 1 :]}"


CASES: dict[str, Build] = {
    "whole-token": lambda f: f"Bearer {CANARY}",
    "three-canary-segments": lambda f: f"Bearer {CANARY}.{CANARY}.{CANARY}",
    "scheme": lambda f: f"{CANARY} {f.token()}",
    "second-token": lambda f: f"Bearer {f.token()} {CANARY}",
    "alg": lambda f: f.bearer(header={"alg": CANARY}),
    "kid": lambda f: f.bearer(header={"kid": CANARY}),
    "typ": lambda f: f.bearer(header={"typ": CANARY}),
    "jku": lambda f: f.bearer(header={"jku": f"https://{CANARY}.example/jwks"}),
    "header-duplicate-member": lambda f: (
        "Bearer " + sign_raw(b64(f'{{"alg":"RS256","alg":"{CANARY}"}}'.encode()), b64(b"{}"), "RS256", f.rsa)
    ),
    "header-not-utf8": lambda f: (
        "Bearer " + sign_raw(b64(b'{"alg":"' + CANARY.encode() + b'\xff"}'), b64(b"{}"), "RS256", f.rsa)
    ),
    "header-not-json": lambda f: "Bearer " + sign_raw(b64(CANARY.encode()), b64(b"{}"), "RS256", f.rsa),
    "sub-rs256-bad-signature": lambda f: _tampered(f.token(claims={"sub": CANARY})),
    "sub-eddsa-bad-signature": lambda f: _tampered(f.token("EdDSA", claims={"sub": CANARY})),
    "sub-es256-bad-signature": lambda f: _tampered(f.token("ES256", claims={"sub": CANARY})),
    "iss": lambda f: f.bearer(claims={"iss": CANARY}),
    "aud": lambda f: f.bearer(claims={"aud": [CANARY]}),
    "exp": lambda f: f.bearer(claims={"exp": CANARY}),
    "tenant-bad": lambda f: f.bearer(claims={"tenant": CANARY.upper()}),
    "tenant-unknown": lambda f: f.bearer(claims={"tenant": CANARY}),
    "sub-control-chars": lambda f: f.bearer(claims={"sub": CANARY + "\n"}),
    "payload-not-json": lambda f: (
        "Bearer " + sign_raw(b64(b'{"alg":"RS256","kid":"rsa-1"}'), b64(CANARY.encode()), "RS256", f.rsa)
    ),
    "expired-with-canary-claims": lambda f: f.bearer(
        claims={"exp": 1, "iat": 0, "sub": CANARY, "tenant": CANARY}
    ),
}


@pytest.mark.anyio
@pytest.mark.parametrize("name", list(CASES))
async def test_canary_never_leaves_through_errors_or_logs(
    auth: Authenticator, forge: Forge, name: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    with pytest.raises(AuthError) as caught:
        await auth.authenticate(CASES[name](forge))
    assert CANARY not in _everything_said_about(caught.value)
    assert CANARY.upper() not in _everything_said_about(caught.value)
    assert CANARY not in caplog.text
    assert all(CANARY not in repr(record.args) for record in caplog.records)


@pytest.mark.anyio
async def test_dev_secret_never_leaves(
    make_auth: Callable[..., Authenticator], tmp_path: Path, forge: Forge, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    secret_file = tmp_path / "dev.key"
    secret_file.write_text(CANARY * 3)
    os.chmod(secret_file, 0o600)
    auth = make_auth(dev_hs256_secret_file=secret_file)
    assert (await auth.authenticate(forge.bearer("HS256", key=(CANARY * 3).encode()))).tenant == "acme"
    for token in (forge.bearer("HS256"), forge.bearer("RS256")):
        with pytest.raises(AuthError) as caught:
            await auth.authenticate(token)
        assert CANARY not in _everything_said_about(caught.value)
    assert CANARY not in caplog.text


@pytest.mark.anyio
async def test_jwks_contents_and_url_never_reach_the_log(
    tmp_path: Path, forge: Forge, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    leaked = public_jwk(forge.rsa_other, CANARY) | {"d": CANARY}
    path = tmp_path / "jwks.json"
    path.write_text(json.dumps({"keys": [leaked, public_jwk(forge.rsa, "rsa-1"), {"kty": CANARY}]}))
    load_key_file(path, PUBLIC_ALGORITHMS)
    # Port 9 (discard) on loopback: nothing listens, the fetch fails at once.
    url = f"http://127.0.0.1:9/{CANARY}/jwks?token={CANARY}"
    settings = AuthSettings(issuer=ISSUER, audience=AUDIENCE, jwks_url=url)
    auth = Authenticator(settings, lambda t: True, RemoteJWKS(url, PUBLIC_ALGORITHMS, timeout_seconds=1))
    with pytest.raises(AuthError) as caught:
        await auth.authenticate(forge.bearer())
    assert caught.value.reason == "keys_unavailable"
    assert "private or symmetric material" in caplog.text and "jwks fetch failed" in caplog.text
    assert CANARY not in caplog.text
    assert CANARY not in _everything_said_about(caught.value)
