"""RemoteJWKS against a real HTTP server on 127.0.0.1: caching, rotation, the refetch cooldown
under a flood of unknown kids, and hostile or broken IdP answers.

Time for the cache and the cooldown comes from a clock the test moves by hand; the fetch
timeout is measured on the real clock.
"""

from __future__ import annotations

import json
import secrets
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import anyio
import pytest

from broker.auth import Authenticator, AuthError, RemoteJWKS
from broker.settings import AuthSettings, SettingsError
from tests.broker.auth.jwt_forge import AUDIENCE, ISSUER, NOW, TENANTS, Forge, public_jwk

CACHE = 300.0
COOLDOWN = 30.0


@dataclass
class IdP:
    """What the server answers; `requests` counts every GET it received."""

    body: bytes = b"{}"
    mode: str = "ok"
    requests: int = 0
    url: str = ""
    stop: threading.Event = field(default_factory=threading.Event)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def serve(self, jwks: dict[str, Any]) -> None:
        self.body, self.mode = json.dumps(jwks).encode(), "ok"


class _Handler(BaseHTTPRequestHandler):
    server: _Server

    def do_GET(self) -> None:
        idp = self.server.idp
        with idp.lock:
            idp.requests += 1
        mode = idp.mode
        if mode == "hang":
            idp.stop.wait(10)
            return
        if mode == "drip":  # headers at once, then one byte every 100 ms
            self._head(200, {})
            for _ in range(100):
                self.wfile.write(b" ")
                self.wfile.flush()
                if idp.stop.wait(0.1):
                    return
            return
        if mode == "redirect":
            self._head(302, {"Location": "/jwks", "Content-Length": "0"})
            return
        if mode == "oversize-declared":
            body = b'{"keys":[]' + b" " * (70 * 1024) + b"}"
            self._send(200, body, {"Content-Length": str(len(body))})
            return
        if mode == "oversize-streamed":  # no Content-Length: the cap must hold while reading
            self._head(200, {"Connection": "close"})
            for _ in range(80):
                self.wfile.write(b" " * 1024)
            return
        if mode == "gzip":
            self._send(200, idp.body, {"Content-Encoding": "gzip", "Content-Length": str(len(idp.body))})
            return
        if mode == "error":
            self._send(500, b"oops", {"Content-Length": "4"})
            return
        self._send(200, idp.body, {"Content-Length": str(len(idp.body))})

    def _head(self, status: int, headers: dict[str, str]) -> None:
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        for name, value in headers.items():
            self.send_header(name, value)
        self.end_headers()

    def _send(self, status: int, body: bytes, headers: dict[str, str]) -> None:
        self._head(status, headers)
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False  # a hanging handler must not hold up teardown
    idp: IdP


@pytest.fixture
def idp(forge: Forge) -> Iterator[IdP]:
    server = _Server(("127.0.0.1", 0), _Handler)
    server.idp = IdP()
    server.idp.url = f"http://127.0.0.1:{server.server_address[1]}/jwks"
    server.idp.serve({"keys": [public_jwk(forge.rsa, "rsa-1")]})
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)
    thread.start()
    yield server.idp
    server.idp.stop.set()
    server.shutdown()
    server.server_close()
    thread.join(5)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _auth(idp: IdP, clock: Clock, timeout: float = 3.0) -> Authenticator:
    settings = AuthSettings(
        issuer=ISSUER,
        audience=AUDIENCE,
        jwks_url=idp.url,
        jwks_cache_seconds=int(CACHE),
        jwks_refresh_cooldown_seconds=int(COOLDOWN),
        jwks_fetch_timeout_seconds=timeout,
    )
    keys = RemoteJWKS(
        idp.url,
        {"RS256", "ES256", "EdDSA"},
        cache_seconds=CACHE,
        cooldown_seconds=COOLDOWN,
        timeout_seconds=timeout,
        clock=clock,
    )
    return Authenticator(settings, TENANTS.__contains__, keys, clock=lambda: NOW)


async def _reason(auth: Authenticator, token: str) -> str:
    with pytest.raises(AuthError) as caught:
        await auth.authenticate(token)
    return caught.value.reason


@pytest.mark.anyio
async def test_keys_are_cached_until_they_expire(idp: IdP, forge: Forge) -> None:
    clock = Clock()
    auth = _auth(idp, clock)
    for _ in range(20):
        assert (await auth.authenticate(forge.bearer())).tenant == "acme"
    assert idp.requests == 1
    clock.now += CACHE - 1
    await auth.authenticate(forge.bearer())
    assert idp.requests == 1
    clock.now += 2
    await auth.authenticate(forge.bearer())
    assert idp.requests == 2


@pytest.mark.anyio
async def test_rotation_new_kid_costs_one_refetch(idp: IdP, forge: Forge) -> None:
    clock = Clock()
    auth = _auth(idp, clock)
    await auth.authenticate(forge.bearer())
    idp.serve({"keys": [public_jwk(forge.rsa, "rsa-1"), public_jwk(forge.rsa_other, "rsa-2")]})
    rotated = forge.bearer(header={"kid": "rsa-2"}, key=forge.rsa_other)
    # Within the cooldown of the first fetch the new kid is unknown, and the IdP is not asked.
    clock.now += COOLDOWN - 1
    assert await _reason(auth, rotated) == "unknown_key"
    assert idp.requests == 1
    clock.now += 1
    assert (await auth.authenticate(rotated)).tenant == "acme"
    assert idp.requests == 2
    for _ in range(5):
        await auth.authenticate(rotated)
        await auth.authenticate(forge.bearer())
    assert idp.requests == 2


@pytest.mark.anyio
async def test_flood_of_unknown_kids_fetches_at_most_once_per_cooldown(idp: IdP, forge: Forge) -> None:
    clock = Clock()
    auth = _auth(idp, clock)
    await auth.authenticate(forge.bearer())
    assert idp.requests == 1
    reasons: list[str] = []

    async def one() -> None:
        reasons.append(await _reason(auth, forge.bearer(header={"kid": secrets.token_hex(8)})))

    async def flood(n: int) -> None:
        async with anyio.create_task_group() as tg:
            for _ in range(n):
                tg.start_soon(one)

    clock.now += COOLDOWN
    await flood(100)
    assert idp.requests == 2
    await flood(100)
    clock.now += COOLDOWN - 1
    await flood(100)
    assert idp.requests == 2
    clock.now += 1
    await flood(100)
    assert idp.requests == 3
    assert set(reasons) == {"unknown_key"} and len(reasons) == 400
    assert (await auth.authenticate(forge.bearer())).tenant == "acme"  # real tokens unaffected


@pytest.mark.anyio
async def test_concurrent_first_requests_share_one_fetch(idp: IdP, forge: Forge) -> None:
    auth = _auth(idp, Clock())
    tenants: list[str] = []

    async def one() -> None:
        tenants.append((await auth.authenticate(forge.bearer())).tenant)

    async with anyio.create_task_group() as tg:
        for _ in range(50):
            tg.start_soon(one)
    assert tenants == ["acme"] * 50
    assert idp.requests == 1


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("mode", "code"),
    [
        ("oversize-declared", "too_large"),
        ("oversize-streamed", "too_large"),
        ("gzip", "encoded_body"),
        ("error", "http_500"),
        ("redirect", "http_302"),  # never followed
        ("bad-json", "bad_json"),
    ],
)
async def test_broken_answers_leave_no_keys_and_are_retried_after_the_cooldown(
    idp: IdP, forge: Forge, mode: str, code: str, caplog: pytest.LogCaptureFixture
) -> None:
    clock = Clock()
    auth = _auth(idp, clock)
    if mode == "bad-json":
        idp.body = b'{"keys": [ {"kty": "RSA", '
    else:
        idp.mode = mode
    with pytest.raises(AuthError) as caught:
        await auth.authenticate(forge.bearer())
    assert (caught.value.status, caught.value.reason) == (503, "keys_unavailable")
    assert f"jwks fetch failed: {code}" in caplog.text and "127.0.0.1" not in caplog.text
    assert idp.requests == 1
    await _reason(auth, forge.bearer())  # inside the cooldown: no new request
    assert idp.requests == 1
    idp.serve({"keys": [public_jwk(forge.rsa, "rsa-1")]})
    clock.now += COOLDOWN
    assert (await auth.authenticate(forge.bearer())).tenant == "acme"
    assert idp.requests == 2


@pytest.mark.anyio
async def test_failed_refresh_keeps_the_last_good_keys(idp: IdP, forge: Forge) -> None:
    clock = Clock()
    auth = _auth(idp, clock)
    await auth.authenticate(forge.bearer())
    idp.body = b"<html>maintenance</html>"
    clock.now += CACHE + 1
    assert (await auth.authenticate(forge.bearer())).tenant == "acme"
    assert idp.requests == 2


@pytest.mark.anyio
@pytest.mark.parametrize("mode", ["hang", "drip"])
async def test_fetch_timeout_bounds_the_whole_exchange(idp: IdP, forge: Forge, mode: str) -> None:
    idp.mode = mode
    auth = _auth(idp, Clock(), timeout=0.5)
    started = time.monotonic()
    with pytest.raises(AuthError) as caught:
        await auth.authenticate(forge.bearer())
    elapsed = time.monotonic() - started
    assert caught.value.reason == "keys_unavailable"
    assert 0.4 < elapsed < 2.0


@pytest.mark.anyio
async def test_ready_reports_whether_keys_are_held(idp: IdP) -> None:
    clock = Clock()
    idp.mode = "error"
    keys = RemoteJWKS(idp.url, {"RS256"}, cooldown_seconds=COOLDOWN, clock=clock)
    assert await keys.ready() is False
    idp.mode = "ok"
    assert await keys.ready() is False  # still cooling down
    clock.now += COOLDOWN
    assert await keys.ready() is True


@pytest.mark.parametrize(
    "url",
    [
        "http://idp.example.com/jwks",
        "ftp://idp.example.com/jwks",
        "file:///etc/passwd",
        "https:///jwks",
        "jwks",
    ],
)
def test_jwks_url_must_be_https_except_on_loopback(url: str) -> None:
    with pytest.raises(SettingsError, match="AUTH_JWKS_URL"):
        RemoteJWKS(url, {"RS256"})


class _Server6(_Server):
    address_family = socket.AF_INET6


@pytest.mark.anyio
@pytest.mark.parametrize("host", ["127.0.0.1", "[::1]", "localhost"])
async def test_a_loopback_http_jwks_url_is_accepted_and_its_keys_fetched(host: str, forge: Forge) -> None:
    server = (_Server6 if host == "[::1]" else _Server)((host.strip("[]"), 0), _Handler)
    server.idp = IdP()
    server.idp.serve({"keys": [public_jwk(forge.rsa, "rsa-1")]})
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)
    thread.start()
    try:
        keys = RemoteJWKS(f"http://{host}:{server.server_address[1]}/jwks", {"RS256"})
        assert await keys.get_key("rsa-1", "RS256") is not None
        assert server.idp.requests == 1
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


def test_an_https_jwks_url_is_accepted_where_plain_http_is_not() -> None:
    with pytest.raises(SettingsError, match="AUTH_JWKS_URL"):
        RemoteJWKS("http://idp.example.com/jwks", {"RS256"})
    keys = RemoteJWKS("https://idp.example.com/jwks", {"RS256"})
    assert isinstance(keys, RemoteJWKS)  # built, not refused: no fetch until a token needs a key
