"""The clients of a reliability run: MCP requests over HTTP (protocol 2026-07-28: every request
carries its version and capabilities in `_meta`, so any replica can answer any request),
approvals over REST, each HTTP request written down as one `accounting.Answer` line.

Each client operation has a subject of its own (the JWT `sub`), so the audit's terminal events
can be matched to the requests that caused them without any id the broker would have to echo.
A save is one operation of three requests: ask (answered `waiting_approval`), approve (REST, by
a person of the tenant, on the other replica half the time), save (the write). A save is
retried only after a definite refusal ("retry later"); never after an answer that did not
come, which is `result_unknown`.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx2

from broker.testing import Broker
from tests.broker.support import modern_body, modern_headers
from tests.reliability.accounting import Answer

# Every client call is bounded, whole (not per read as httpx's own timeouts): a call that
# reaches the bound is a hang, and the accounting's `no_hang` names it.
CALL_TIMEOUT_S = 60.0
READ_SCOPE = "docs:read docs:write"
APPROVER_SCOPE = "reports:approve"
DOC = "# Notes\n\nThe tenant's notes for the reliability run.\n"


class AnswerLog:
    """One client's answers, appended and flushed line by line (a crash keeps what was said)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._file = path.open("a", encoding="utf-8")
        self.answers: list[Answer] = []

    def write(self, answer: Answer) -> Answer:
        self._file.write(answer.to_json() + "\n")
        self._file.flush()
        self.answers.append(answer)
        return answer

    def close(self) -> None:
        self._file.close()


@dataclass
class Reply:
    status: int | None
    body: dict[str, Any] | None
    elapsed_s: float

    @property
    def result(self) -> dict[str, Any] | None:
        """The tool result's structured content, when the answer is one."""
        if self.body is None or not isinstance(self.body.get("result"), dict):
            return None
        structured = self.body["result"].get("structuredContent")
        return structured if isinstance(structured, dict) else None

    @property
    def rpc_code(self) -> int | None:
        error = (self.body or {}).get("error")
        return error.get("code") if isinstance(error, dict) else None


def _parse(response: httpx2.Response) -> dict[str, Any] | None:
    try:
        if response.headers.get("content-type", "").startswith("text/event-stream"):
            replies = [
                json.loads(line[5:])
                for line in response.text.splitlines()
                if line.startswith("data:") and line[5:].strip()
            ]
            final = [r for r in replies if isinstance(r, dict) and ("result" in r or "error" in r)]
            return final[-1] if final else None
        value = response.json()
        return value if isinstance(value, dict) else None
    except ValueError:
        return None


async def post(
    http: httpx2.AsyncClient, url: str, token: str | None, path: str, json_body: Any, headers: dict[str, str]
) -> Reply:
    started = time.monotonic()
    sent = {**headers, **({"authorization": f"Bearer {token}"} if token else {})}
    try:
        async with asyncio.timeout(CALL_TIMEOUT_S):
            response = await http.post(url + path, json=json_body, headers=sent, timeout=CALL_TIMEOUT_S)
    except (httpx2.TransportError, TimeoutError):  # refused, reset, the client's own bound
        return Reply(None, None, time.monotonic() - started)
    return Reply(response.status_code, _parse(response), time.monotonic() - started)


async def call_tool(
    http: httpx2.AsyncClient, replica: Broker, token: str, tool: str, arguments: dict[str, Any]
) -> Reply:
    body = modern_body("tools/call", {"name": tool, "arguments": arguments})
    return await post(http, replica.url, token, "/mcp", body, modern_headers("tools/call", tool))


def outcome_of(reply: Reply, *, write: bool) -> str:
    if reply.status is None:
        return "result_unknown" if write else "error"
    result = reply.result
    if reply.status == 200 and result is not None:
        status = result.get("status")
        if status == "ok" or (status == "waiting_approval" and not write):
            return "ok"  # a save asked again for approval wrote nothing: that is an `error`
        if status == "result_unknown":
            return "result_unknown"
    return "error"


@dataclass
class Fleet:
    """What the clients need to know of the deployment, and the run's shared state."""

    replicas: Sequence[Broker]
    phase: str = "steady"  # the fault running now: stamped on every answer sent meanwhile
    stopping: asyncio.Event = field(default_factory=asyncio.Event)
    ids: dict[str, int] = field(default_factory=dict)

    def replica_name(self, index: int) -> str:
        return "abcdefgh"[index]


class Client:
    """One tenant's MCP client: search, read and save-with-approval in a seeded mix."""

    def __init__(self, fleet: Fleet, tenant: str, name: str, log: AnswerLog, seed: int) -> None:
        self.fleet, self.tenant, self.name, self.log = fleet, tenant, name, log
        self.rng = random.Random(seed)
        self.http = httpx2.AsyncClient(timeout=CALL_TIMEOUT_S)
        self.n = 0
        self.next_replica = self.rng.randrange(len(fleet.replicas))

    def _replica(self, other_than: int | None = None) -> int:
        if other_than is not None:
            return (other_than + 1) % len(self.fleet.replicas)
        self.next_replica = (self.next_replica + 1) % len(self.fleet.replicas)
        return self.next_replica

    def record(self, reply: Reply, *, op: str, subject: str, index: int, write: bool = False,
               **extra: Any) -> Answer:  # fmt: skip
        self.n += 1
        return self.log.write(
            Answer(
                id=f"{self.name}.{self.n}",
                subject=subject,
                tenant=self.tenant,
                op=op,
                outcome=extra.pop("outcome", None) or outcome_of(reply, write=write),
                replica=self.fleet.replica_name(index),
                phase=self.fleet.phase,
                status=reply.status,
                rpc_code=reply.rpc_code,
                elapsed_s=round(reply.elapsed_s, 3),
                **extra,
            )
        )

    async def run(self, pace: Callable[[], float]) -> None:
        try:
            k = 0
            while not self.fleet.stopping.is_set():
                k += 1
                roll = self.rng.random()
                if roll < 0.4:
                    await self.search(k)
                elif roll < 0.7:
                    await self.read(k)
                else:
                    await self.save(k, approve_elsewhere=k % 2 == 1)
                await asyncio.sleep(pace())
        finally:
            await self.http.aclose()

    def token(self, subject: str, scope: str = READ_SCOPE) -> str:
        return self.fleet.replicas[0].token(self.tenant, subject=subject, scope=scope)

    async def read(self, k: int, *, op: str = "read", index: int | None = None) -> Answer:
        subject = f"{self.name}-{k}"
        index = self._replica() if index is None else index
        reply = await call_tool(self.http, self.fleet.replicas[index], self.token(subject), "read_document",
                                {"filename": "notes.md"})  # fmt: skip
        return self.record(reply, op=op, subject=subject, index=index)

    async def search(self, k: int) -> Answer:
        subject = f"{self.name}-{k}"
        index = self._replica()
        arguments = {"query": "notes", "max_results": 3}
        reply = await call_tool(
            self.http, self.fleet.replicas[index], self.token(subject), "search_documents", arguments
        )
        return self.record(reply, op="search", subject=subject, index=index)

    async def ask(self, subject: str, filename: str, content: str, index: int) -> tuple[Answer, str | None]:
        arguments = {"filename": filename, "content": content}
        reply = await call_tool(
            self.http, self.fleet.replicas[index], self.token(subject), "save_report", arguments
        )
        result = reply.result or {}
        approval_id = (
            (result.get("data") or {}).get("approval_id")
            if result.get("status") == "waiting_approval"
            else None
        )
        outcome = "ok" if approval_id else "error"
        answer = self.record(reply, op="save.ask", subject=subject, index=index, outcome=outcome,
                             approval_id=approval_id)  # fmt: skip
        return answer, approval_id

    async def approve(self, subject: str, approval_id: str, index: int) -> Answer:
        approver = f"approver-{self.name}"
        token = self.fleet.replicas[0].token(self.tenant, subject=approver, scope=APPROVER_SCOPE)
        # A yes counts only from someone the content was shown to: read it first (any answer
        # but the content makes the approve below refused, which the run records).
        with contextlib.suppress(httpx2.HTTPError):
            await self.http.get(
                f"{self.fleet.replicas[index].url}/v1/approvals/{approval_id}",
                headers={"authorization": f"Bearer {token}"},
                timeout=CALL_TIMEOUT_S,
            )
        reply = await post(self.http, self.fleet.replicas[index].url, token,
                           f"/v1/approvals/{approval_id}/approve", None, {})  # fmt: skip
        outcome = "ok" if reply.status == 200 else "error"
        return self.record(reply, op="approve", subject=subject, index=index, outcome=outcome,
                           approval_id=approval_id)  # fmt: skip

    async def write(self, subject: str, filename: str, content: str, index: int, approval_id: str) -> Answer:
        sha = hashlib.sha256(content.encode()).hexdigest()
        reply = await call_tool(self.http, self.fleet.replicas[index], self.token(subject), "save_report",
                                {"filename": filename, "content": content})  # fmt: skip
        return self.record(reply, op="save", subject=subject, index=index, write=True, filename=filename,
                           sha256=sha, approval_id=approval_id)  # fmt: skip

    async def save(self, k: int, *, approve_elsewhere: bool, attempts: int = 4) -> Answer | None:
        subject = f"{self.name}-{k}"
        filename = f"r-{self.name}-{k}.md"
        content = f"# Report {self.name} {k}\n\n{self.rng.getrandbits(64):016x}\n"
        asked_on = self._replica()
        _, approval_id = await self.ask(subject, filename, content, asked_on)
        if approval_id is None:
            return None
        decided = await self.approve(
            subject, approval_id, self._replica(asked_on) if approve_elsewhere else asked_on
        )
        if decided.outcome != "ok":
            return None
        answer = None
        for _ in range(attempts):
            answer = await self.write(subject, filename, content, self._replica(), approval_id)
            # Only a definite "retry later" is retried; no answer is result_unknown, never resent.
            if not (answer.status == 503 and answer.outcome == "error"):
                break
            await asyncio.sleep(1.0)  # the broker's Retry-After is 2 to 5 s; pacing, not a sync
        return answer
