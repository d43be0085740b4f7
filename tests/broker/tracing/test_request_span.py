"""The request span as the SDK's in-memory exporter receives it, made from a real CallRecord:
the names the audit uses, an error without a description, the caller's context (header before
`_meta`, `tracestate` never), and the sandbox's checked records nested and anchored."""

from __future__ import annotations

import time

from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from broker.gateway.record import CallRecord
from broker.protocol import jsonrpc as rpc
from broker.tracing import SandboxSpans, Tracing
from broker.types import Outcome
from server.spans import SPANS_META

TRACE, CALLER = "ab" * 16, "cd" * 8


def tracing() -> tuple[Tracing, InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return Tracing(provider), exporter


def call_record(tool: str, arguments: dict[str, object]) -> CallRecord:
    record = CallRecord(request_id="f" * 32, started=time.perf_counter())
    body = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "tools/call",
        "params": {"name": tool, "arguments": arguments},
    }
    record.read(rpc.RpcMessage(body), "2026-07-28")
    return record


def test_a_failed_call_has_names_and_an_error_without_a_description() -> None:
    t, exporter = tracing()
    record = call_record("read_document", {"filename": "canary-file.md", "canary-key": "canary-value"})
    span = t.start(time.time_ns(), {"traceparent": f"00-{TRACE}-{CALLER}-01", "tracestate": "k=canary"}, None)
    record.end(Outcome.FAILED, "tool_failed")
    t.end(span, record)
    (done,) = exporter.get_finished_spans()
    assert done.name == "tools/call read_document" and done.kind == SpanKind.SERVER
    assert done.parent is not None and f"{done.parent.span_id:016x}" == CALLER
    assert f"{done.context.trace_id:032x}" == TRACE and not done.context.trace_state
    assert done.status.status_code == StatusCode.ERROR and done.status.description is None
    assert "canary" not in repr(dict(done.attributes or {}))
    assert done.events == ()


def test_the_header_wins_over_meta_and_a_bad_one_starts_a_new_trace() -> None:
    t, exporter = tracing()
    record = call_record("search_documents", {"query": "x"})
    meta = {"traceparent": f"00-{'12' * 16}-{'34' * 8}-01"}
    t.end(t.start(time.time_ns(), {"traceparent": f"00-{TRACE}-{CALLER}-01"}, meta), record)
    t.end(t.start(time.time_ns(), {}, meta), record)
    t.end(t.start(time.time_ns(), {"traceparent": f"ff-{TRACE}-{CALLER}-01"}, None), record)
    header, from_meta, fresh = exporter.get_finished_spans()
    assert f"{header.context.trace_id:032x}" == TRACE
    assert f"{from_meta.context.trace_id:032x}" == "12" * 16
    assert fresh.parent is None and f"{fresh.context.trace_id:032x}" not in (TRACE, "12" * 16)


def test_the_sandbox_records_are_nested_under_the_request_and_anchored_at_the_send() -> None:
    t, exporter = tracing()
    record = call_record("read_document", {"filename": "a.md"})
    span = t.start(time.time_ns(), {}, None)
    assert span is not None
    record.traceparent, record.sent_ns = span.traceparent, time.time_ns()
    own = span.traceparent.split("-")
    records = [
        {"name": "sandbox.request", "span_id": "11" * 8, "parent_id": own[2], "start_ns": 100,
         "end_ns": 900, "status": "ok"},
        {"name": "sandbox.tool", "span_id": "22" * 8, "parent_id": "11" * 8, "start_ns": 200,
         "end_ns": 800, "status": "error"},
    ]  # fmt: skip
    answer = {"id": 1, "result": {"_meta": {SPANS_META: {"trace_id": own[1], "spans": records}}}}
    record.sandbox_spans = SandboxSpans.check(answer, span.traceparent, 10_000)
    record.end(Outcome.OK, "tool_ok")
    t.end(span, record)
    request, tool, call = exporter.get_finished_spans()
    assert request.parent is not None and request.parent.span_id == call.context.span_id
    assert tool.parent is not None and tool.parent.span_id == request.context.span_id
    assert (request.start_time, request.end_time) == (record.sent_ns + 100, record.sent_ns + 900)
    assert (tool.start_time, tool.end_time) == (record.sent_ns + 200, record.sent_ns + 800)
    assert tool.status.status_code == StatusCode.ERROR and call.status.status_code == StatusCode.UNSET
    assert f"{request.context.span_id:016x}" != "11" * 8  # the broker's own ids, not the sandbox's
    assert call.attributes is not None and call.attributes["docbroker.sandbox_spans_dropped"] == 0
