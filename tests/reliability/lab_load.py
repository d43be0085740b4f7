"""The client load of the lab run: real MCP SDK clients over real HTTP to the broker Pods.

Each client is `mcp.Client` over streamable HTTP whose httpx transport is the run's load
balancer (`Balancer`): the lab has no kube-proxy, so this is the Service a deployment puts in
front of the Pods: no affinity, each HTTP request to the next Ready Pod, another Pod when a
connection is refused (nothing was sent). Every HTTP exchange is journalled (`Journal`): tenant,
JSON-RPC method and tool, which Pod, when it began and ended, its status, or whether it failed
before or after its request was sent. The faults wait on that journal (a call in flight).

A client's operations, in turn: search, read, save-with-approval. A save is asked once (it waits
for approval), approved over REST on the OTHER Pod every other time (on the one that answered
otherwise), then asked again and written. Each operation's answer is one JSON line (`ops.jsonl`):
id, tenant, op, outcome (`ok`, `error`, `result_unknown`), for saves the report name and the
sha256 of the approved bytes.

The clients speak the 2026-07-28 protocol (no session: any Pod answers any request), and each
operation has a JWT subject of its own, so that the audit's terminal events are matched to the
HTTP requests that caused them (tests/reliability/accounting.py); every HTTP request is also
written as one `accounting.Answer` line (`answers.jsonl`), the shape the Docker run writes.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import itertools
import json
import secrets
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx2
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError

from broker.protocol.versions import MODERN
from broker.testing import Broker
from tests.reliability.accounting import Answer

SERVICE_URL = "http://docbroker-broker.docbroker:8000"  # the Host the clients send (DOCBROKER_PUBLIC_URL)
PORT = 8000
OP_TIMEOUT = 120.0  # an operation not answered by then is a hang (the start timeout is 100 s)
PACE_S = 0.5  # a client's pause between operations: 0.5 to 1.5 s
QUERIES = ("tenant pod", "balancer", "api server", "replicas")
READS = ("plan.md", "notes.md", "faults.md")


@dataclass
class Exchange:
    """One HTTP request of a client, as the balancer saw it."""

    n: int
    tenant: str
    client: str
    http: str  # GET, POST, DELETE
    path: str
    method: str  # JSON-RPC method ("" for a GET or DELETE)
    tool: str
    report: str  # save_report's filename
    phase: str  # save_report: "wait" (asked) or "write" (approved, asked again)
    pod: str
    subject: str  # the operation's JWT subject
    op: str  # the operation: search, read, save, probe
    run_phase: str  # the fault running when it was sent ("steady": none)
    t0: float
    t1: float | None = None
    status: int | None = None
    failed: str | None = None  # "unsent" (refused before sending) or "sent" (lost after)


class Journal:
    """What the clients did, in memory and as JSON Lines (ops.jsonl, exchanges.jsonl)."""

    def __init__(self, folder: Path) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        self.ops_path = folder / "ops.jsonl"
        self.exchanges_path = folder / "exchanges.jsonl"
        self._ops = self.ops_path.open("a")
        self._exchanges = self.exchanges_path.open("a")
        self._n = itertools.count(1)
        self.open: dict[int, Exchange] = {}
        self.done: list[Exchange] = []
        self.ops: list[dict[str, Any]] = []
        self.phase: dict[str, str] = {}  # report name → the save phase its next call is in

    def begin(self, **fields: Any) -> Exchange:
        ex = Exchange(n=next(self._n), t0=time.time(), **fields)
        self.open[ex.n] = ex
        return ex

    def end(self, ex: Exchange, *, status: int | None = None, failed: str | None = None) -> None:
        ex.t1, ex.status, ex.failed = time.time(), status, failed
        self.open.pop(ex.n, None)
        self.done.append(ex)
        self._exchanges.write(json.dumps(asdict(ex), sort_keys=True) + "\n")

    def op(self, record: dict[str, Any]) -> None:
        self.ops.append(record)
        self._ops.write(json.dumps(record, sort_keys=True) + "\n")

    def in_flight(self, pred: Callable[[Exchange], bool]) -> list[Exchange]:
        return [ex for ex in list(self.open.values()) if pred(ex)]

    def close(self) -> None:
        for ex in list(self.open.values()):  # never answered: a hang, as the checks will say
            self._exchanges.write(json.dumps(asdict(ex), sort_keys=True) + "\n")
        self._ops.close()
        self._exchanges.close()


class Pool:
    """Where the balancer sends: the Ready broker Pods (`pods()`: name → IP), round-robin,
    skipping for 2 s one that refused a connection."""

    def __init__(self, pods: Callable[[], dict[str, str]]) -> None:
        self._pods = pods
        self._turn = itertools.count()
        self._refused: dict[str, float] = {}

    def order(self) -> list[tuple[str, str]]:
        now = time.monotonic()
        ready = sorted(self._pods().items())
        usable = [p for p in ready if self._refused.get(p[1], 0) < now] or ready
        if not usable:
            return []
        start = next(self._turn) % len(usable)
        return usable[start:] + usable[:start]

    def refused(self, ip: str) -> None:
        self._refused[ip] = time.monotonic() + 2.0


class _Tracked(httpx2.AsyncByteStream):
    """A response body that ends its exchange when it is read to its end or closed."""

    def __init__(self, inner: Any, done: Callable[[str | None], None]) -> None:
        self._inner = inner
        self._done = done
        self._failed: str | None = None

    async def __aiter__(self) -> AsyncIterator[bytes]:
        try:
            async for chunk in self._inner:
                yield chunk
        except BaseException:  # lost mid-answer, or the client gave up
            self._failed = "sent"
            raise

    async def aclose(self) -> None:
        try:
            await self._inner.aclose()
        finally:
            self._done(self._failed)


def _describe(body: bytes) -> tuple[str, str, str]:
    """JSON-RPC method, tool and save_report filename of a request body (names only)."""
    try:
        message = json.loads(body) if body else {}
    except ValueError:
        return "other", "", ""
    if not isinstance(message, dict):
        return "batch", "", ""
    params = message.get("params") or {}
    tool = str(params.get("name", "")) if message.get("method") == "tools/call" else ""
    arguments = params.get("arguments") or {}
    report = str(arguments.get("filename", "")) if tool == "save_report" else ""
    return str(message.get("method", "")), tool, report


@dataclass
class Operation:
    """The operation a client is in: what its HTTP requests are part of."""

    subject: str = ""
    op: str = "connect"
    exchanges: list[Exchange] = field(default_factory=list)


class Balancer(httpx2.AsyncBaseTransport):
    def __init__(
        self,
        pool: Pool,
        journal: Journal,
        tenant: str,
        client: str,
        current: Operation,
        phase: Callable[[], str],
    ) -> None:
        self._pool = pool
        self._journal = journal
        self._tenant = tenant
        self._client = client
        self._current = current
        self._phase = phase
        self._inner = httpx2.AsyncHTTPTransport()

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        body = await request.aread()
        method, tool, report = _describe(body)
        targets = self._pool.order()
        if not targets:
            raise httpx2.ConnectError("no Ready broker Pod", request=request)
        for pod, ip in targets:
            ex = self._journal.begin(
                tenant=self._tenant,
                client=self._client,
                http=request.method,
                path=request.url.path,
                method=method,
                tool=tool,
                report=report,
                phase=self._journal.phase.get(report, "") if report else "",
                pod=pod,
                subject=self._current.subject,
                op=self._current.op,
                run_phase=self._phase(),
            )
            self._current.exchanges.append(ex)
            forwarded = httpx2.Request(
                request.method,
                request.url.copy_with(scheme="http", host=ip, port=PORT),
                headers=request.headers,
                content=body,
                extensions=request.extensions,
            )
            try:
                response = await self._inner.handle_async_request(forwarded)
            except httpx2.ConnectError:
                self._journal.end(ex, failed="unsent")
                self._pool.refused(ip)
                continue
            except BaseException:  # lost after sending, or the client gave up (cancelled)
                self._journal.end(ex, failed="sent")
                raise
            status = response.status_code

            def done(failed: str | None, ex: Exchange = ex, status: int = status) -> None:
                if ex.t1 is None:
                    self._journal.end(ex, status=status, failed=failed)

            return httpx2.Response(
                status,
                headers=response.headers,
                stream=_Tracked(response.stream, done),
                extensions=response.extensions,
            )
        raise httpx2.ConnectError("every Ready broker Pod refused the connection", request=request)

    async def aclose(self) -> None:
        await self._inner.aclose()


@dataclass
class Load:
    """The whole client side of the run."""

    idp: Broker
    pool: Pool
    journal: Journal
    pods: Callable[[], dict[str, str]]
    stop: asyncio.Event
    answers: AnswerLog
    phase: str = "steady"  # the fault running now: stamped on every request sent meanwhile
    ops_done: int = 0

    @contextlib.asynccontextmanager
    async def client(self, tenant: str, name: str, current: Operation) -> AsyncIterator[tuple[Client, Any]]:
        http = httpx2.AsyncClient(
            transport=Balancer(self.pool, self.journal, tenant, name, current, lambda: self.phase),
            # beyond the broker's start timeout: a first call waits for its tenant's Pod
            timeout=OP_TIMEOUT + 30,
        )
        self._as(http, tenant, current, f"{name}-connect-{secrets.token_hex(3)}", "connect")
        async with (
            http,
            Client(
                streamable_http_client(f"{SERVICE_URL}/mcp", http_client=http),
                mode=MODERN,  # no session: every request stands alone, on whichever Pod
                read_timeout_seconds=OP_TIMEOUT - 5,
            ) as client,
        ):
            yield client, http

    def _as(self, http: Any, tenant: str, current: Operation, subject: str, op: str) -> None:
        """The next requests are one operation's: a subject of its own (its token)."""
        token = self.idp.token(tenant, subject=subject, scope="docs:read docs:write")
        http.headers["authorization"] = f"Bearer {token}"
        current.subject, current.op, current.exchanges = subject, op, []

    async def run_client(self, tenant: str, index: int) -> None:
        name = f"{tenant}-c{index}"
        counter = itertools.count(1)
        backoff = 0.5
        while not self.stop.is_set():
            current = Operation()
            try:
                async with self.client(tenant, name, current) as (client, http):
                    self.write_answers(tenant, current, {})
                    while not self.stop.is_set():
                        n = next(counter)
                        kind = ("search", "read", "save")[(n + index) % 3]
                        self._as(http, tenant, current, f"{name}-{n}", kind)
                        ok = await self._one(client, tenant, name, n, kind, current)
                        if not ok:
                            break  # a fresh client after any error, as a cautious client would
                        backoff = 0.5
                        # pacing, not sync: a CI-sized load (the brokers' CPU limit is one core
                        # each; at ~0.25 s apart their liveness probes went unanswered)
                        await asyncio.sleep(PACE_S + secrets.randbelow(1000) / 1000)
            except Exception as exc:  # the client's own start or end failed: record, go on
                self.write_answers(tenant, current, {})
                self.journal.op(
                    {
                        "id": uuid.uuid4().hex,
                        "tenant": tenant,
                        "client": name,
                        "op": "connect",
                        "outcome": "error",
                        "error": type(exc).__name__,
                        "t0": time.time(),
                        "t1": time.time(),
                    }
                )
            if not self.stop.is_set():  # as a client would: wait longer after each failure
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.stop.wait(), backoff)
                backoff = min(backoff * 2, 8.0)

    async def _one(
        self, client: Client, tenant: str, name: str, n: int, kind: str, current: Operation
    ) -> bool:
        record: dict[str, Any] = {
            "id": uuid.uuid4().hex,
            "tenant": tenant,
            "client": name,
            "subject": current.subject,
            "op": kind,
            "t0": time.time(),
        }
        try:
            async with asyncio.timeout(OP_TIMEOUT):
                if kind == "search":
                    result = await client.call_tool("search_documents", {"query": QUERIES[n % len(QUERIES)]})
                    record.update(_status(result))
                elif kind == "read":
                    result = await client.call_tool("read_document", {"filename": READS[n % len(READS)]})
                    record.update(_status(result))
                else:
                    await self._save(client, tenant, name, n, record)
        except TimeoutError:
            record.update(outcome="hang", error="TimeoutError")
        except Exception as exc:
            record.setdefault("outcome", "error")
            record["error"] = type(exc).__name__
            if isinstance(exc, MCPError):
                record["message"] = str(exc)[:80]  # the broker's fixed texts
            if record.get("stage") == "write" and self._write_was_sent(record):
                record["outcome"] = "result_unknown"  # it may have been written: never "error"
        record["t1"] = time.time()
        self.journal.op(record)
        self.write_answers(tenant, current, record)
        self.ops_done += 1
        return record["outcome"] in ("ok", "waiting_approval")

    def write_answers(self, tenant: str, current: Operation, record: dict[str, Any]) -> None:
        """One `accounting.Answer` per HTTP request of the operation just ended."""
        for ex in current.exchanges:
            self.answers.write(answer_of(ex, tenant, record))
        current.exchanges = []

    def _write_was_sent(self, record: dict[str, Any]) -> bool:
        """Whether the approved save's request went out and no answer came back: it may have
        been written. A broker's answer, even an error, is the broker's word."""
        return any(
            ex.report == record["report"] and ex.phase == "write" and (ex.failed == "sent" or ex.t1 is None)
            for ex in self.journal.done + list(self.journal.open.values())
        )

    async def _save(self, client: Client, tenant: str, name: str, n: int, record: dict[str, Any]) -> None:
        report = f"{name}-{n}.md"
        content = f"# Report {n}\n\n{secrets.token_hex(24)}\n"
        args = {"filename": report, "content": content}
        record.update(report=report, sha256=hashlib.sha256(content.encode()).hexdigest(), stage="wait")
        self.journal.phase[report] = "wait"
        result = await client.call_tool("save_report", args)
        asked = _status(result)
        record["asked"] = asked["tool_status"]
        if asked["tool_status"] != "waiting_approval":
            record.update(asked)
            return
        approval = str(result.structured_content["data"]["approval_id"])
        record["approval_id"] = approval
        waited_on = next(
            (ex.pod for ex in reversed(self.journal.done) if ex.report == report and ex.phase == "wait"), ""
        )
        record["stage"] = "approve"
        record["waited_on"] = waited_on
        record["approved_on"], record["approved_where"] = await self._approve(tenant, approval, waited_on, n)
        record["stage"] = "write"
        self.journal.phase[report] = "write"
        written = _status(await client.call_tool("save_report", args))
        record.update(written)
        record["saved_on"] = next(
            (ex.pod for ex in reversed(self.journal.done) if ex.report == report and ex.phase == "write"), ""
        )

    async def _approve(self, tenant: str, approval: str, waited_on: str, n: int) -> tuple[str, str]:
        """Approve on the other Pod (n odd) or the one that answered (n even); any Ready Pod when
        that one is gone. Returns (the Pod that approved, "other" / "same" / "any")."""
        subject = f"approver-{approval[:12]}"
        token = self.idp.token(tenant, subject=subject, scope="reports:approve")
        deadline = time.monotonic() + 30
        while True:
            pods = self.pods()
            want = [p for p in sorted(pods) if (p != waited_on) == (n % 2 == 1)]
            order = want + [p for p in sorted(pods) if p not in want]
            for pod in order:
                started, status = time.monotonic(), None
                try:
                    async with httpx2.AsyncClient(timeout=10) as http:
                        await http.get(  # read first: a yes counts only from someone shown the content
                            f"http://{pods[pod]}:{PORT}/v1/approvals/{approval}",
                            headers={"authorization": f"Bearer {token}"},
                        )
                        answer = await http.post(
                            f"http://{pods[pod]}:{PORT}/v1/approvals/{approval}/approve",
                            headers={"authorization": f"Bearer {token}"},
                        )
                    status = answer.status_code
                except httpx2.TransportError:
                    pass
                self.answers.write(
                    Answer(
                        id=f"approve-{uuid.uuid4().hex[:16]}",
                        subject=subject,
                        tenant=tenant,
                        op="approve",
                        outcome="ok" if status == 200 else "error",
                        replica=pod,
                        phase=self.phase,
                        status=status,
                        elapsed_s=round(time.monotonic() - started, 3),
                        approval_id=approval,
                    )
                )
                if status == 200:
                    where = "same" if pod == waited_on else "other"
                    return pod, where if pod in want else "any"
                if status is not None and status < 500:
                    raise RuntimeError(f"approve answered {status}")
            if time.monotonic() > deadline:
                raise RuntimeError("no Pod approved within 30 s")
            await asyncio.sleep(0.5)


def answer_of(ex: Exchange, tenant: str, record: dict[str, Any]) -> Answer:
    """An HTTP request of an operation as an `accounting.Answer`.

    The tool call gets the operation's outcome (a save's asking request its own: `ok` when it
    waits for approval); another request of the operation (a tools/list the SDK sends) `ok`
    when answered 2xx. A request that got no answer: `result_unknown` if it was the approved
    save's, `error` otherwise. `op`: the save's asking request (and any other request of a
    save) is `save.ask`, its approved write `save`."""
    call = ex.method == "tools/call"
    if ex.status is None:
        outcome = "result_unknown" if (call and ex.phase == "write" and ex.failed == "sent") else "error"
    elif call and ex.tool == "save_report" and ex.phase == "wait":
        outcome = "ok" if record.get("asked") == "waiting_approval" else "error"
    elif call:
        outcome = record.get("outcome", "error")
        outcome = outcome if outcome in ("ok", "result_unknown") else "error"
    else:
        outcome = "ok" if 200 <= ex.status < 300 else "error"
    write = call and ex.tool == "save_report" and ex.phase == "write"
    op = ex.op
    if op == "save":
        op = "save" if write else "save.ask"
    elif op == "connect":
        op = "connect"  # no operation's: not counted (its subject is its own)
    elif op == "probe" and not call:
        op = "search"  # a probe's other requests are not the fresh call itself
    return Answer(
        id=f"{ex.client}.{ex.n}",
        subject=ex.subject,
        tenant=tenant,
        op=op,
        outcome=outcome,
        replica=ex.pod,
        phase=ex.run_phase,
        status=ex.status if ex.failed is None else None,
        elapsed_s=round((ex.t1 or time.time()) - ex.t0, 3),
        filename=ex.report or None,
        sha256=record.get("sha256") if ex.tool == "save_report" else None,
        approval_id=record.get("approval_id") if write else None,
    )


class AnswerLog:
    """The run's `accounting.Answer` lines (answers.jsonl), flushed line by line."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._file = path.open("a", encoding="utf-8")

    def write(self, answer: Answer) -> None:
        self._file.write(answer.to_json() + "\n")
        self._file.flush()

    def close(self) -> None:
        self._file.close()


def _status(result: Any) -> dict[str, Any]:
    value = result.structured_content if result is not None else None
    if not isinstance(value, dict):
        return {"outcome": "error", "tool_status": "none"}
    status = str(value.get("status"))
    outcome = {"ok": "ok", "result_unknown": "result_unknown", "waiting_approval": "waiting_approval"}
    return {"outcome": outcome.get(status, "error"), "tool_status": status}
