# Over 450 lines: the connections to sandboxes and their HTTP/1.1 exchange, which share one set of limits.
"""Connections to the sandboxes: pooled keep-alive HTTP/1.1.

This hop is on every call's path, so the client is a small one of our own on asyncio's
protocol API, with llhttp (httptools, the parser uvicorn itself uses) doing all the parsing.
Measured per request (bench/broker_overhead.py), aiohttp and httpx cost several times the CPU
of this client. It speaks what the sandboxes need and nothing more: one
request at a time per connection, bodies sent with Content-Length, responses with
Content-Length, chunked or close-delimited bodies, streamed chunk by chunk (a short
Content-Length body is handed over whole, after one wake-up).

The sandbox is not trusted, so everything it sends is bounded: header bytes and count, the
bytes buffered before the reader takes them (reading pauses above a high-water mark), and
every wait (connect, headers, each body read). A connection that saw anything unexpected
(bytes before a request, a second response, a parse error) is closed, never reused.
Failures surface as `UpstreamError` and its subclasses; the gateway knows nothing else.
Which headers cross is the caller's business (broker.gateway.forwarding).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Mapping
from typing import cast
from urllib.parse import urlsplit

import httptools

from broker.types import Endpoint
from broker.upstream.errors import BodyTooLarge, UpstreamError, UpstreamTimeout, UpstreamUnreachable

MAX_HEADER_BYTES = 64 * 1024  # status line and headers of one response
MAX_HEADERS = 64
HIGH_WATER = 256 * 1024  # body bytes buffered before the reader takes them: reading pauses
IDLE_SECONDS = 2.0  # well under uvicorn's 5 s keep-alive: never reuse a socket it is closing
MAX_IDLE = 16  # idle connections kept per sandbox
# Connections open to one sandbox at once (in use and idle), at most, unless the runtime says
# less (`Upstreams(max_open=...)`): a sandbox past its open-file limit cannot accept, and a
# connection it never accepts is a call that waits for its whole deadline.
MAX_OPEN = 1024
# A body announced at up to this many bytes is read whole before the caller wakes: uvicorn
# sends a head and its body in two writes, and one wake-up per answer instead of two is
# measurably cheaper at low load. Larger or open-ended bodies are handed over as they come.
WHOLE_BODY_BYTES = 64 * 1024


class _Connection(asyncio.Protocol):
    """One keep-alive connection; llhttp calls the `on_*` methods as it parses."""

    def __init__(self) -> None:
        self._transport: asyncio.Transport | None = None
        self._parser = httptools.HttpResponseParser(self)
        self._waiter: asyncio.Future[None] | None = None
        self.closed = False
        self.idle_since = 0.0
        self._active = False  # a request was sent and its response is not yet complete
        self.on_lost: Callable[[], None] | None = None  # the pool's count of open connections
        self._reset()

    def _reset(self) -> None:
        self.status = 0
        self.headers: dict[str, str] = {}
        self._head_bytes = 0
        self._head_done = False
        self._framed = False  # Content-Length or Transfer-Encoding: the body has a known end
        self._small = False  # a short Content-Length body: wake the caller once it is all here
        self._complete = False
        self._keep_alive = False
        self._chunks: deque[bytes] = deque()
        self._buffered = 0
        self._paused = False
        self._error: UpstreamError | None = None

    # -- asyncio.Protocol -------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are not asyncio.Transport subclasses, only alike.
        self._transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        if not self._active:
            self._fail("unsolicited bytes")  # nothing was asked: a sandbox talking out of turn
            return
        try:
            self._parser.feed_data(data)
        except Exception:  # HttpParserError, or one of our callbacks refusing
            self._fail("malformed response")
            return
        if not self._head_done:
            self._head_bytes += len(data)  # llhttp would buffer an endless header line for us
            if self._head_bytes > MAX_HEADER_BYTES:
                self._fail("response head too large")
                return
        elif self._small and not self._complete:
            return  # the rest of a short body is on its way (the caller's wait is still timed)
        self._wake()

    def eof_received(self) -> bool:
        return False  # close our side too

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        lost, self.on_lost = self.on_lost, None  # counted once, whatever calls this again
        if lost is not None:
            lost()
        if self._active and self._head_done and not self._framed and not self._complete:
            self._complete = True  # a close-delimited body ends here
        elif self._active and not self._complete and self._error is None:
            self._error = UpstreamError("sandbox closed the connection")
        self._wake()

    def pause_writing(self) -> None:  # requests are small; the transport buffers them
        pass

    # -- llhttp callbacks -------------------------------------------------------------------

    def on_header(self, name: bytes, value: bytes) -> None:
        if self._head_done:  # a second response to one request: never let it touch the first's
            raise ValueError("a second response to one request")
        if len(self.headers) >= MAX_HEADERS:
            raise ValueError("too many headers")
        self.headers[name.decode("latin-1").lower()] = value.decode("latin-1")

    def on_headers_complete(self) -> None:
        if self._head_done:
            raise ValueError("a second response to one request")
        self.status = self._parser.get_status_code()
        self._framed = "content-length" in self.headers or "transfer-encoding" in self.headers
        length = self.headers.get("content-length", "")
        self._small = (
            "transfer-encoding" not in self.headers
            and length.isascii()
            and length.isdigit()
            and len(length) <= 6
            and int(length) <= WHOLE_BODY_BYTES
        )
        self._head_done = True

    def on_body(self, body: bytes) -> None:
        self._chunks.append(body)
        self._buffered += len(body)
        if self._buffered > HIGH_WATER and not self._paused and self._transport is not None:
            self._paused = True
            self._transport.pause_reading()

    def on_message_complete(self) -> None:
        self._complete = True
        self._keep_alive = self._parser.should_keep_alive()  # llhttp forgets it after this call

    # -- the caller's side ------------------------------------------------------------------

    def send(self, head: bytes, body: bytes | None) -> None:
        assert self._transport is not None and not self._active
        self._reset()
        self._active = True
        self._transport.write(head + body if body else head)

    async def read_head(self, timeout: float) -> None:
        while not self._head_done:
            await self._next(timeout)

    async def body(self, timeout: float) -> AsyncIterator[bytes]:
        while True:
            if self._chunks:
                yield self._take()
            elif self._complete:
                return
            else:
                await self._next(timeout)

    async def whole_body(self, timeout: float, limit: int) -> bytes:
        """The rest of the body, read to its end (a plain loop: no async generator per call)."""
        parts: list[bytes] = []
        size = 0
        while True:
            while self._chunks:
                chunk = self._take()
                size += len(chunk)
                if size > limit:
                    raise BodyTooLarge(f"sandbox answer over {limit} bytes")
                parts.append(chunk)
            if self._complete:
                return parts[0] if len(parts) == 1 else b"".join(parts)
            await self._next(timeout)

    def _take(self) -> bytes:
        chunk = self._chunks.popleft()
        self._buffered -= len(chunk)
        if self._paused and self._buffered <= HIGH_WATER // 2 and self._transport is not None:
            self._paused = False
            self._transport.resume_reading()
        return chunk

    def finish(self) -> bool:
        """End the exchange; True when the connection can carry another request."""
        reusable = (
            self._complete
            and self._error is None
            and not self.closed
            and not self._chunks
            and self._keep_alive
        )
        self._active = False
        if not reusable:
            self.close()
        return reusable

    def close(self) -> None:
        self.closed = True
        if self._transport is not None:
            self._transport.close()

    async def _next(self, timeout: float) -> None:
        """Wait until the parser or the socket has news; raise what went wrong."""
        if self._error is not None:
            raise self._error
        if self.closed and not self._complete:
            raise UpstreamError("sandbox closed the connection")
        loop = asyncio.get_running_loop()
        waiter = self._waiter = loop.create_future()
        timer = loop.call_later(timeout, _expire, waiter)
        try:
            await waiter
        finally:
            timer.cancel()
            self._waiter = None
        if self._error is not None:
            raise self._error

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    def _fail(self, why: str) -> None:
        self._error = self._error or UpstreamError(f"bad response from sandbox: {why}")
        self.close()
        self._wake()


def _expire(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_exception(UpstreamTimeout("sandbox did not answer in time"))


class InFlight:
    """A request on its way: `response()` waits for the head (and must be awaited next)."""

    def __init__(self, upstream: Upstream, conn: _Connection) -> None:
        self._upstream = upstream
        self._conn = conn

    async def response(self) -> UpstreamResponse:
        try:
            await self._conn.read_head(self._upstream.read_timeout)
        except BaseException:
            self._conn.close()  # cancelled or failed half-way: the connection's state is unknown
            raise
        return UpstreamResponse(self._upstream, self._conn)


class UpstreamResponse:
    """A response from a sandbox whose body is read as it arrives."""

    def __init__(self, upstream: Upstream, conn: _Connection) -> None:
        self._upstream = upstream
        self._conn: _Connection | None = conn
        self.status_code = conn.status
        self.headers: Mapping[str, str] = conn.headers  # names lower-cased

    async def aiter_raw(self) -> AsyncIterator[bytes]:
        if self._conn is None:
            raise UpstreamError("response already closed")
        async for chunk in self._conn.body(self._upstream.read_timeout):
            yield chunk

    async def read(self, limit: int) -> bytes:
        """The whole body; BodyTooLarge past `limit` bytes (reading stops there)."""
        if self._conn is None:
            raise UpstreamError("response already closed")
        return await self._conn.whole_body(self._upstream.read_timeout, limit)

    async def aclose(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            self._upstream.release(conn)


class Upstream:
    """The pooled client of one endpoint."""

    def __init__(
        self, endpoint: Endpoint, *, connect_timeout: float, read_timeout: float, max_open: int = MAX_OPEN
    ) -> None:
        url = urlsplit(endpoint.url)
        self.endpoint = endpoint
        self._uds = endpoint.uds
        # Over TCP (the pod network) the sandbox's Host allow-list names its address, and the
        # broker's own credential for it (DESIGN §10) goes along, never a caller's.
        self._fixed: dict[str, str] = {} if endpoint.uds is not None else {"host": url.netloc}
        if endpoint.token:
            self._fixed["authorization"] = f"Bearer {endpoint.token}"
        self._host, self._port = url.hostname or "localhost", url.port or 80
        self._target = (url.path or "/").encode("ascii")
        self._connect_timeout = connect_timeout
        self.read_timeout = read_timeout
        self._idle: list[_Connection] = []
        self._closed = False
        self._max_open = max(1, max_open)
        self._open = 0  # connections open now: in use, idle, or closing (until the loop says lost)
        self._freed = asyncio.Event()  # a connection was given back or lost: a waiter may go on

    async def send(self, method: str, headers: Mapping[str, str], body: bytes | None) -> UpstreamResponse:
        """Send a request and wait for the response's head."""
        return await (await self.start(method, headers, body)).response()

    async def start(self, method: str, headers: Mapping[str, str], body: bytes | None) -> InFlight:
        """Write a request; the response's head is awaited on the returned `InFlight`. Between
        the two, the caller may do its own work that the sandbox's answer does not change, so
        it is done while the sandbox works, not after it answers."""
        if self._fixed:
            headers = {**headers, **self._fixed}
        head = _render(method, self._target, headers, body)
        conn = await self._connection()
        try:
            conn.send(head, body)
        except BaseException:
            conn.close()
            raise
        return InFlight(self, conn)

    @contextlib.asynccontextmanager
    async def stream(
        self, method: str, headers: Mapping[str, str], body: bytes
    ) -> AsyncIterator[UpstreamResponse]:
        response = await self.send(method, headers, body)
        try:
            yield response
        finally:
            await response.aclose()

    def release(self, conn: _Connection) -> None:
        if conn.finish() and not self._closed and len(self._idle) < MAX_IDLE:
            conn.idle_since = time.monotonic()
            self._idle.append(conn)
            self._freed.set()
        else:
            conn.close()

    def _lost(self) -> None:
        self._open -= 1
        self._freed.set()

    async def close(self) -> None:
        self.close_idle()

    def close_idle(self) -> None:
        """Close the idle connections, and every one given back from now on."""
        self._closed = True
        idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()

    async def _connection(self) -> _Connection:
        while True:
            now = time.monotonic()
            while self._idle:
                conn = self._idle.pop()  # the most recent: the least likely to be timing out
                if not conn.closed and now - conn.idle_since < IDLE_SECONDS:
                    return conn
                conn.close()
            if self._open < self._max_open:
                break
            # Every connection the sandbox can take is in use: wait for one to be given back
            # or to end (the caller's deadline bounds the wait, as it bounds the call).
            self._freed.clear()
            await self._freed.wait()
        self._open += 1
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(self._connect_timeout):
                if self._uds is not None:
                    _, conn = await loop.create_unix_connection(_Connection, self._uds)
                else:
                    _, conn = await loop.create_connection(_Connection, self._host, self._port)
        except BaseException as exc:
            self._lost()
            if isinstance(exc, TimeoutError):
                raise UpstreamTimeout("sandbox did not accept the connection in time") from None
            if isinstance(exc, OSError):
                raise UpstreamUnreachable("sandbox connection failed") from exc
            raise
        if conn.closed:  # lost before it was ours to count
            self._lost()
        else:
            conn.on_lost = self._lost
        return conn


def _render(method: str, target: bytes, headers: Mapping[str, str], body: bytes | None) -> bytes:
    fields = "".join(f"{name}: {value}\r\n" for name, value in headers.items() if name != "content-length")
    # Each field line brings exactly one CR and one LF: any more (or a NUL) came from a name or
    # value. uvicorn's parser refuses these already; a header must never split the request.
    lines = fields.count("\n")
    if fields.count("\r") != lines or "\0" in fields or lines != len(headers) - ("content-length" in headers):
        raise UpstreamError("header not forwardable")
    length = b"content-length: %d\r\n" % len(body) if body is not None else b""
    return b"%s %s HTTP/1.1\r\n%s%s\r\n" % (method.encode("ascii"), target, fields.encode("latin-1"), length)


class Upstreams:
    """The pooled client of each tenant's sandbox, reused across requests (keep-alive).

    One per tenant, for the endpoint its sandbox has now. Every replacement (a new Pod IP, a
    warm slot, a restart) brings a new endpoint, and a client kept for each old one would be
    memory that only grows, each holding up to `MAX_IDLE` dead connections: a client goes as
    soon as its sandbox does (`forget`, on the runtime's report) or is replaced (`client`).
    """

    def __init__(self, *, connect_timeout: float, call_timeout: float, max_open: int = MAX_OPEN) -> None:
        self._connect_timeout = connect_timeout
        self.call_timeout = call_timeout  # also the deadline of a whole call (gateway)
        self._max_open = max_open  # connections to one sandbox at once (RuntimeSettings)
        self._clients: dict[str, Upstream] = {}

    def client(self, tenant: str, endpoint: Endpoint) -> Upstream:
        client = self._clients.get(tenant)
        if client is not None and client.endpoint == endpoint:
            return client
        if client is not None:
            client.close_idle()  # a sandbox gone without a word: its calls in flight end alone
        client = Upstream(
            endpoint,
            connect_timeout=self._connect_timeout,
            read_timeout=self.call_timeout,
            max_open=self._max_open,
        )
        self._clients[tenant] = client
        return client

    def forget(self, tenant: str) -> None:
        """The tenant's sandbox is gone (stopped, failed, replaced): its client goes with it.
        Calls still in flight on it finish; their connections are closed, not kept."""
        client = self._clients.pop(tenant, None)
        if client is not None:
            client.close_idle()

    def __len__(self) -> int:
        """How many clients are kept (the `docbroker_upstream_clients` gauge)."""
        return len(self._clients)

    async def close(self) -> None:
        clients, self._clients = self._clients, {}
        for client in clients.values():
            await client.close()
        await asyncio.sleep(0)  # let the transports close before the loop ends
