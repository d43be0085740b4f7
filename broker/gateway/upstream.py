"""Connections to the sandboxes: one pooled HTTP client per endpoint, headers allow-listed.

Only protocol headers cross to the sandbox. The caller's `Authorization` header never does:
the sandbox is not trusted with anyone's credentials.

The client is aiohttp (C-accelerated HTTP parsing, keep-alive over the unix socket): this hop
is on every call's path, and measured per request it costs ~0.3 ms of CPU where httpx2 cost
~2 ms (bench/broker_overhead.py). Its errors are translated here, at the boundary, into
`UpstreamError` / `UpstreamTimeout`, so the gateway knows nothing of the library.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterable, Iterator, Mapping

import aiohttp

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
_NO_AUTO_HEADERS = ("User-Agent", "Accept-Encoding")


class UpstreamError(Exception):
    """The sandbox could not be reached, or the connection broke."""


class UpstreamTimeout(UpstreamError):
    """The sandbox did not answer in time."""


def request_headers(headers: Iterable[tuple[str, str]]) -> dict[str, str]:
    out = {name: value for name, value in headers if name in FORWARD_REQUEST or name.startswith(PARAM_PREFIX)}
    out["host"] = "localhost"
    return out


def response_headers(headers: Iterable[tuple[str, str]]) -> list[tuple[bytes, bytes]]:
    return [(n.encode("latin-1"), v.encode("latin-1")) for n, v in headers if n.lower() in FORWARD_RESPONSE]


@contextlib.contextmanager
def _translated() -> Iterator[None]:
    try:
        yield
    except (TimeoutError, aiohttp.ServerTimeoutError) as exc:
        raise UpstreamTimeout("sandbox did not answer in time") from exc
    except (aiohttp.ClientError, OSError) as exc:
        raise UpstreamError("sandbox connection failed") from exc


class UpstreamResponse:
    """A streamed response from a sandbox."""

    def __init__(self, response: aiohttp.ClientResponse) -> None:
        self._response = response

    @property
    def status_code(self) -> int:
        return self._response.status

    @property
    def headers(self) -> Mapping[str, str]:
        return self._response.headers  # case-insensitive

    async def aiter_raw(self) -> AsyncIterator[bytes]:
        with _translated():
            async for chunk in self._response.content.iter_any():
                yield chunk

    async def aclose(self) -> None:
        self._response.release()


class Upstream:
    """The pooled client of one endpoint."""

    def __init__(self, endpoint: Endpoint, *, connect_timeout: float, read_timeout: float) -> None:
        connector: aiohttp.BaseConnector = (
            aiohttp.UnixConnector(path=endpoint.uds, limit=64)
            if endpoint.uds
            else aiohttp.TCPConnector(limit=64, use_dns_cache=False)
        )
        self._session = aiohttp.ClientSession(
            connector=connector,
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=connect_timeout, sock_read=read_timeout),
            auto_decompress=False,
            skip_auto_headers=_NO_AUTO_HEADERS,
            trust_env=False,
        )
        self._url = endpoint.url

    async def send(self, method: str, headers: Mapping[str, str], body: bytes | None) -> UpstreamResponse:
        with _translated():
            response = await self._session.request(method, self._url, headers=dict(headers), data=body)
        return UpstreamResponse(response)

    @contextlib.asynccontextmanager
    async def stream(
        self, method: str, headers: Mapping[str, str], body: bytes
    ) -> AsyncIterator[UpstreamResponse]:
        response = await self.send(method, headers, body)
        try:
            yield response
        finally:
            await response.aclose()

    async def close(self) -> None:
        await self._session.close()


class Upstreams:
    """Clients keyed by endpoint, reused across requests (keep-alive over the socket)."""

    def __init__(self, *, connect_timeout: float, call_timeout: float) -> None:
        self._connect_timeout = connect_timeout
        self.call_timeout = call_timeout  # also the deadline of a whole call (gateway)
        self._clients: dict[Endpoint, Upstream] = {}

    def client(self, endpoint: Endpoint) -> Upstream:
        client = self._clients.get(endpoint)
        if client is None:
            client = Upstream(endpoint, connect_timeout=self._connect_timeout, read_timeout=self.call_timeout)
            self._clients[endpoint] = client
        return client

    async def close(self) -> None:
        clients, self._clients = self._clients, {}
        for client in clients.values():
            await client.close()
        await asyncio.sleep(0)  # let aiohttp close its transports before the loop ends
