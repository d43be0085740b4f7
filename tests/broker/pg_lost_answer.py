"""A real PostgreSQL wire proxy that loses one answer: the statement commits, its client never
hears. For tests of "the commit landed, the answer did not" (a client-side timeout, a broken
connection after COMMIT).

It listens on a Unix socket of its own (`url(base)` points a libpq URL at it) and passes every
connection through to the real server's socket, byte for byte. The first time a client sends a
message containing `trigger`, the proxy forwards it, reads the server's answer up to its
ReadyForQuery (by then the statement's implicit transaction has committed), withholds all of it,
and closes both sides: the client sees the connection break with its statement in flight.

The server → client stream is parsed into messages (type byte, 4-byte length), which is exact
for a Unix socket (libpq asks for no SSL or GSS encryption there, so the first byte the server
sends is already a typed message). The client → server stream is searched, not parsed.
"""

from __future__ import annotations

import asyncio
import re
import struct
import tempfile
import threading
from pathlib import Path
from types import TracebackType

from tests.broker.loop_thread import LoopThread, first

_SOCKET = ".s.PGSQL.5432"
_READY_FOR_QUERY = b"Z"


class LostAnswerProxy(LoopThread):
    def __init__(self, upstream_dir: str, trigger: bytes) -> None:
        super().__init__()
        self._upstream = str(Path(upstream_dir) / _SOCKET)
        self._trigger = trigger
        self._dir = tempfile.TemporaryDirectory(prefix="pg-lost-answer-")
        self.armed = True
        self.dropped = threading.Event()  # set once the answer was withheld and the link cut

    def url(self, base: str) -> str:
        """`base` (a libpq URL with `host=<socket dir>`) pointed at this proxy instead."""
        return re.sub(r"host=[^&]+", f"host={self._dir.name}", base)

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        super().__exit__(kind, exc, tb)
        self._dir.cleanup()

    async def _start(self) -> asyncio.Server:
        path = str(Path(self._dir.name) / _SOCKET)
        return await asyncio.start_unix_server(self._handle, path)

    async def _handle(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        try:
            server_r, server_w = await asyncio.open_unix_connection(self._upstream)
        except OSError:
            client_w.close()
            return
        withhold = asyncio.Event()  # the triggering statement went up: its answer stays here
        cut = asyncio.Event()

        async def up() -> None:
            window = b""
            while not cut.is_set():
                chunk = await client_r.read(65536)
                if not chunk:
                    break
                window = (window + chunk)[-(len(chunk) + len(self._trigger)) :]
                if self.armed and self._trigger in window:
                    self.armed = False
                    withhold.set()  # before the bytes go: the answer cannot come back first
                server_w.write(chunk)
                await server_w.drain()

        async def down() -> None:
            buffered = b""
            while not cut.is_set():
                chunk = await server_r.read(65536)
                if not chunk:
                    break
                buffered += chunk
                while len(buffered) >= 5:
                    (length,) = struct.unpack("!I", buffered[1:5])
                    if len(buffered) < 1 + length:
                        break
                    message, buffered = buffered[: 1 + length], buffered[1 + length :]
                    if not withhold.is_set():
                        client_w.write(message)
                    elif message[:1] == _READY_FOR_QUERY:  # committed; the client hears nothing
                        cut.set()
                        self.dropped.set()
                        return
                await client_w.drain()

        try:
            await first(up(), down())
        finally:
            for writer in (client_w, server_w):
                writer.close()
