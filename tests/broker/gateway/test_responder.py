"""broker/gateway/responder.py in process: one answer per request, sent only once audited.

The audit log is the real one (pipeline, chain) over a memory sink (broker.audit.testing); the
ASGI `send` records what would reach the client, and what the log held at that moment.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

from broker.audit.testing import MemorySink, capture_audit
from broker.errors import Denial
from broker.gateway.record import CallRecord
from broker.gateway.responder import AuditFailed, Responder
from broker.protocol import jsonrpc as rpc
from broker.types import Outcome, Principal


class Client:
    """An ASGI `send` that notes each message with the number of audit lines written before it."""

    def __init__(self, sink: MemorySink) -> None:
        self.sink = sink
        self.sent: list[tuple[dict[str, Any], int]] = []

    async def __call__(self, message: Any) -> None:
        self.sent.append((dict(message), len(self.sink.lines)))

    @property
    def body(self) -> bytes:
        return b"".join(m.get("body", b"") for m, _ in self.sent if m["type"] == "http.response.body")


def _record() -> CallRecord:
    record = CallRecord(request_id="0" * 32, started=time.perf_counter())
    record.principal = Principal(tenant="acme", subject="alice", scopes=frozenset())
    record.method, record.rpc_id = "ping", 7
    return record


def test_a_whole_answer_leaves_only_after_its_event_is_written() -> None:
    async def scenario() -> tuple[Client, MemorySink]:
        async with capture_audit() as (audit, sink):
            client = Client(sink)
            record = _record()
            record.end(Outcome.OK, "ok")
            out = Responder(client, record, audit)
            await out.json(200, rpc.result(7, {}))
            await out.json(200, rpc.result(7, {"second": True}))  # never a second answer
            out.close()
            return client, sink

    client, sink = asyncio.run(scenario())
    assert [m["type"] for m, _ in client.sent] == ["http.response.start", "http.response.body"]
    assert all(lines_before == 1 for _, lines_before in client.sent)  # the event came first
    assert json.loads(client.body) == {"jsonrpc": "2.0", "id": 7, "result": {}}
    (event,) = sink.events
    assert (event["event"], event["outcome"], event["status"]) == ("mcp.request", "ok", 200)


def test_an_unwritable_log_turns_the_answer_into_the_audit_refusal() -> None:
    async def scenario() -> Client:
        async with capture_audit() as (audit, sink):
            client = Client(sink)
            record = _record()
            record.end(Outcome.OK, "ok")
            sink.failing = True
            out = Responder(client, record, audit)
            await out.json(200, rpc.result(7, {"secret": "CANARY-NOT-RELEASED"}))
            return client

    client = asyncio.run(scenario())
    start = client.sent[0][0]
    assert start["status"] == Denial.AUDIT_UNAVAILABLE.status
    assert b"CANARY-NOT-RELEASED" not in client.body
    assert json.loads(client.body)["error"]["code"] == Denial.AUDIT_UNAVAILABLE.code


def test_a_streamed_answer_is_held_back_when_its_event_cannot_be_written() -> None:
    async def scenario() -> tuple[Client, bool]:
        async with capture_audit() as (audit, sink):
            client = Client(sink)
            record = _record()
            out = Responder(client, record, audit)
            await out.start(200, [(b"content-type", b"text/event-stream")])
            await out.chunk(b"event: message\ndata: {}\n\n")  # a notification: not the answer
            sink.failing = True
            record.end(Outcome.OK, "ok")
            try:
                await out.answer(b"event: message\ndata: CANARY-ANSWER\n\n")
            except AuditFailed:
                return client, True
            return client, False

    client, refused = asyncio.run(scenario())
    assert refused
    assert b"CANARY-ANSWER" not in client.body


def test_a_refusal_is_answered_from_its_denial_row() -> None:
    async def scenario() -> tuple[Client, MemorySink]:
        async with capture_audit() as (audit, sink):
            client = Client(sink)
            record = _record()
            record.denied(Denial.TOOL_NOT_ALLOWED, "tool_not_allowed")
            await Responder(client, record, audit).refuse(Denial.TOOL_NOT_ALLOWED)
            return client, sink

    client, sink = asyncio.run(scenario())
    assert client.sent[0][0]["status"] == Denial.TOOL_NOT_ALLOWED.status
    assert json.loads(client.body)["error"] == {
        "code": Denial.TOOL_NOT_ALLOWED.code,
        "message": Denial.TOOL_NOT_ALLOWED.message,
    }
    (event,) = sink.events
    assert (event["event"], event["outcome"]) == ("policy.denied", "denied")
    assert event["reason"] == "tool_not_allowed"
