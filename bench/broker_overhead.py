"""What the broker adds to a tools/call, next to the bare server and a peer proxy, in one run.

    python bench/broker_overhead.py                      # ~2-3 min, prints one table
    python bench/broker_overhead.py --rounds 10 --calls 2000 --seconds 60   # longer, steadier
    python bench/broker_overhead.py --no-mcp-proxy       # without the peer proxy (no PyPI needed)

Run it with the project's environment (e.g. /work/venv/bin/python): the broker and the
document-tools server are started from this checkout (or --root) with that interpreter.

The same document-tools server code, over the same six documents, is called:

  direct (unix socket)   the broker's own sandbox process (local runtime), on its socket
  direct (TCP)           a second `python -m server --http` process, same code and documents
  broker                 `python -m broker serve` over TCP, RS256 JWT checked on every request,
                         audit log on (default fsync=interval), local runtime → the socket above
  mcp-proxy HTTP→HTTP    mcp-proxy (PyPI, own venv, mcp<2) has no HTTP→HTTP mode of its own,
                         so two of them are chained: a server-mode mcp-proxy exposing Streamable
                         HTTP runs a client-mode mcp-proxy (its stdio "server") that connects to
                         the direct (TCP) server's Streamable HTTP. Baseline: direct (TCP).
  mcp-proxy HTTP→stdio   one server-mode mcp-proxy exposing Streamable HTTP in front of
                         `python -m server` over stdio: a single proxy process, the setup
                         mcp-proxy is built for. Baseline: direct (TCP).

The client sends raw JSON-RPC over keep-alive HTTP with httpx2, so what is measured is the
servers and proxies, not an MCP client library: protocol 2026-07-28 (no handshake; headers
MCP-Protocol-Version / Mcp-Method / Mcp-Name, `params._meta`) for direct and broker, and the
2025-11-25 handshake (initialize → Mcp-Session-Id → notifications/initialized) for mcp-proxy,
which speaks only that. The workload everywhere: tools/call alternating search_documents and
read_document. Every response is checked (HTTP 200 and a tool status "ok").

Measurements alternate: each round runs every target once at concurrency 1 (latency) and once
at concurrency 8 (throughput), in a rotated order; per-round numbers are paired and the median
over rounds is reported. Added latency = the target's p50 minus its baseline's p50 in the same
round. CPU per call is read from /proc for the processes behind each target during the c=8 runs.

Targets (issue 3, item 7): broker added p50 ≤ 1.5 ms at c=1; broker throughput ≥ 85% of direct
at c=8; broker added latency ≤ 1/3 of mcp-proxy's (checked against the smaller of the two
mcp-proxy setups, the one most favourable to mcp-proxy). Exit status: 0 all PASS, 1 a FAIL,
2 the benchmark could not run.

Only loopback traffic; every process started here is stopped and the temporary folder removed
at exit (also on Ctrl-C / SIGTERM). mcp-proxy's venv is created on first use (pip, PyPI) in
~/.cache/docbroker-bench/ and reused, outside the repository.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import secrets
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx2

REPO = Path(__file__).resolve().parents[1]
TENANT = "bench"
PROTOCOL = "2026-07-28"
LEGACY_PROTOCOL = "2025-11-25"
MCP_PROXY_SPEC = "mcp-proxy==0.13.0"  # pinned: a peer whose numbers move is no yardstick
DEFAULT_PROXY_VENV = (
    Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "docbroker-bench" / ("venv-mcp-proxy")
)

TARGET_ADDED_MS = 1.5
TARGET_THROUGHPUT = 0.85
TARGET_RATIO = 1 / 3

# The workload: alternate a search (reads every candidate) and a read of one document.
CALLS: tuple[tuple[str, dict[str, Any]], ...] = (
    ("search_documents", {"query": "budget", "max_results": 3}),
    ("read_document", {"filename": "doc2.md"}),
)
OK_MARKERS = (b'"status":"ok"', b'\\"status\\":\\"ok\\"')


def documents() -> dict[str, str]:
    """Six small Markdown files (about 3 KB each), the same for every server."""
    docs = {}
    for i in range(1, 7):
        topic = "budget review" if i % 2 == 0 else "quarterly plan"
        body = "\n".join(f"Line {n}: notes on the {topic} for region {i}, item {n}." for n in range(60))
        docs[f"doc{i}.md"] = f"# Document {i}\n\n{body}\n"
    return docs


# -- processes -------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _stat(pid: int) -> list[str] | None:
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # comm (field 2) may hold spaces; everything after its closing paren is space-separated.
    return raw[raw.rindex(")") + 2 :].split()


def descendants(pid: int) -> list[int]:
    """Every live descendant of pid (children of children too), from /proc."""
    parent_of: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            fields = _stat(int(entry))
            if fields is not None:
                parent_of[int(entry)] = int(fields[1])
    found: list[int] = []
    frontier = [pid]
    while frontier:
        p = frontier.pop()
        kids = [c for c, pp in parent_of.items() if pp == p]
        found.extend(kids)
        frontier.extend(kids)
    return found


def cpu_seconds(pids: list[int]) -> float:
    """utime + stime of the given processes, in seconds."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0
    for pid in pids:
        fields = _stat(pid)
        if fields is not None:
            total += int(fields[11]) + int(fields[12])
    return total / tick


def machine_cpu() -> tuple[float, float]:
    """(busy, steal) CPU seconds of the whole machine since boot, from /proc/stat."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]
    user, nice, system, _idle, _iowait, irq, softirq, steal = fields
    tick = os.sysconf("SC_CLK_TCK")
    return (user + nice + system + irq + softirq) / tick, steal / tick


class Noise:
    """How much CPU processes outside this benchmark took while it measured (and VM steal)."""

    def __init__(self) -> None:
        self.start = self._sample()

    @staticmethod
    def _sample() -> tuple[float, float, float, float]:
        busy, steal = machine_cpu()
        ours = cpu_seconds([os.getpid(), *descendants(os.getpid())])
        return time.monotonic(), busy, steal, ours

    def foreign(self) -> tuple[float, float]:
        """(share of all CPUs used by other processes, share stolen by the hypervisor)."""
        now = self._sample()
        capacity = (now[0] - self.start[0]) * (os.cpu_count() or 1)
        if capacity <= 0:
            return 0.0, 0.0
        other = (now[1] - self.start[1]) - (now[3] - self.start[3])
        return max(0.0, other / capacity), (now[2] - self.start[2]) / capacity


@dataclass
class Proc:
    name: str
    popen: subprocess.Popen[bytes]
    log: Path
    # (pid, start time) of descendants seen while running: stopped too, even if re-parented.
    family: set[tuple[int, str]] = field(default_factory=set)

    @property
    def pid(self) -> int:
        return self.popen.pid

    def remember_family(self) -> list[int]:
        kids = descendants(self.pid)
        for kid in kids:
            fields = _stat(kid)
            if fields is not None:
                self.family.add((kid, fields[19]))
        return kids

    def tail(self, n: int = 3000) -> str:
        try:
            return self.log.read_text(errors="replace")[-n:]
        except OSError:
            return ""


class Processes:
    """Everything this run starts; `stop_all` ends each one (and what it started) by pid."""

    def __init__(self) -> None:
        self.procs: list[Proc] = []

    def start(self, name: str, argv: list[str], env: dict[str, str], log: Path, cwd: Path) -> Proc:
        out = log.open("ab")
        try:
            popen = subprocess.Popen(
                argv,
                env=env,
                cwd=cwd,
                stdout=out,
                stderr=out,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        finally:
            out.close()
        proc = Proc(name, popen, log)
        self.procs.append(proc)
        return proc

    def stop_all(self) -> None:
        for proc in reversed(self.procs):
            proc.remember_family()
            if proc.popen.poll() is None:
                proc.popen.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 12
        for proc in reversed(self.procs):
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.popen.wait(timeout=max(0.1, deadline - time.monotonic()))
            if proc.popen.poll() is None:
                proc.popen.kill()
                proc.popen.wait()
        # Children that outlived their parent (mcp-proxy leaves its stdio server behind on
        # SIGTERM; a killed broker would leave its sandbox): by pid, checked against start time.
        time.sleep(0.2)
        for proc in self.procs:
            for pid, started in proc.family:
                fields = _stat(pid)
                if fields is not None and fields[19] == started and fields[0] != "Z":
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)
        self.procs.clear()
        reap_orphans()


def become_subreaper() -> None:
    """Orphaned grandchildren (mcp-proxy's stdio child) become ours to reap, not init's."""
    with contextlib.suppress(Exception):
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER


def reap_orphans() -> None:
    deadline = time.monotonic() + 3
    while time.monotonic() < deadline:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            time.sleep(0.05)


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
                h = {"mcp-protocol-version": PROTOCOL, "mcp-method": "tools/call", "mcp-name": tool}
            out.append(h)
        return out

    def call_bodies(self) -> list[bytes]:
        """JSON-RPC templates with `%d` for the request id."""
        out = []
        for tool, arguments in CALLS:
            params: dict[str, Any] = {"name": tool, "arguments": arguments}
            if not self.legacy:
                params["_meta"] = {
                    "io.modelcontextprotocol/protocolVersion": PROTOCOL,
                    "io.modelcontextprotocol/clientCapabilities": {},
                }
            body = json.dumps({"jsonrpc": "2.0", "id": 999_999_999, "method": "tools/call", "params": params})
            out.append(body.replace("999999999", "%d").encode())
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


# -- set-up ----------------------------------------------------------------------------------


def write_docs(sources: Path) -> None:
    sources.mkdir(parents=True, exist_ok=True)
    for name, text in documents().items():
        (sources / name).write_text(text)


def docs_root(tmp: Path) -> tuple[Path, Path]:
    """A stand-alone DOCS_ROOT and secret file for the servers outside the broker."""
    root = tmp / "docs"
    write_docs(root / "sources")
    (root / "reports").mkdir()
    secret = tmp / "secret.key"
    secret.write_text(secrets.token_hex(32))
    secret.chmod(0o400)
    return root, secret


def server_env(root: Path, docs: Path, secret: Path) -> dict[str, str]:
    return {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": os.environ.get("HOME", "/root"),
        "PYTHONPATH": str(root),
        "DOCS_ROOT": str(docs),
        "DOCS_SCOPE": TENANT,
        "DOCS_SECRET_FILE": str(secret),
    }


@dataclass
class BrokerSetup:
    env: dict[str, str]
    url: str
    data_dir: Path
    mint: Callable[[], str]


def broker_setup(root: Path, tmp: Path, extra_env: dict[str, str]) -> BrokerSetup:
    """The same broker setup as the tests (identity provider, policies), run from `root`."""
    sys.path.insert(0, str(REPO))
    from tests.broker.harness import make_broker

    broker = make_broker(
        tmp,
        tenants=(TENANT,),
        env={"PYTHONPATH": str(root), **extra_env},
        # Limits high enough never to bite: the limiter still runs on every request.
        limits="[limits]\nrate_per_minute = 1000000\nburst = 1000000\nmax_concurrent = 256\n",
    )
    write_docs(broker.sources(TENANT))  # where the broker provisions them

    def mint() -> str:
        exp = int(time.time()) + 3000
        return broker.token(TENANT, subject="bench-user", scope="docs:read", exp=exp)

    return BrokerSetup(env=broker.env, url=broker.mcp_url, data_dir=broker.data_dir, mint=mint)


def revision(root: Path) -> str:
    """The checkout's commit (and whether it has local changes), for the record."""
    try:
        head = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            timeout=10,
        )
        if head.returncode != 0:
            return f"{root} (not a git checkout)"
        dirty = subprocess.run(
            ["git", "-C", str(root), "status", "--porcelain", "--", "broker", "server"],
            capture_output=True,
            text=True,
            timeout=10,
        )
        return head.stdout.strip() + (
            " + local changes in broker/ or server/" if dirty.stdout.strip() else ""
        )
    except (OSError, subprocess.TimeoutExpired):
        return str(root)


def ensure_mcp_proxy(venv: Path, quiet: bool) -> Path | None:
    exe = venv / "bin" / "mcp-proxy"
    if exe.exists():
        return exe

    def say(message: str) -> None:
        if not quiet:
            print(message, file=sys.stderr, flush=True)

    say(f"creating {venv} and installing {MCP_PROXY_SPEC} (it needs mcp<2: a venv of its own)…")
    base = getattr(sys, "_base_executable", None) or shutil.which("python3") or sys.executable
    try:
        subprocess.run([base, "-m", "venv", str(venv)], check=True, capture_output=True)
        subprocess.run(
            [str(venv / "bin" / "pip"), "install", "-q", "--disable-pip-version-check", MCP_PROXY_SPEC],
            check=True,
            capture_output=True,
            timeout=600,
        )
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired, OSError) as exc:
        detail = getattr(exc, "stderr", b"") or b""
        say(
            f"mcp-proxy could not be installed ({type(exc).__name__}): "
            f"{detail.decode(errors='replace')[-500:]}"
        )
        shutil.rmtree(venv, ignore_errors=True)
        return None
    return exe if exe.exists() else None


# -- statistics and report -------------------------------------------------------------------


def pct(samples: list[float], q: float) -> float:
    """The q-quantile (0..1) by nearest rank."""
    if not samples:
        return float("nan")
    ordered = sorted(samples)
    return ordered[max(1, math.ceil(q * len(ordered))) - 1]


def med(values: list[float]) -> float:
    values = [v for v in values if v == v]
    return statistics.median(values) if values else float("nan")


@dataclass
class Series:
    lat_rounds: list[list[float]] = field(default_factory=list)  # c=1 samples, per round
    lat_proxy_cpu: list[float] = field(default_factory=list)  # c=1 proxy CPU seconds per call, per round
    load_rounds: list[LoadResult] = field(default_factory=list)

    def p50(self, r: int) -> float:
        return pct(self.lat_rounds[r], 0.50)

    @property
    def all_latencies(self) -> list[float]:
        return [s for rnd in self.lat_rounds for s in rnd]


def fmt(value: float, digits: int = 2, suffix: str = "") -> str:
    return "-" if value != value else f"{value:.{digits}f}{suffix}"


def build_report(targets: list[Target], data: dict[str, Series], concurrency: int) -> dict[str, Any]:
    rows: dict[str, dict[str, Any]] = {}
    rounds = min(len(s.lat_rounds) for s in data.values())
    for t in targets:
        s = data[t.key]
        row: dict[str, Any] = {
            "label": t.label,
            "p50_ms": med([s.p50(r) for r in range(rounds)]) * 1000,
            "p99_ms": pct(s.all_latencies, 0.99) * 1000,
            "calls_c1": len(s.all_latencies),
            "throughput": med([lr.throughput for lr in s.load_rounds]),
            "calls_cn": sum(lr.calls for lr in s.load_rounds),
            "p50_cn_ms": pct([x for lr in s.load_rounds for x in lr.latencies], 0.50) * 1000,
        }
        n = sum(lr.calls for lr in s.load_rounds) or 1
        row["proxy_cpu_us"] = sum(lr.proxy_cpu for lr in s.load_rounds) / n * 1e6
        row["proxy_cpu_c1_us"] = med(s.lat_proxy_cpu) * 1e6
        row["server_cpu_us"] = sum(lr.server_cpu for lr in s.load_rounds) / n * 1e6
        row["client_cpu_us"] = sum(lr.client_cpu for lr in s.load_rounds) / n * 1e6
        if t.baseline is not None:
            b = data[t.baseline]
            row["baseline"] = t.baseline
            # Per-round pairs, kept for their spread: on a noisy machine a verdict near the
            # line means little without it.
            added_rounds = [(s.p50(r) - b.p50(r)) * 1000 for r in range(rounds)]
            pairs = zip(s.load_rounds, b.load_rounds, strict=True)
            ratio_rounds = [lr.throughput / lb.throughput for lr, lb in pairs]
            row["added_p50_ms"] = med(added_rounds)
            row["added_p50_ms_rounds"] = added_rounds
            row["throughput_ratio"] = med(ratio_rounds)
            row["throughput_ratio_rounds"] = ratio_rounds
        rows[t.key] = row
    return {"rows": rows, "rounds": rounds, "concurrency": concurrency}


def spread(values: list[float], form: str) -> str:
    values = [v for v in values if v == v]
    return f"{form.format(min(values))}, {form.format(max(values))}" if values else "-"


def verdicts(report: dict[str, Any]) -> list[tuple[str, str, str, str]]:
    rows = report["rows"]
    out = []
    broker = rows["broker"]
    added = broker["added_p50_ms"]
    out.append(
        (
            "broker added p50 latency, c=1",
            f"{added:.3f} ms",
            f"≤ {TARGET_ADDED_MS} ms",
            "PASS" if added <= TARGET_ADDED_MS else "FAIL",
        )
    )
    out.append(
        (
            "  rounds: lowest, highest",
            spread(broker["added_p50_ms_rounds"], "{:.3f}"),
            "info",
            "",
        )
    )
    ratio = broker["throughput_ratio"]
    out.append(
        (
            f"broker throughput vs direct, c={report['concurrency']}",
            f"{ratio * 100:.1f} %",
            f"≥ {TARGET_THROUGHPUT * 100:.0f} %",
            "PASS" if ratio >= TARGET_THROUGHPUT else "FAIL",
        )
    )
    out.append(
        (
            "  rounds: lowest, highest",
            spread([r * 100 for r in broker["throughput_ratio_rounds"]], "{:.1f}"),
            "info",
            "",
        )
    )
    proxies = [(k, rows[k]) for k in ("mcp_proxy_http", "mcp_proxy_stdio") if k in rows]
    if proxies:
        key, peer = min(proxies, key=lambda kv: kv[1]["added_p50_ms"])
        peer_added = peer["added_p50_ms"]
        r = added / peer_added if peer_added > 0 else float("inf")
        out.append(
            (
                f"broker added ÷ mcp-proxy added ({peer['label'].strip()}: {peer_added:.2f} ms)",
                f"{r:.3f}",
                f"≤ {TARGET_RATIO:.3f}",
                "PASS" if r <= TARGET_RATIO else "FAIL",
            )
        )
        for k, other in proxies:
            if k != key and other["added_p50_ms"] > 0:
                out.append(
                    (
                        f"  (vs {other['label'].strip()}: {other['added_p50_ms']:.2f} ms)",
                        f"{added / other['added_p50_ms']:.3f}",
                        "info",
                        "",
                    )
                )
    else:
        out.append(("broker added ÷ mcp-proxy added", "-", f"≤ {TARGET_RATIO:.3f}", "SKIP"))
    return out


def print_report(report: dict[str, Any], header: list[str]) -> None:
    rows = report["rows"]
    c = report["concurrency"]
    cols = (
        ("target", 40, "<"),
        ("p50 ms", 8, ">"),
        ("p99 ms", 8, ">"),
        ("added p50", 10, ">"),
        (f"c={c} calls/s", 13, ">"),
        ("% of base", 10, ">"),
        (f"c={c} p50 ms", 12, ">"),
        ("proxy CPU c=1", 14, ">"),
        (f"c={c}", 10, ">"),
        ("server CPU/call", 16, ">"),
    )
    print()
    for line in header:
        print(line)
    print()
    print("".join(f"{name:{align}{width}}" for name, width, align in cols))
    print("-" * sum(w for _, w, _ in cols))
    for row in rows.values():
        cells = [
            row["label"],
            fmt(row["p50_ms"]),
            fmt(row["p99_ms"]),
            fmt(row["added_p50_ms"], 3) if "added_p50_ms" in row else "-",
            fmt(row["throughput"], 0),
            fmt(row["throughput_ratio"] * 100, 1, " %") if "throughput_ratio" in row else "-",
            fmt(row["p50_cn_ms"]),
            fmt(row["proxy_cpu_c1_us"], 0, " µs") if row["proxy_cpu_c1_us"] > 0 else "-",
            fmt(row["proxy_cpu_us"], 0, " µs") if row["proxy_cpu_us"] > 0 else "-",
            fmt(row["server_cpu_us"], 0, " µs"),
        ]
        print("".join(f"{cell:{align}{width}}" for cell, (_, width, align) in zip(cells, cols, strict=True)))
    print()
    print("baselines: broker → direct (unix socket) = the very process it forwards to;")
    print(
        "           mcp-proxy → direct (TCP) = the server it forwards to (HTTP→HTTP) / same code (HTTP→stdio)"
    )
    client_us = med([row["client_cpu_us"] for row in rows.values()])
    print(
        f"client (this process) CPU per call at c={c}: ~{client_us:.0f} µs; "
        "CPU columns: /proc utime+stime ÷ calls"
    )
    print()
    results = verdicts(report)
    width = max(len(r[0]) for r in results) + 2
    print("targets")
    for name, value, target, verdict in results:
        print(f"  {name:<{width}}{value:>14}   {target:<10} {verdict}")


# -- main ------------------------------------------------------------------------------------


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter
    )
    p.add_argument("--rounds", type=int, default=5, help="alternating rounds (default 5)")
    p.add_argument(
        "--calls", type=int, default=500, help="c=1 calls per target, over all rounds (default 500)"
    )
    p.add_argument(
        "--seconds", type=float, default=15.0, help="c=N seconds per target, over all rounds (default 15)"
    )
    p.add_argument(
        "--concurrency", type=int, default=8, help="concurrency of the throughput runs (default 8)"
    )
    p.add_argument("--warmup", type=int, default=100, help="c=1 warm-up calls per target before round 1")
    p.add_argument(
        "--client",
        choices=sorted(CLIENTS),
        default="raw",
        help="load generator: raw asyncio HTTP/1.1 (default, ~0.3 ms CPU/call) or httpx2 (~2 ms)",
    )
    p.add_argument("--no-mcp-proxy", action="store_true", help="leave mcp-proxy out (no PyPI access needed)")
    p.add_argument(
        "--mcp-proxy-venv", type=Path, default=DEFAULT_PROXY_VENV, help="venv for mcp-proxy (created)"
    )
    p.add_argument("--root", type=Path, default=REPO, help="checkout whose broker/ and server/ to run")
    p.add_argument(
        "--compare",
        type=Path,
        metavar="CHECKOUT",
        help="also run the broker (and its sandbox) of another checkout, in the same rounds: an A/B",
    )
    p.add_argument(
        "--broker-env",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="extra DOCBROKER_* for the broker",
    )
    p.add_argument("--json", type=Path, help="also write the results as JSON here")
    p.add_argument("--keep", action="store_true", help="keep the temporary folder (logs, audit log)")
    p.add_argument(
        "--hold",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="after the table, keep the broker under load this long (attach a profiler to its pid)",
    )
    p.add_argument(
        "--hold-concurrency",
        type=int,
        default=None,
        metavar="N",
        help="concurrency of the --hold load (default: --concurrency)",
    )
    args = p.parse_args(argv)
    if args.rounds < 1 or args.calls < args.rounds or args.seconds <= 0 or args.concurrency < 1:
        p.error("need rounds ≥ 1, calls ≥ rounds, seconds > 0, concurrency ≥ 1")
    return args


def compared_broker(checkout: Path, procs: Processes, tmp: Path, extra: dict[str, str]) -> Target:
    """The broker of another checkout (with its own sandbox, run from that checkout's server/).

    Compare its p50 with the broker row's: both paths include their own sandbox. Its "added"
    column is against this run's direct (unix socket), a server from this checkout."""
    tmp.mkdir()
    setup = broker_setup(checkout, tmp, extra)
    proc = procs.start(
        "broker (compared)",
        [sys.executable, "-m", "broker", "serve"],
        setup.env,
        tmp / "broker.log",
        checkout,
    )
    token = setup.mint()
    target = Target(
        "broker_compared",
        f"broker, compared ({revision(checkout).split()[0]})",
        setup.url,
        token=lambda: token,
        baseline="direct_uds",
        proxy_pids=lambda: [proc.pid],
        server_pids=proc.remember_family,
    )
    wait_ready(target, proc)
    return target


def run(args: argparse.Namespace, procs: Processes, tmp: Path) -> int:
    root = args.root.resolve()
    py = sys.executable
    extra = dict(kv.split("=", 1) for kv in args.broker_env)

    def say(message: str) -> None:
        print(message, file=sys.stderr, flush=True)

    proxy_exe = None
    if not args.no_mcp_proxy:
        proxy_exe = ensure_mcp_proxy(args.mcp_proxy_venv, quiet=False)
        if proxy_exe is None:
            say("mcp-proxy unavailable: its rows and the ratio target are skipped")

    say("starting broker, servers" + (" and mcp-proxy" if proxy_exe else "") + "…")
    bs = broker_setup(root, tmp, extra)
    broker = procs.start("broker", [py, "-m", "broker", "serve"], bs.env, tmp / "broker.log", root)
    docs, secret = docs_root(tmp)
    tcp_port = free_port()
    tcp_server = procs.start(
        "server (TCP)",
        [py, "-m", "server", "--http", f"127.0.0.1:{tcp_port}"],
        server_env(root, docs, secret),
        tmp / "server-tcp.log",
        root,
    )
    token = {"value": ""}

    def bearer() -> str:
        return token["value"]

    token["value"] = bs.mint()

    def sandbox_pids() -> list[int]:
        return broker.remember_family()

    targets: list[Target] = []
    t_broker = Target(
        "broker",
        "broker (JWT+audit, TCP → uds)",
        bs.url,
        token=bearer,
        baseline="direct_uds",
        proxy_pids=lambda: [broker.pid],
        server_pids=sandbox_pids,
    )
    t_tcp = Target(
        "direct_tcp",
        "direct (TCP)",
        f"http://127.0.0.1:{tcp_port}/mcp",
        server_pids=lambda: [tcp_server.pid],
    )
    wait_ready(t_tcp, tcp_server)
    wait_ready(t_broker, broker)  # the first call provisions the tenant and starts its sandbox
    sock = bs.data_dir / "run" / TENANT / "mcp.sock"
    if not sock.exists():
        found = sorted(bs.data_dir.rglob("*.sock"))
        if not found:
            raise RuntimeError("the broker's sandbox socket was not found under its data dir")
        sock = found[0]
    t_uds = Target(
        "direct_uds",
        "direct (unix socket, broker's sandbox)",
        "http://localhost/mcp",
        uds=str(sock),
        server_pids=sandbox_pids,
    )
    wait_ready(t_uds, None)
    bare_port = free_port()
    bare = procs.start(
        "bare forwarder",
        [py, str(REPO / "bench" / "bare_forwarder.py"), "--socket", str(sock), "--port", str(bare_port)],
        # The floor is this checkout's (the script imports its modules), whatever --root says.
        {"PYTHONPATH": str(REPO), "PATH": os.environ.get("PATH", "/usr/bin:/bin")},
        tmp / "bare-forwarder.log",
        root,
    )
    t_bare = Target(
        "bare",
        "bare forwarder (floor: no checks)",
        f"http://127.0.0.1:{bare_port}/mcp",
        baseline="direct_uds",
        proxy_pids=lambda: [bare.pid],
        server_pids=sandbox_pids,
    )
    wait_ready(t_bare, bare)
    targets = [t_uds, t_tcp, t_broker, t_bare]
    if args.compare is not None:
        targets.append(compared_broker(args.compare.resolve(), procs, tmp / "compare", extra))

    if proxy_exe is not None:
        p1, p2 = free_port(), free_port()
        quiet = ["--log-level", "WARNING"]
        chain = procs.start(
            "mcp-proxy (HTTP→HTTP)",
            [str(proxy_exe), "--host", "127.0.0.1", "--port", str(p1), *quiet, "--",
             str(proxy_exe), "--transport", "streamablehttp", *quiet, f"http://127.0.0.1:{tcp_port}/mcp"],
            {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": os.environ.get("HOME", "/root")},
            tmp / "mcp-proxy-http.log",
            root,
        )  # fmt: skip
        senv = server_env(root, docs, secret)
        wrapped = procs.start(
            "mcp-proxy (HTTP→stdio)",
            [str(proxy_exe), "--host", "127.0.0.1", "--port", str(p2), *quiet, "--cwd", str(root),
             *[a for k in ("PYTHONPATH", "DOCS_ROOT", "DOCS_SCOPE", "DOCS_SECRET_FILE")
               for a in ("-e", k, senv[k])],
             "--", py, "-m", "server"],
            {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": os.environ.get("HOME", "/root")},
            tmp / "mcp-proxy-stdio.log",
            root,
        )  # fmt: skip
        t_chain = Target(
            "mcp_proxy_http",
            "mcp-proxy HTTP→stdio→HTTP (2 procs)",
            f"http://127.0.0.1:{p1}/mcp",
            legacy=True,
            baseline="direct_tcp",
            proxy_pids=lambda: [chain.pid, *chain.remember_family()],
            server_pids=lambda: [tcp_server.pid],
        )
        stdio_server: list[int] = []

        def wrapped_split() -> tuple[list[int], list[int]]:
            kids = wrapped.remember_family()
            if not stdio_server:
                for pid in kids:
                    with contextlib.suppress(OSError):
                        if b"server" in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0"):
                            stdio_server.append(pid)
            return [wrapped.pid, *(k for k in kids if k not in stdio_server)], stdio_server

        t_wrapped = Target(
            "mcp_proxy_stdio",
            "mcp-proxy HTTP→stdio server",
            f"http://127.0.0.1:{p2}/mcp",
            legacy=True,
            baseline="direct_tcp",
            proxy_pids=lambda: wrapped_split()[0],
            server_pids=lambda: wrapped_split()[1],
        )
        wait_ready(t_chain, chain)
        wait_ready(t_wrapped, wrapped)
        targets += [t_chain, t_wrapped]

    say(f"warming up ({args.warmup} calls at c=1 and 1 s at c={args.concurrency} per target)…")
    for t in targets:
        measure_latency(t, args.client, args.warmup)
        measure_throughput(t, args.client, args.concurrency, 1.0)

    data = {t.key: Series() for t in targets}
    per_round_calls = max(1, args.calls // args.rounds)
    per_round_seconds = args.seconds / args.rounds
    started = time.monotonic()
    loads = [os.getloadavg()[0]]
    noise = Noise()
    for r in range(args.rounds):
        token["value"] = bs.mint()  # fresh, well inside its lifetime, whatever --seconds is
        order = targets[r % len(targets) :] + targets[: r % len(targets)]
        if r % 2:
            order.reverse()
        for t in order:
            latency = measure_latency(t, args.client, per_round_calls)
            data[t.key].lat_rounds.append(latency.latencies)
            data[t.key].lat_proxy_cpu.append(latency.proxy_cpu / max(latency.calls, 1))
        for t in order:
            data[t.key].load_rounds.append(
                measure_throughput(t, args.client, args.concurrency, per_round_seconds)
            )
        loads.append(os.getloadavg()[0])
        say(
            f"round {r + 1}/{args.rounds} done ({time.monotonic() - started:.0f} s, load avg {loads[-1]:.1f})"
        )

    report = build_report(targets, data, args.concurrency)
    audit_lines = 0
    with contextlib.suppress(OSError):
        with (bs.data_dir / "audit.jsonl").open("rb") as f:
            audit_lines = sum(1 for _ in f)
    broker_calls = data["broker"]
    cpus = os.cpu_count() or 1
    foreign, steal = noise.foreign()
    header = [
        f"docbroker broker overhead — {time.strftime('%Y-%m-%d %H:%M:%S')}, {socket.gethostname()}, "
        f"{cpus} CPUs; during the rounds other processes used {foreign * 100:.0f}% of the CPUs"
        f"{f', VM steal {steal * 100:.0f}%' if steal >= 0.005 else ''}, "
        f"load avg {min(loads):.1f} to {max(loads):.1f}; "
        f"code: {revision(root)}",
        f"workload: tools/call alternating {' / '.join(n for n, _ in CALLS)} "
        f"over {len(documents())} documents; "
        f"{args.rounds} alternating rounds; c=1: {per_round_calls} calls/round/target "
        f"(p50 = median of round p50s, p99 over all {len(broker_calls.all_latencies)}); "
        f"c={args.concurrency}: {per_round_seconds:.1f} s/round/target (median calls/s)",
        f"client: {args.client} (keep-alive, one connection per concurrent caller); "
        f"broker: RS256 JWT per request, audit log on ({audit_lines} lines written, "
        f"fsync={extra.get('DOCBROKER_AUDIT_FSYNC', 'default')}), local runtime, "
        "tenant limits set out of reach",
    ]
    if foreign + steal > 0.10:
        header.append(
            "WARNING: not an idle machine: other processes (or the hypervisor) took "
            f"{(foreign + steal) * 100:.0f}% of the CPUs while this measured; latencies include "
            "their scheduling delays. Rerun when idle."
        )
    print_report(report, header)
    report["header"] = header
    report["load_avg"] = loads
    report["foreign_cpu_share"], report["steal_share"] = foreign, steal
    report["verdicts"] = verdicts(report)
    if args.json:
        args.json.write_text(json.dumps(report, indent=2, default=str))

    if args.hold > 0:
        held = args.hold_concurrency or args.concurrency
        say(f"holding the broker (pid {broker.pid}) under c={held} load for {args.hold:.0f} s…")
        measure_throughput(t_broker, args.client, held, args.hold)

    failed = any(v[3] == "FAIL" for v in report["verdicts"])
    return 1 if failed else 0


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    tmp = Path(tempfile.mkdtemp(prefix="docbroker-bench-"))
    become_subreaper()
    procs = Processes()

    def on_signal(signum: int, _frame: Any) -> None:
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGHUP, on_signal)
    try:
        return run(args, procs, tmp)
    except (RuntimeError, CallFailed, httpx2.HTTPError) as exc:
        print(f"broker_overhead: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # finish the clean-up
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        procs.stop_all()
        if args.keep:
            print(f"kept {tmp}", file=sys.stderr)
        else:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
