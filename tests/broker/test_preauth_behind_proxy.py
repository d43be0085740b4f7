"""One flooder behind the ingress must not lock out everyone behind it (issue 24, item 8).

Behind a reverse proxy every client has the proxy's address. Before, once that address's
pre-auth budget was spent, every request through the proxy with a token the broker had not
verified before got 429 until the flood stopped: one client with bad tokens locked every
new session out. Now a token that verifies is always served (the limiter bounds what bad
tokens cost, not the service to good ones), and with `DOCBROKER_TRUSTED_PROXIES` naming the
proxy, each client behind it has a budget of its own, found from the right of
`X-Forwarded-For`; what a client writes there itself is never believed.

A real reverse proxy (`forwarding_proxy.py`) on 127.0.0.2 stands in front of a real broker;
clients come from other loopback addresses (127.0.0.x are all this host).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx2
import pytest

from broker.auth.preauth import TrustedProxies
from broker.settings import Settings, SettingsError
from broker.testing import Broker, running_broker
from tests.broker.forwarding_proxy import ForwardingProxy
from tests.broker.support import events_since, last_seq, modern_body, modern_headers

BURST = 5
PROXY = "127.0.0.2"
ENV = {
    "DOCBROKER_PREAUTH_RATE": "0.01",  # nothing refills during a test
    "DOCBROKER_PREAUTH_BURST": str(BURST),
    "DOCBROKER_PREAUTH_INTERVAL": "1",
}
BOGUS = "Bearer " + "e30." * 3


def via(proxy: ForwardingProxy | Broker, source: str, token: str | None = None) -> httpx2.Client:
    headers = {"authorization": f"Bearer {token}"} if token else {}
    transport = httpx2.HTTPTransport(local_address=source)
    return httpx2.Client(base_url=proxy.url, headers=headers, transport=transport, timeout=30)


def tools_list(http: httpx2.Client, **headers: str) -> int:
    headers = {**modern_headers("tools/list"), **headers}
    return http.post("/mcp", json=modern_body("tools/list"), headers=headers).status_code


def flood(http: httpx2.Client, n: int = BURST + 5, **headers: str) -> list[int]:
    return [tools_list(http, authorization=BOGUS, **headers) for _ in range(n)]


@pytest.fixture
def proxied(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[tuple[Broker, ForwardingProxy]]:
    with running_broker(tmp_path, env=ENV | request.param) as broker:
        port = int(broker.url.rsplit(":", 1)[1])
        with ForwardingProxy(PROXY, ("127.0.0.1", port)) as proxy:
            yield broker, proxy


@pytest.mark.parametrize("proxied", [{}], indirect=True)
def test_a_new_valid_token_behind_a_flooded_proxy_is_served(proxied: tuple[Broker, ForwardingProxy]) -> None:
    broker, proxy = proxied
    before = last_seq(broker)
    with via(proxy, "127.0.0.3") as flooder:
        statuses = flood(flooder)
    assert statuses[:BURST] == [401] * BURST and statuses[BURST:] == [429] * 5  # the proxy's budget is spent

    # Someone else behind the same proxy, with a token the broker has never seen: served.
    with via(proxy, "127.0.0.4", broker.token(subject="new-behind-the-proxy")) as newcomer:
        assert tools_list(newcomer) == 200
    with via(proxy, "127.0.0.3") as flooder:  # and bad tokens from there still cost a 429
        assert flood(flooder, 3) == [429] * 3
    assert proxy.forwarded == len(statuses) + 1 + 3
    broker.stop()
    served = [e for e in events_since(broker, before) if e["event"] == "mcp.request"]
    assert [e["subject"] for e in served] == ["new-behind-the-proxy"]


TRUSTING = {"DOCBROKER_TRUSTED_PROXIES": f"{PROXY}/32, 10.9.0.0/16"}


@pytest.mark.parametrize("proxied", [TRUSTING], indirect=True)
def test_behind_a_trusted_proxy_each_client_has_its_own_budget(
    proxied: tuple[Broker, ForwardingProxy],
) -> None:
    broker, proxy = proxied
    with via(proxy, "127.0.0.3") as flooder:
        # Each request names a fresh address of its own, and one of a trusted range after it:
        # the proxy appends the real peer, and the walk from the right stops there.
        statuses = [
            tools_list(flooder, authorization=BOGUS, **{"x-forwarded-for": f"198.51.100.{n}, 10.9.0.{n}"})
            for n in range(BURST + 5)
        ]
    assert statuses[:BURST] == [401] * BURST and statuses[BURST:] == [429] * 5

    with via(proxy, "127.0.0.4") as neighbour:  # behind the same proxy, a budget of its own
        assert flood(neighbour, BURST) == [401] * BURST
        assert tools_list(neighbour, authorization=BOGUS) == 429
    with via(proxy, "127.0.0.6", broker.token()) as tenant:
        assert tools_list(tenant) == 200

    # A client that is not a trusted proxy cannot pick its address by writing the header.
    with via(broker, "127.0.0.5") as direct:
        spoofed = [
            tools_list(direct, authorization=BOGUS, **{"x-forwarded-for": f"203.0.113.{n}"})
            for n in range(BURST + 3)
        ]
    assert spoofed[:BURST] == [401] * BURST and spoofed[BURST:] == [429] * 3
    assert proxy.forwarded == len(statuses) + BURST + 2


def scope(peer: str, *forwarded: str) -> dict[str, object]:
    return {"client": (peer, 1234), "headers": [(b"x-forwarded-for", v.encode()) for v in forwarded]}


def client_of(proxies: TrustedProxies, peer: str, *forwarded: str) -> str:
    request = scope(peer, *forwarded)
    proxies.rewrite(request)
    client = request["client"]
    assert isinstance(client, tuple)
    return str(client[0])


@pytest.mark.parametrize(
    ("peer", "forwarded", "client"),
    [
        ("10.0.0.9", ("1.2.3.4",), "10.0.0.9"),  # not a proxy: its header is the client's word
        ("10.1.0.1", (), "10.1.0.1"),  # a proxy that says nothing
        ("10.1.0.1", ("1.2.3.4",), "1.2.3.4"),
        ("10.1.0.1", ("9.9.9.9, 1.2.3.4",), "1.2.3.4"),  # left of the proxy's hop: the client's words
        ("10.1.0.1", ("9.9.9.9, 1.2.3.4, 10.1.0.7",), "1.2.3.4"),  # a chain of trusted proxies
        ("10.1.0.1", ("9.9.9.9", "1.2.3.4, 10.1.0.7"), "1.2.3.4"),  # several headers: one list
        ("10.1.0.1", ("10.1.0.5, 10.1.0.7",), "10.1.0.5"),  # all proxies: the farthest one
        ("10.1.0.1", ("1.2.3.4, unknown",), "10.1.0.1"),  # garbage from a proxy: stop at it
        ("10.1.0.1", ("9.9.9.9, 1.2.3.4:5678",), "1.2.3.4"),
        ("10.1.0.1", ("[2001:db8::1]:443",), "2001:db8::1"),
        ("10.1.0.1", ("::ffff:1.2.3.4",), "1.2.3.4"),
        ("::ffff:10.1.0.1", ("1.2.3.4",), "1.2.3.4"),
    ],
)
def test_the_client_is_the_right_most_address_that_is_not_a_trusted_proxy(
    peer: str, forwarded: tuple[str, ...], client: str
) -> None:
    settings = Settings.from_env(SETTINGS_BASE | {"DOCBROKER_TRUSTED_PROXIES": "10.1.0.0/16"})
    proxies = TrustedProxies(settings.preauth.trusted_proxies)
    assert client_of(proxies, peer, *forwarded) == client
    assert client_of(TrustedProxies(()), "10.1.0.1", "1.2.3.4") == "10.1.0.1"  # none configured


SETTINGS_BASE = {
    "DOCBROKER_AUTH_ISSUER": "https://issuer.example",
    "DOCBROKER_AUTH_AUDIENCE": "docbroker",
    "DOCBROKER_AUTH_JWKS_URL": "https://issuer.example/jwks.json",
}


@pytest.mark.parametrize("value", ["0.0.0.0/0", "::/0", "10.0.0.1/8", "proxy.internal", "10.0.0.1,,"])
def test_bad_trusted_proxies_are_refused_naming_the_variable_only(value: str) -> None:
    with pytest.raises(SettingsError) as caught:
        Settings.from_env(SETTINGS_BASE | {"DOCBROKER_TRUSTED_PROXIES": value})
    message = str(caught.value)
    assert "DOCBROKER_TRUSTED_PROXIES" in message and value not in message
