"""A Docker daemon that stops answering: a unix-socket proxy in front of a real daemon.

    python tests/docker/hung_daemon.py LISTEN_SOCKET UPSTREAM_SOCKET [--frozen]

It relays every connection to the real daemon until SIGUSR1 (or from the start with
`--frozen`); from then on it still accepts connections and reads what clients send, but
forwards nothing and answers nothing, as a daemon that hangs does. It says so on stdout, one
line each, for the test to wait on: `ready`, `frozen`, and `held N` for the Nth request it
swallowed (counted by request lines: a request's head may come in pieces).
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import sys

REQUEST_LINE_END = b" HTTP/1.1\r\n"


class Proxy:
    def __init__(self, upstream: str, frozen: bool) -> None:
        self._upstream = upstream
        self._frozen = asyncio.Event()
        if frozen:
            self._frozen.set()
        self._held = 0

    def freeze(self) -> None:
        self._frozen.set()
        say("frozen")

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        upstream: asyncio.StreamWriter | None = None
        try:
            if not self._frozen.is_set():
                up_reader, upstream = await asyncio.open_unix_connection(self._upstream)
                back = asyncio.create_task(self._pump(up_reader, writer))
            while chunk := await reader.read(65536):
                if self._frozen.is_set() or upstream is None:
                    self._swallow(chunk)
                    continue
                upstream.write(chunk)
                await upstream.drain()
            if upstream is not None:
                back.cancel()
        except (ConnectionError, asyncio.CancelledError):
            pass
        finally:
            for w in (writer, upstream):
                if w is not None:
                    w.close()

    async def _pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError):
            while chunk := await reader.read(65536):
                if self._frozen.is_set():
                    continue  # an answer that was on its way when the daemon "hung": dropped
                writer.write(chunk)
                await writer.drain()

    def _swallow(self, chunk: bytes) -> None:
        for _ in range(chunk.count(REQUEST_LINE_END)):
            self._held += 1
            say(f"held {self._held}")


def say(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


async def main(listen: str, upstream: str, frozen: bool) -> None:
    proxy = Proxy(upstream, frozen)
    server = await asyncio.start_unix_server(proxy.serve, listen)
    asyncio.get_running_loop().add_signal_handler(signal.SIGUSR1, proxy.freeze)
    say("ready")
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], "--frozen" in sys.argv[3:]))
