"""A real reverse proxy for tests: what nginx does with
`proxy_set_header X-Forwarded-For $proxy_add_x_forwarded_for`, in a thread of its own.

It listens on `host`, connects to the upstream *from* `host` (so the broker sees every client
at the proxy's address, as behind an ingress), and appends its peer's address to whatever
`X-Forwarded-For` the client sent. One request per client connection, answered verbatim
(`Connection: close` both ways) as the upstream writes it, so an event stream flows; a client
that hangs up ends its upstream connection too (as a proxy drops a stream nobody reads).

With `authorization`, it is also an authenticating proxy: it sets that `Authorization` on a
request that comes without one and keeps the one a client sent (as proxies that "set the header
if absent" do), so a page that sent an empty one would be refused, not rescued.
"""

from __future__ import annotations

import asyncio
from typing import Self

from tests.broker.loop_thread import LoopThread, first

_MAX_HEAD = 256 * 1024


class ForwardingProxy(LoopThread):
    def __init__(self, host: str, upstream: tuple[str, int], *, authorization: str | None = None) -> None:
        super().__init__()
        self.host = host
        self.port = 0
        self.upstream = upstream
        self._authorization = authorization.encode("latin-1") if authorization is not None else None
        self.forwarded = 0  # requests passed on (a test can see the proxy was on the path)
        self.injected = 0  # of those, how many got the proxy's Authorization
        self.client_authorized = 0  # how many came with an Authorization of their own (kept)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def __enter__(self) -> Self:
        super().__enter__()
        assert self._server is not None
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def _start(self) -> asyncio.Server:
        return await asyncio.start_server(self._handle, self.host, 0, limit=_MAX_HEAD)

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peer = writer.get_extra_info("peername")[0]
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            request_line, *fields = head[:-4].split(b"\r\n")
            forwarded, kept, length, authorized = [], [], 0, False
            for field in fields:
                name, _, value = field.partition(b":")
                key = name.strip().lower()
                if key == b"x-forwarded-for":
                    forwarded.append(value.strip())
                elif key != b"connection":
                    kept.append(field)
                if key == b"content-length":
                    length = int(value)
                authorized = authorized or key == b"authorization"
            forwarded.append(peer.encode())
            kept += [b"x-forwarded-for: " + b", ".join(forwarded), b"connection: close"]
            if authorized:
                self.client_authorized += 1
            elif self._authorization is not None:
                kept.append(b"authorization: " + self._authorization)
                self.injected += 1
            body = await reader.readexactly(length)
            up_reader, up_writer = await asyncio.open_connection(*self.upstream, local_addr=(self.host, 0))
            up_writer.write(b"\r\n".join([request_line, *kept]) + b"\r\n\r\n" + body)
            self.forwarded += 1
            try:
                # The client sends nothing after its request: a read that ends is its hang-up.
                await first(_copy(up_reader, writer), reader.read(1))
            finally:
                up_writer.close()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()


async def _copy(source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
    """The upstream's answer to the client, chunk by chunk, to the upstream's close."""
    while chunk := await source.read(64 * 1024):
        sink.write(chunk)
        await sink.drain()
