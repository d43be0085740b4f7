"""Connections to the sandboxes: one pooled HTTP client per endpoint, headers allow-listed.

Only protocol headers cross to the sandbox. The caller's `Authorization` header never does:
the sandbox is not trusted with anyone's credentials.
"""

from __future__ import annotations

from collections.abc import Iterable

import httpx2

from broker.types import Endpoint

# Request headers forwarded to the sandbox (lower-case); `mcp-param-*` is matched by prefix.
FORWARD_REQUEST = frozenset(
    {
        "content-type",
        "accept",
        "mcp-protocol-version",
        "mcp-method",
        "mcp-name",
        "mcp-session-id",
        "last-event-id",
    }
)
PARAM_PREFIX = "mcp-param-"
# Response headers passed back to the client.
FORWARD_RESPONSE = frozenset({"content-type", "mcp-session-id", "cache-control"})


def request_headers(headers: Iterable[tuple[str, str]]) -> dict[str, str]:
    out = {name: value for name, value in headers if name in FORWARD_REQUEST or name.startswith(PARAM_PREFIX)}
    out["host"] = "localhost"
    return out


def response_headers(headers: Iterable[tuple[str, str]]) -> list[tuple[bytes, bytes]]:
    return [(n.encode("latin-1"), v.encode("latin-1")) for n, v in headers if n.lower() in FORWARD_RESPONSE]


class Upstreams:
    """HTTP clients keyed by endpoint, reused across requests (keep-alive over the socket)."""

    def __init__(self, *, connect_timeout: float, call_timeout: float) -> None:
        self._timeout = httpx2.Timeout(call_timeout, connect=connect_timeout)
        self.call_timeout = call_timeout  # also the deadline of a whole call (gateway)
        self._clients: dict[Endpoint, httpx2.AsyncClient] = {}

    def client(self, endpoint: Endpoint) -> httpx2.AsyncClient:
        client = self._clients.get(endpoint)
        if client is None:
            transport = (
                httpx2.AsyncHTTPTransport(uds=endpoint.uds) if endpoint.uds else httpx2.AsyncHTTPTransport()
            )
            client = httpx2.AsyncClient(transport=transport, timeout=self._timeout, trust_env=False)
            self._clients[endpoint] = client
        return client

    async def close(self) -> None:
        clients, self._clients = self._clients, {}
        for client in clients.values():
            await client.aclose()
