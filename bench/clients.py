"""The targets and the clients that call them: raw HTTP/1.1 and httpx2, latency and load runs."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import httpx2

from bench.processes import Proc, cpu_seconds
from bench.workload import CALLS, LEGACY_PROTOCOL, OK_MARKERS, call_body, routing_headers

# -- targets ---------------------------------------------------------------------------------


@dataclass
class Target:
    key: str
    label: str
    url: str
    uds: str | None = None
    legacy: bool = False  # 2025-11-25 handshake with sessions (mcp-proxy)
    token: Callable[[], str] | None = None  # bearer token (broker)
    baseline: str | None = None  # key of the target whose p50 is subtracted
    proxy_pids: Callable[[], list[int]] = list
    server_pids: Callable[[], list[int]] = list

    def base_headers(self) -> dict[str, str]:
        headers = {"accept": "application/json, text/event-stream", "content-type": "application/json"}
        if self.token is not None:
            headers["authorization"] = f"Bearer {self.token()}"
        return headers

    # Requests are pre-rendered: the client's own cost per call stays small and equal everywhere.
    def call_headers(self, session: str | None) -> list[dict[str, str]]:
        out = []
        for tool, _ in CALLS:
            if self.legacy:
                h = {"mcp-protocol-version": LEGACY_PROTOCOL}
                if session:
                    h["mcp-session-id"] = session
            else:
                h = routing_headers(tool)
            out.append(h)
        return out

    def call_bodies(self) -> list[bytes]:
        """JSON-RPC templates with `%d` for the request id."""
        out = []
        for tool, arguments in CALLS:
            body = call_body(tool, arguments, 999_999_999)
            if self.legacy:  # the session-era protocol: the version was agreed at initialize
                del body["params"]["_meta"]
            out.append(json.dumps(body).replace("999999999", "%d").encode())
        return out


class CallFailed(Exception):
    pass


def check(target: Target, status: int, body: bytes) -> None:
    if status != 200 or not any(m in body for m in OK_MARKERS):
        raise CallFailed(f"{target.label}: HTTP {status}: {body[:300]!r}")


Reply = tuple[int, dict[str, str], bytes]


class RawConn:
    """One keep-alive HTTP/1.1 connection on asyncio streams: the leanest client Python has.

    Measured here, a POST costs httpx2's AsyncClient about 2 ms of CPU and this about 0.3 ms:
    on a 2-core machine the load generator shares the CPUs with what it measures, so a heavy
    client flattens every difference (see bench/README.md).
    """

    def __init__(self, target: Target) -> None:
        parts = urlsplit(target.url)
        self._target = target
        self._host = "localhost" if target.uds else parts.netloc
        self._path = parts.path or "/"
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._fixed = "".join(f"{k}: {v}\r\n" for k, v in target.base_headers().items())

    async def _connect(self) -> None:
        if self._target.uds:
            self._reader, self._writer = await asyncio.open_unix_connection(self._target.uds)
        else:
            parts = urlsplit(self._target.url)
            self._reader, self._writer = await asyncio.open_connection(parts.hostname, parts.port)

    def render(self, method: str, headers: dict[str, str]) -> str:
        """Everything of a request but Content-Length, the blank line and the body."""
        extra = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
        return f"{method} {self._path} HTTP/1.1\r\nhost: {self._host}\r\n{self._fixed}{extra}"

    async def send(self, head: str, body: bytes) -> Reply:
        if self._writer is None:
            await self._connect()
        assert self._reader is not None and self._writer is not None
        self._writer.write(b"%scontent-length: %d\r\n\r\n%s" % (head.encode("latin-1"), len(body), body))
        reader = self._reader
        raw = await reader.readuntil(b"\r\n\r\n")
        lines = raw.decode("latin-1").split("\r\n")
        status = int(lines[0].split(" ", 2)[1])
        headers: dict[str, str] = {}
        for line in lines[1:]:
            if line:
                name, _, value = line.partition(":")
                headers[name.strip().lower()] = value.strip()
        if "content-length" in headers:
            data = await reader.readexactly(int(headers["content-length"]))
        elif headers.get("transfer-encoding", "").lower() == "chunked":
            chunks = []
            while True:
                size = int((await reader.readuntil(b"\r\n")).split(b";")[0], 16)
                chunk = await reader.readexactly(size + 2)
                if size == 0:
                    break
                chunks.append(chunk[:-2])
            data = b"".join(chunks)
        else:
            data = await reader.read()
            headers["connection"] = "close"
        if headers.get("connection", "").lower() == "close":
            await self.close()
        return status, headers, data

    async def request(self, method: str, body: bytes, headers: dict[str, str]) -> Reply:
        return await self.send(self.render(method, headers), body)

    async def close(self) -> None:
        writer, self._writer, self._reader = self._writer, None, None
        if writer is not None:
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()


class Httpx2Conn:
    """The same, through httpx2's AsyncClient (--client httpx2): one pooled connection."""

    def __init__(self, target: Target) -> None:
        self._target = target
        transport = httpx2.AsyncHTTPTransport(uds=target.uds) if target.uds else httpx2.AsyncHTTPTransport()
        self._client = httpx2.AsyncClient(
            transport=transport,
            headers=target.base_headers(),
            timeout=30,
            limits=httpx2.Limits(max_connections=1, max_keepalive_connections=1),
        )

    def render(self, method: str, headers: dict[str, str]) -> tuple[str, dict[str, str]]:
        return method, headers

    async def send(self, head: tuple[str, dict[str, str]], body: bytes) -> Reply:
        r = await self._client.request(head[0], self._target.url, content=body or None, headers=head[1])
        return r.status_code, {k.lower(): v for k, v in r.headers.items()}, r.content

    async def request(self, method: str, body: bytes, headers: dict[str, str]) -> Reply:
        return await self.send(self.render(method, headers), body)

    async def close(self) -> None:
        await self._client.aclose()


Conn = RawConn | Httpx2Conn
CLIENTS: dict[str, Callable[[Target], Conn]] = {"raw": RawConn, "httpx2": Httpx2Conn}


async def open_session(target: Target, conn: Conn) -> str | None:
    """The 2025-11-25 handshake (mcp-proxy): initialize → Mcp-Session-Id → initialized."""
    if not target.legacy:
        return None
    init = {
        "jsonrpc": "2.0",
        "id": 0,
        "method": "initialize",
        "params": {
            "protocolVersion": LEGACY_PROTOCOL,
            "capabilities": {},
            "clientInfo": {"name": "docbroker-bench", "version": "1"},
        },
    }
    status, headers, _ = await conn.request("POST", json.dumps(init).encode(), {})
    session = headers.get("mcp-session-id")
    if status != 200 or not session:
        raise CallFailed(f"{target.label}: initialize: HTTP {status}")
    done = json.dumps({"jsonrpc": "2.0", "method": "notifications/initialized"}).encode()
    status, _, _ = await conn.request(
        "POST", done, {"mcp-session-id": session, "mcp-protocol-version": LEGACY_PROTOCOL}
    )
    if status not in (200, 202):
        raise CallFailed(f"{target.label}: notifications/initialized: HTTP {status}")
    return session


async def close_session(target: Target, conn: Conn, session: str | None) -> None:
    if session:
        with contextlib.suppress(OSError, asyncio.IncompleteReadError, httpx2.HTTPError):
            await conn.request(
                "DELETE", b"", {"mcp-session-id": session, "mcp-protocol-version": LEGACY_PROTOCOL}
            )
    await conn.close()


@dataclass
class LoadResult:
    calls: int
    seconds: float
    latencies: list[float]
    proxy_cpu: float = 0.0
    server_cpu: float = 0.0
    client_cpu: float = 0.0

    @property
    def throughput(self) -> float:
        return self.calls / self.seconds


async def _run(target: Target, client: str, concurrency: int, *, calls: int, seconds: float) -> LoadResult:
    """`concurrency` connections (a session each, for mcp-proxy) calling in a closed loop.

    With `calls`, each connection makes calls // concurrency of them; otherwise each calls
    until `seconds` are up. Three warm calls per connection first (connect, first request).
    """
    conns = [CLIENTS[client](target) for _ in range(concurrency)]
    try:
        sessions = [await open_session(target, conn) for conn in conns]
        bodies = target.call_bodies()
        n = len(CALLS)
        clock = time.perf_counter
        latencies: list[float] = []
        stop_at = 0.0
        per_conn = max(1, calls // concurrency) if calls else 0

        async def worker(w: int, warm: bool) -> int:
            conn = conns[w]
            heads: list[Any] = [conn.render("POST", h) for h in target.call_headers(sessions[w])]
            done = 0
            i = w
            limit = 3 if warm else per_conn
            while True:
                t0 = clock()
                if (limit and done >= limit) or (not limit and t0 >= stop_at):
                    return done
                k = i % n
                status, _, data = await conn.send(heads[k], bodies[k] % (i + 1))
                t1 = clock()
                check(target, status, data)
                if not warm:
                    latencies.append(t1 - t0)
                done += 1
                i += concurrency

        await asyncio.gather(*(worker(w, True) for w in range(concurrency)))
        proxy_pids, server_pids = target.proxy_pids(), target.server_pids()
        cpu0 = (cpu_seconds(proxy_pids), cpu_seconds(server_pids), time.process_time())
        started = clock()
        stop_at = started + seconds
        counts = await asyncio.gather(*(worker(w, False) for w in range(concurrency)))
        elapsed = clock() - started
        cpu1 = (cpu_seconds(proxy_pids), cpu_seconds(server_pids), time.process_time())
    finally:
        for conn, session in zip(conns, locals().get("sessions") or [None] * len(conns), strict=True):
            await close_session(target, conn, session)
    return LoadResult(
        calls=sum(counts),
        seconds=elapsed,
        latencies=latencies,
        proxy_cpu=cpu1[0] - cpu0[0],
        server_cpu=cpu1[1] - cpu0[1],
        client_cpu=cpu1[2] - cpu0[2],
    )


def measure_latency(target: Target, client: str, calls: int) -> LoadResult:
    """Concurrency 1: `calls` sequential tools/calls on one keep-alive connection."""
    return asyncio.run(_run(target, client, 1, calls=calls, seconds=0.0))


def measure_throughput(target: Target, client: str, concurrency: int, seconds: float) -> LoadResult:
    return asyncio.run(_run(target, client, concurrency, calls=0, seconds=seconds))


def wait_ready(target: Target, proc: Proc | None, timeout: float = 40.0) -> None:
    """Until one real tools/call succeeds (the broker also starts its sandbox on the first)."""
    deadline = time.monotonic() + timeout
    last = ""
    while time.monotonic() < deadline:
        if proc is not None and proc.popen.poll() is not None:
            raise RuntimeError(f"{proc.name} exited early (status {proc.popen.returncode}):\n{proc.tail()}")
        if target.uds is None or os.path.exists(target.uds):
            try:
                measure_latency(target, "raw", 1)
                return
            except (OSError, asyncio.IncompleteReadError, CallFailed) as exc:
                last = str(exc)
        time.sleep(0.2)
    tail = proc.tail() if proc is not None else ""
    raise RuntimeError(f"{target.label} did not answer a tools/call in {timeout:.0f} s: {last}\n{tail}")
