"""The broker's HTTP client for the sandbox hop, against a real socket server that misbehaves.

`broker.upstream` parses what an untrusted sandbox sends on every call. These tests
serve scripted bytes on a real unix socket and check that every answer is bounded, that a
connection is reused only after a clean exchange, and that failures are `UpstreamError` /
`UpstreamTimeout`: never a hang, never anything else.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import pytest

from broker.types import Endpoint
from broker.upstream import client as up

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@dataclass(frozen=True)
class Answer:
    data: bytes = b""
    close: bool = False  # close the connection after writing `data`
    hold: bool = False  # write `data`, then say nothing more and keep the socket open
    rest: bytes = b""  # written after `data` once the test sets `Sandbox.go_on`


def ok(body: bytes = b'{"ok":true}', *, extra: bytes = b"") -> Answer:
    head = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n" % len(body)
    return Answer(head + extra + b"\r\n" + body)


Reply = Callable[[int], Answer]  # the request's number (from 1) -> what the sandbox does


class Sandbox:
    """A unix-socket server that answers the n-th request with `reply(n)`."""

    def __init__(self, path: Path, reply: Reply) -> None:
        self.path = path
        self.reply = reply
        self.connections = 0
        self.ended = 0  # connections the broker's side closed (or this side ended)
        self.requests: list[bytes] = []
        self._writers: list[asyncio.StreamWriter] = []
        self._server: asyncio.AbstractServer | None = None
        self.go_on = asyncio.Event()
        self.hung_up = asyncio.Event()  # a client closed a connection
        self.holding = asyncio.Event()  # an answer's `data` is written, its `rest` held back

    def unsent(self) -> int:
        """Bytes written but not yet taken by the socket: the client has stopped reading."""
        return sum(w.transport.get_write_buffer_size() for w in self._writers if not w.is_closing())

    async def start(self) -> None:
        self._server = await asyncio.start_unix_server(self._serve, path=str(self.path))

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        self._writers.append(writer)
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n"):
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":")[1])
                self.requests.append(head + await reader.readexactly(length))
                answer = self.reply(len(self.requests))
                writer.write(answer.data)
                await writer.drain()
                if answer.rest:
                    self.holding.set()
                    await self.go_on.wait()
                    writer.write(answer.rest)
                    await writer.drain()
                if answer.close:
                    break
                if answer.hold:
                    await asyncio.sleep(3600)
        except (asyncio.IncompleteReadError, ConnectionError):
            self.hung_up.set()
        finally:
            self.ended += 1
            writer.close()

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for writer in self._writers:
            writer.close()


class Serve(Protocol):
    async def __call__(
        self, reply: Reply, *, read_timeout: float = 2.0, max_open: int = up.MAX_OPEN
    ) -> tuple[Sandbox, up.Upstream]: ...


@pytest.fixture
async def serve(tmp_path: Path) -> AsyncIterator[Serve]:
    started: list[tuple[Sandbox, up.Upstream]] = []

    async def make(
        reply: Reply, *, read_timeout: float = 2.0, max_open: int = up.MAX_OPEN
    ) -> tuple[Sandbox, up.Upstream]:
        sandbox = Sandbox(tmp_path / f"s{len(started)}.sock", reply)
        await sandbox.start()
        endpoint = Endpoint(url="http://localhost/mcp", uds=str(sandbox.path))
        client = up.Upstream(endpoint, connect_timeout=2.0, read_timeout=read_timeout, max_open=max_open)
        started.append((sandbox, client))
        return sandbox, client

    yield make
    for sandbox, client in started:
        await client.close()
        await sandbox.close()


async def fetch(client: up.Upstream, body: bytes = b"{}") -> tuple[int, dict[str, str], bytes]:
    response = await client.send("POST", {"content-type": "application/json"}, body)
    try:
        chunks = [chunk async for chunk in response.aiter_raw()]
        return response.status_code, dict(response.headers), b"".join(chunks)
    finally:
        await response.aclose()


async def test_clean_exchanges_share_one_connection(serve: Serve) -> None:
    sandbox, client = await serve(lambda n: ok(b'{"n":%d}' % n, extra=b"Mcp-Session-Id: s1\r\n"))
    for n in (1, 2, 3):
        status, headers, body = await fetch(client, b'{"call":%d}' % n)
        assert (status, body) == (200, b'{"n":%d}' % n)
        assert headers["mcp-session-id"] == "s1"  # names lower-cased
    assert sandbox.connections == 1
    assert sandbox.requests[0].startswith(b"POST /mcp HTTP/1.1\r\n")
    assert sandbox.requests[0].endswith(b'content-length: 10\r\n\r\n{"call":1}')


async def test_calls_past_what_a_sandbox_can_accept_wait_for_a_connection_not_a_new_one(serve: Serve) -> None:
    """30 calls at once against a sandbox that takes 8 connections (its open files): the
    client never opens a ninth; the other calls go on the first eight as they come back.
    (Unbounded, each call opened its own: a sandbox past its file limit accepts none of them,
    and those calls waited out their whole deadline.)"""
    body = b'{"ok":true}'
    head = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n" % len(body)
    sandbox, client = await serve(lambda n: Answer(head, rest=body), max_open=8)
    calls = [asyncio.create_task(fetch(client)) for _ in range(30)]
    async with asyncio.timeout(10):
        while not (sandbox.holding.is_set() and len(sandbox.requests) == 8):
            await asyncio.sleep(0.01)  # polled: eight calls sent and held by the sandbox
        assert sum(not c.done() for c in calls) == 30  # the race entered: all 30 in flight
        sandbox.go_on.set()
        answers = await asyncio.gather(*calls)
    assert [status for status, _, b in answers if b == body] == [200] * 30
    assert sandbox.connections == 8


async def test_a_connection_the_sandbox_closes_frees_its_place(serve: Serve) -> None:
    """Connections the sandbox ends after each answer are counted gone (else the client would
    wait forever for a place): 20 calls at once through two places all answer."""
    closing = Answer(ok(extra=b"connection: close\r\n").data, close=True)
    sandbox, client = await serve(lambda n: closing, max_open=2)
    async with asyncio.timeout(10):
        answers = await asyncio.gather(*(fetch(client) for _ in range(20)))
    assert [status for status, _, _ in answers] == [200] * 20
    assert sandbox.connections == 20  # one per call: none was reused after its close


async def test_chunked_and_close_delimited_bodies_are_read_whole(serve: Serve) -> None:
    chunked = b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n"
    until_close = Answer(b"HTTP/1.1 200 OK\r\n\r\nuntil the end", close=True)
    sandbox, client = await serve(lambda n: Answer(chunked) if n == 1 else until_close)
    assert (await fetch(client))[2] == b"hello world"
    assert (await fetch(client))[2] == b"until the end"
    assert (await fetch(client))[2] == b"until the end"  # on a new connection: the last one closed
    assert sandbox.connections == 2


async def test_a_body_cut_short_is_an_error_and_the_next_call_reconnects(serve: Serve) -> None:
    cut = Answer(b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\nshort", close=True)
    sandbox, client = await serve(lambda n: cut if n == 1 else ok())
    with pytest.raises(up.UpstreamError):
        await fetch(client)
    assert (await fetch(client))[2] == b'{"ok":true}'
    assert sandbox.connections == 2


async def test_closing_before_any_answer_is_an_error(serve: Serve) -> None:
    _, client = await serve(lambda n: Answer(close=True))
    with pytest.raises(up.UpstreamError) as caught:
        await fetch(client)
    assert not isinstance(caught.value, up.UpstreamTimeout)


@pytest.mark.parametrize(
    "answer",
    [
        Answer(b"HTTP/1.1 200 OK\r\n", hold=True),  # a head that never ends
        Answer(b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\nfive.", hold=True),  # a body that stalls
        Answer(hold=True),  # silence
    ],
    ids=["head", "body", "silence"],
)
async def test_a_stalled_sandbox_times_out(serve: Serve, answer: Answer) -> None:
    sandbox, client = await serve(lambda n: answer if n == 1 else ok(), read_timeout=0.3)
    started = asyncio.get_running_loop().time()
    with pytest.raises(up.UpstreamTimeout):
        await fetch(client)
    assert asyncio.get_running_loop().time() - started < 2.0
    assert (await fetch(client))[2] == b'{"ok":true}'  # the stalled connection is not reused
    assert sandbox.connections == 2


@pytest.mark.parametrize(
    "data",
    [
        b"HTTP/1.1 200 OK\r\nx-pad: " + b"a" * (up.MAX_HEADER_BYTES + 10) + b"\r\n\r\n",
        b"HTTP/1.1 200 OK\r\n" + b"".join(b"x-%d: 1\r\n" % i for i in range(up.MAX_HEADERS + 1)) + b"\r\n",
        b"SSH-2.0-OpenSSH\r\n\r\n",
        b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\ncontent-length: 3\r\n\r\nabc",
        b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\nzz\r\n",
    ],
    ids=["huge-head", "many-headers", "not-http", "two-lengths", "bad-chunk"],
)
async def test_a_malformed_answer_is_an_error(serve: Serve, data: bytes) -> None:
    sandbox, client = await serve(lambda n: Answer(data, hold=True) if n == 1 else ok())
    with pytest.raises(up.UpstreamError):
        await fetch(client)
    assert (await fetch(client))[2] == b'{"ok":true}'
    assert sandbox.connections == 2


async def test_a_short_body_is_awaited_whole_and_a_long_one_streams(serve: Serve) -> None:
    short_head = b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\n"
    long_size = up.WHOLE_BODY_BYTES + 1
    long_head = b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n" % long_size
    answers = {
        1: Answer(short_head, rest=b"0123456789"),
        2: Answer(long_head + b"x", rest=b"y" * (long_size - 1)),
    }
    sandbox, client = await serve(lambda n: answers[n])

    # A short answer: one wake-up for head and body, so `send` is still waiting for the body.
    sending = asyncio.create_task(client.send("POST", {}, b"{}"))
    async with asyncio.timeout(5):  # the head is written, the rest held back
        await sandbox.holding.wait()
    for _ in range(5):  # the loop's next turns deliver what is already in the socket
        await asyncio.sleep(0)
    assert not sending.done()
    sandbox.go_on.set()
    response = await asyncio.wait_for(sending, 5)
    assert b"".join([c async for c in response.aiter_raw()]) == b"0123456789"
    await response.aclose()

    # A long one is handed over as it comes: `send` returns with the head alone.
    sandbox.go_on.clear()
    response = await asyncio.wait_for(client.send("POST", {}, b"{}"), 5)
    sandbox.go_on.set()
    body = b"".join([c async for c in response.aiter_raw()])
    await response.aclose()
    assert len(body) == long_size and body.startswith(b"xy")
    assert sandbox.connections == 1


async def test_a_second_unasked_answer_poisons_the_connection(serve: Serve) -> None:
    two = Answer(ok(b"one").data + ok(b"two").data)
    sandbox, client = await serve(lambda n: two if n == 1 else ok())
    body = b""
    try:
        body = (await fetch(client))[2]
    except up.UpstreamError:
        pass  # seen in the same read: the whole exchange is refused
    assert body in (b"", b"one")
    assert (await fetch(client))[2] == b'{"ok":true}'  # never "two"
    assert sandbox.connections == 2


async def test_bytes_sent_between_calls_close_the_idle_connection(serve: Serve) -> None:
    # The first answer ends, then more bytes follow on the idle connection.
    sneaky = Answer(ok(b"first").data)
    sandbox, client = await serve(lambda n: sneaky if n == 1 else ok())
    assert (await fetch(client))[2] == b"first"
    for writer in sandbox._writers:
        writer.write(ok(b"planted").data)
    async with asyncio.timeout(5):  # the client has seen them and hung up
        await sandbox.hung_up.wait()
    assert (await fetch(client))[2] == b'{"ok":true}'
    assert sandbox.connections == 2


async def test_a_large_body_streams_with_bounded_buffering(serve: Serve) -> None:
    big = b"x" * (8 * up.HIGH_WATER)
    sandbox, client = await serve(lambda n: ok(big))
    response = await client.send("POST", {}, b"{}")
    try:
        conn = response._conn
        assert conn is not None
        # The race entered: the client has stopped reading while the sandbox still has bytes it
        # cannot send (a client that never pauses takes all 2 MiB and this wait fails).
        async with asyncio.timeout(5):
            while not conn._paused:
                await asyncio.sleep(0.01)
        assert sandbox.unsent() > 0
        assert conn._buffered <= up.HIGH_WATER + 256 * 1024
        received = b"".join([chunk async for chunk in response.aiter_raw()])
    finally:
        await response.aclose()
    assert received == big


async def test_idle_connections_expire_before_the_sandbox_drops_them(
    serve: Serve, monkeypatch: pytest.MonkeyPatch
) -> None:
    sandbox, client = await serve(lambda n: ok())
    await fetch(client)
    monkeypatch.setattr(up, "IDLE_SECONDS", 0.05)
    await asyncio.sleep(0.1)
    await fetch(client)
    assert sandbox.connections == 2


async def test_a_header_that_would_split_the_request_is_refused(serve: Serve) -> None:
    sandbox, client = await serve(lambda n: ok())
    for value in ("a\r\nx-injected: 1", "a\nb", "a\0b"):
        with pytest.raises(up.UpstreamError):
            await client.send("POST", {"mcp-name": value}, b"{}")
    assert sandbox.requests == []


async def test_an_absent_socket_is_an_upstream_error(tmp_path: Path) -> None:
    endpoint = Endpoint(url="http://localhost/mcp", uds=str(tmp_path / "missing.sock"))
    client = up.Upstream(endpoint, connect_timeout=1.0, read_timeout=1.0)
    with pytest.raises(up.UpstreamUnreachable):  # nothing sent: the gateway may send it elsewhere
        await client.send("POST", {}, b"{}")


async def test_a_socket_nobody_listens_on_is_unreachable_but_a_cut_answer_is_not(
    serve: Serve, tmp_path: Path
) -> None:
    """A sandbox gone (its socket file left behind) is told apart from one that took the request."""
    import socket

    stale = tmp_path / "stale.sock"
    with socket.socket(socket.AF_UNIX) as sock:
        sock.bind(str(stale))  # bound, never listening, then closed: connecting is refused
    client = up.Upstream(
        Endpoint(url="http://localhost/mcp", uds=str(stale)), connect_timeout=1.0, read_timeout=1.0
    )
    with pytest.raises(up.UpstreamUnreachable):
        await client.send("POST", {}, b"{}")
    _, cut = await serve(lambda n: Answer(close=True))
    with pytest.raises(up.UpstreamError) as caught:
        await fetch(cut)
    assert not isinstance(caught.value, up.UpstreamUnreachable)


async def test_cancelling_a_call_leaves_nothing_half_read_in_the_pool(serve: Serve) -> None:
    sandbox, client = await serve(lambda n: Answer(hold=True) if n == 1 else ok())
    task = asyncio.ensure_future(fetch(client))
    await asyncio.sleep(0.1)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert (await fetch(client))[2] == b'{"ok":true}'
    assert sandbox.connections == 2


async def test_read_takes_the_whole_body_and_stops_past_its_limit(serve: Serve) -> None:
    big = b"x" * (8 * up.HIGH_WATER)  # many chunks, reading paused and resumed on the way
    _, client = await serve(lambda n: ok(big) if n == 1 else ok(b"y" * 1001))
    response = await client.send("POST", {}, b"{}")
    try:
        assert await response.read(len(big)) == big
    finally:
        await response.aclose()
    response = await client.send("POST", {}, b"{}")
    try:
        with pytest.raises(up.BodyTooLarge):
            await response.read(1000)
    finally:
        await response.aclose()
    with pytest.raises(up.UpstreamError, match="closed"):
        await response.read(1000)


@pytest.mark.parametrize(
    "headers",
    [
        {"mcp-name": "x\r\nmcp-method: tools/call"},
        {"mcp-name": "x\nmcp-method: tools/call"},
        {"mcp-name": "x\r"},
        {"mcp-name": "x\0"},
        {"mcp-param-a\r\nb": "x"},
    ],
    ids=["crlf-in-value", "lf-in-value", "cr-in-value", "nul-in-value", "crlf-in-name"],
)
async def test_a_header_that_would_split_the_request_is_never_sent(
    serve: Serve, headers: dict[str, str]
) -> None:
    sandbox, client = await serve(lambda n: ok())
    with pytest.raises(up.UpstreamError, match="not forwardable"):
        await client.send("POST", {"content-type": "application/json", **headers}, b"{}")
    assert sandbox.connections == 0
    assert (await fetch(client))[2] == b'{"ok":true}'  # the client itself is unharmed


async def until(predicate: Callable[[], bool], timeout: float = 5.0) -> None:
    async with asyncio.timeout(timeout):
        while not predicate():
            await asyncio.sleep(0.01)


async def test_a_tenants_client_goes_with_its_sandbox(tmp_path: Path) -> None:
    """Issue 24 item 7: a client was kept for every endpoint ever used (each warm slot, each
    Pod IP), with up to 16 dead connections each. One per tenant now, for its sandbox of now."""
    old, new = Sandbox(tmp_path / "old.sock", lambda n: ok()), Sandbox(tmp_path / "new.sock", lambda n: ok())
    for sandbox in (old, new):
        await sandbox.start()
    upstreams = up.Upstreams(connect_timeout=2.0, call_timeout=2.0)
    try:
        first = upstreams.client("t", Endpoint(url="http://localhost/mcp", uds=str(old.path)))
        assert (await fetch(first))[0] == 200  # its connection is kept, idle
        assert upstreams.client("t", first.endpoint) is first and len(upstreams) == 1
        # The tenant's sandbox was replaced: another endpoint. The old client goes, and with
        # it the connection the old sandbox still holds open.
        second = upstreams.client("t", Endpoint(url="http://localhost/mcp", uds=str(new.path)))
        assert second is not first and len(upstreams) == 1
        await until(lambda: old.ended == 1)
        assert (await fetch(second))[0] == 200
        # The sandbox went (the runtime said so): nothing is kept for it.
        upstreams.forget("t")
        assert len(upstreams) == 0
        await until(lambda: new.ended == 1)
        assert new.connections == 1
    finally:
        await upstreams.close()
        for sandbox in (old, new):
            await sandbox.close()
