"""The broker's HTTP protocol: uvicorn's, with each whole response sent in one write.

`OneWriteTransport` is checked against a transport that records what reaches it, and the
protocol end to end in a real uvicorn server over TCP with a raw socket client: whole
answers, streamed answers (a head must not wait for the next chunk), `Connection: close`.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator
from typing import Any

import pytest
import uvicorn

from server.http_protocol import OneWriteHttpToolsProtocol, OneWriteTransport

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


class Recording(asyncio.Transport):
    """The wrapped side: records every write and close, as a socket transport would receive them."""

    def __init__(self) -> None:
        super().__init__()
        self.writes: list[bytes] = []
        self.closed = self.aborted = False

    def write(self, data: Any) -> None:
        self.writes.append(bytes(data))

    def close(self) -> None:
        self.closed = True

    def abort(self) -> None:
        self.aborted = True

    def is_closing(self) -> bool:
        return self.closed or self.aborted

    def get_write_buffer_size(self) -> int:
        return 0


async def next_turn() -> None:
    await asyncio.sleep(0)
    await asyncio.sleep(0)


async def test_two_writes_in_one_step_leave_as_one() -> None:
    raw = Recording()
    transport = OneWriteTransport(raw, asyncio.get_running_loop())
    transport.write(b"HTTP/1.1 200 OK\r\n\r\n")
    assert raw.writes == []  # held for the body that usually follows at once
    assert transport.get_write_buffer_size() == 19
    transport.write(b"body")
    assert raw.writes == [b"HTTP/1.1 200 OK\r\n\r\nbody"]
    await next_turn()
    assert raw.writes == [b"HTTP/1.1 200 OK\r\n\r\nbody"]  # nothing left to flush


async def test_a_lone_write_goes_out_on_the_next_turn() -> None:
    raw = Recording()
    transport = OneWriteTransport(raw, asyncio.get_running_loop())
    transport.write(b"head")
    await next_turn()
    assert raw.writes == [b"head"]
    transport.write(b"chunk 1")
    transport.write(b"chunk 2")
    transport.write(b"end")
    await next_turn()
    assert raw.writes == [b"head", b"chunk 1chunk 2", b"end"]
    assert b"".join(raw.writes) == b"headchunk 1chunk 2end"  # order is kept


async def test_close_sends_what_was_written_and_abort_drops_it() -> None:
    loop = asyncio.get_running_loop()
    raw = Recording()
    transport = OneWriteTransport(raw, loop)
    transport.write(b"HTTP/1.1 400 Bad Request\r\n\r\n")
    transport.close()
    assert raw.writes == [b"HTTP/1.1 400 Bad Request\r\n\r\n"] and raw.closed

    raw = Recording()
    transport = OneWriteTransport(raw, loop)
    transport.write(b"unsent")
    transport.abort()
    await next_turn()
    assert raw.writes == [] and raw.aborted


async def test_nothing_is_written_to_a_closing_transport() -> None:
    raw = Recording()
    transport = OneWriteTransport(raw, asyncio.get_running_loop())
    transport.write(b"late")
    raw.closed = True  # the peer went away before the loop's next turn
    await next_turn()
    assert raw.writes == []


# -- a real uvicorn server with the protocol ------------------------------------------------

stream_may_continue = asyncio.Event()


async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    await receive()
    if scope["path"] == "/stream":
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [(b"content-type", b"text/event-stream")],
            }
        )
        await stream_may_continue.wait()  # set by the client once it has the head
        await send({"type": "http.response.body", "body": b"data: 1\n\n", "more_body": True})
        await send({"type": "http.response.body", "body": b""})
        return
    body = b'{"path":"%s"}' % scope["path"].encode()
    await send(
        {
            "type": "http.response.start",
            "status": 200,
            "headers": [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(body))],
        }
    )
    await send({"type": "http.response.body", "body": body})


@pytest.fixture
async def server() -> AsyncIterator[int]:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = int(probe.getsockname()[1])
    config = uvicorn.Config(
        app, host="127.0.0.1", port=port, log_level="warning", http=OneWriteHttpToolsProtocol, lifespan="off"
    )
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve())
    while not server.started:
        await asyncio.sleep(0.01)
    yield port
    server.should_exit = True
    await asyncio.wait_for(task, 10)


async def read_until(reader: asyncio.StreamReader, marker: bytes) -> bytes:
    return await asyncio.wait_for(reader.readuntil(marker), 5)


async def test_whole_answers_on_one_keep_alive_connection(server: int) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", server)
    try:
        for path in ("/a", "/b", "/c"):
            writer.write(b"GET %s HTTP/1.1\r\nHost: x\r\n\r\n" % path.encode())
            head = await read_until(reader, b"\r\n\r\n")
            assert head.startswith(b"HTTP/1.1 200 OK\r\n") and b"content-length: 13\r\n" in head
            assert await asyncio.wait_for(reader.readexactly(13), 5) == b'{"path":"%s"}' % path.encode()
    finally:
        writer.close()


async def test_a_streamed_head_is_not_held_for_the_first_chunk(server: int) -> None:
    stream_may_continue.clear()
    reader, writer = await asyncio.open_connection("127.0.0.1", server)
    try:
        writer.write(b"GET /stream HTTP/1.1\r\nHost: x\r\n\r\n")
        # The app sends its first chunk only after we have the head: a held head would hang here.
        head = await read_until(reader, b"\r\n\r\n")
        assert b"text/event-stream" in head and b"transfer-encoding: chunked" in head
        stream_may_continue.set()
        assert await read_until(reader, b"0\r\n\r\n") == b"9\r\ndata: 1\n\n\r\n0\r\n\r\n"
    finally:
        writer.close()


async def test_connection_close_gets_the_whole_answer_first(server: int) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", server)
    try:
        writer.write(b"GET /last HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        data = await asyncio.wait_for(reader.read(), 5)  # until the server closes
        assert data.startswith(b"HTTP/1.1 200 OK\r\n") and data.endswith(b'\r\n\r\n{"path":"/last"}')
    finally:
        writer.close()
        with contextlib.suppress(ConnectionError):
            await writer.wait_closed()
