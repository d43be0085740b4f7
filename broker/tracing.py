"""OpenTelemetry traces of `/mcp` requests (DOCBROKER_TRACING, off by default; docs/tracing.md).

One span per request, named and described by names only: method, tool, tenant, outcome,
reason, status, the broker's request id (the audit line's). The caller's W3C `traceparent`
(the header, or the 2026-07-28 `params._meta.traceparent`) is its parent; `tracestate` is not
taken (free text a client chooses would travel into the operator's trace store). The span's
own `traceparent` goes to the sandbox with the forwarded request.

The sandbox cannot export (it has no network): it returns plain span records with its answer
(server/spans.py), and `SandboxSpans.check` admits them as the untrusted input they are —
a bounded number, names from a fixed list, ids that descend from this request's span, times
inside the window the broker itself saw the sandbox work, no attributes and no messages.
What fails a check is dropped and counted on the request's span.

The exporter is OTLP over HTTP, configured by the standard `OTEL_*` variables (read by the
SDK: OTEL_EXPORTER_OTLP_ENDPOINT, OTEL_SERVICE_NAME, OTEL_TRACES_SAMPLER, OTEL_BSP_*, ...).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.trace import NonRecordingSpan, Span, SpanContext, SpanKind, Status, StatusCode, TraceFlags

from broker.protocol.methods import audit_method
from broker.types import Outcome
from server import contracts as c
from server import spans as sandbox

_TRACEPARENT = re.compile(r"00-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})")
_SPAN_ID = re.compile(r"[0-9a-f]{16}")
# What a sandbox may say about its spans (server/spans.py writes no more than this).
MAX_SANDBOX_SPANS = 8
_SANDBOX_NAMES = frozenset({sandbox.REQUEST_SPAN, sandbox.TOOL_SPAN})
_RECORD_KEYS = frozenset({"name", "span_id", "parent_id", "start_ns", "end_ns", "status"})
_FAILED = frozenset({Outcome.ERROR, Outcome.FAILED, Outcome.RESULT_UNKNOWN})


class Ended(Protocol):
    """What a span is made of: the request's record (broker.gateway.record.CallRecord), the
    one the audit line is made of too."""

    request_id: str
    method: str
    tool: str | None
    outcome: Outcome
    reason: str
    status: int
    sent_ns: int | None
    sandbox_spans: SandboxSpans | None

    def describe_request(self) -> dict[str, Any]: ...


@dataclass(frozen=True)
class SandboxSpan:
    name: str
    span_id: str
    parent_id: str
    start_ns: int  # offsets from when the broker sent the request
    end_ns: int
    ok: bool


@dataclass
class SandboxSpans:
    """The sandbox's span records of one answer, as far as they passed the checks."""

    spans: list[SandboxSpan] = field(default_factory=list)
    dropped: int = 0

    @classmethod
    def check(cls, answer: Any, traceparent: str, window_ns: int) -> SandboxSpans:
        """The records in a sandbox's `answer` (a JSON-RPC response) that may be believed:
        of this trace, each the child of this request's span or of a record before it, inside
        the `window_ns` the broker waited for the answer."""
        result = answer.get("result") if isinstance(answer, dict) else None
        meta = result.get("_meta") if isinstance(result, dict) else None
        raw = meta.get(sandbox.SPANS_META) if isinstance(meta, dict) else None
        if raw is None:
            return cls()
        parent = _TRACEPARENT.fullmatch(traceparent)
        records = raw.get("spans") if isinstance(raw, dict) else None
        if parent is None or not isinstance(records, list) or raw.get("trace_id") != parent[1]:
            return cls(dropped=len(records) if isinstance(records, list) else 1)
        out = cls(dropped=max(0, len(records) - MAX_SANDBOX_SPANS))
        known = {parent[2]}
        for item in records[:MAX_SANDBOX_SPANS]:
            span = _record(item, known, window_ns)
            if span is None:
                out.dropped += 1
            else:
                known.add(span.span_id)
                out.spans.append(span)
        return out


def _record(item: Any, known: set[str], window_ns: int) -> SandboxSpan | None:
    if not isinstance(item, dict) or item.keys() != _RECORD_KEYS:
        return None
    name, span_id, parent_id = item["name"], item["span_id"], item["parent_id"]
    start, end, status = item["start_ns"], item["end_ns"], item["status"]
    if not all(isinstance(v, str) for v in (name, span_id, parent_id, status)):
        return None  # before any lookup: a list or an object is no key of a set
    if name not in _SANDBOX_NAMES or status not in ("ok", "error") or parent_id not in known:
        return None
    if not _SPAN_ID.fullmatch(span_id) or span_id in known:
        return None
    if type(start) is not int or type(end) is not int or not 0 <= start <= end <= window_ns:
        return None
    return SandboxSpan(name, span_id, parent_id, start, end, status == "ok")


class RequestSpan:
    """The span of one `/mcp` request, ended once with what the record says."""

    def __init__(self, span: Span) -> None:
        self._span = span
        ctx = span.get_span_context()
        self.traceparent = f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-{int(ctx.trace_flags):02x}"

    def end(self, record: Ended, tracer: trace.Tracer) -> None:
        fields = record.describe_request()  # the audit line's names: never a value
        attributes: dict[str, str | int] = {
            "docbroker.request_id": record.request_id,
            "mcp.method.name": fields["method"],
            "docbroker.outcome": record.outcome.value,
            "docbroker.reason": record.reason,
            "http.response.status_code": record.status,
        }
        for key in ("tool", "tenant"):
            if key in fields:
                attributes[f"docbroker.{key}"] = fields[key]
        relayed = record.sandbox_spans
        if relayed is not None:
            attributes["docbroker.sandbox_spans_dropped"] = relayed.dropped
            if record.sent_ns is not None:
                _emit(tracer, self._span, relayed, record.sent_ns)
        self._span.set_attributes(attributes)
        self._span.update_name(span_name(record))
        if record.outcome in _FAILED:
            self._span.set_status(Status(StatusCode.ERROR))  # no description: it could carry a value
        self._span.end()


def _emit(tracer: trace.Tracer, parent: Span, relayed: SandboxSpans, sent_ns: int) -> None:
    emitted: dict[str, Span] = {}
    parent_id = f"{parent.get_span_context().span_id:016x}"
    for record in relayed.spans:
        above = parent if record.parent_id == parent_id else emitted[record.parent_id]
        span = tracer.start_span(
            record.name,
            context=trace.set_span_in_context(above),
            kind=SpanKind.SERVER if record.name == sandbox.REQUEST_SPAN else SpanKind.INTERNAL,
            start_time=sent_ns + record.start_ns,
        )
        if not record.ok:
            span.set_status(Status(StatusCode.ERROR))
        span.end(end_time=sent_ns + record.end_ns)
        emitted[record.span_id] = span


def _ignore(_: int) -> None:
    pass


class Tracing:
    """The broker's tracer, or nothing at all when tracing is off (no SDK work per request)."""

    def __init__(self, provider: TracerProvider | None, on_dropped: Callable[[int], None] = _ignore) -> None:
        self._provider = provider
        self._tracer = provider.get_tracer("docbroker") if provider is not None else None
        self._on_dropped = on_dropped  # counts the sandbox's records that failed the checks

    @classmethod
    def from_settings(cls, enabled: bool, on_dropped: Callable[[int], None]) -> Tracing:
        if not enabled:
            return cls(None)
        # Resource.create() and the exporter read the standard OTEL_* variables themselves; the
        # service is `docbroker` unless OTEL_SERVICE_NAME (or OTEL_RESOURCE_ATTRIBUTES) names it.
        resource = Resource.create()
        if str(resource.attributes.get("service.name", "")).startswith("unknown_service"):
            resource = resource.merge(Resource({"service.name": "docbroker"}))
        # Shut down by the app's lifespan (`shutdown`), not by an atexit hook of the SDK's own.
        provider = TracerProvider(resource=resource, shutdown_on_exit=False)
        provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
        return cls(provider, on_dropped)

    @property
    def enabled(self) -> bool:
        return self._tracer is not None

    def start(self, started_ns: int, headers: Mapping[str, str], meta: Any) -> RequestSpan | None:
        """The request's span from `started_ns`, under the caller's trace if it sent one: the
        `traceparent` header first, else the body's `_meta.traceparent`."""
        if self._tracer is None:
            return None
        carrier = headers.get("traceparent")
        if carrier is None and isinstance(meta, dict) and isinstance(meta.get("traceparent"), str):
            carrier = meta["traceparent"]
        span = self._tracer.start_span(
            "mcp.request", context=_parent(carrier), kind=SpanKind.SERVER, start_time=started_ns
        )
        return RequestSpan(span)

    def end(self, span: RequestSpan | None, record: Ended) -> None:
        if span is not None and self._tracer is not None:
            span.end(record, self._tracer)
        if record.sandbox_spans is not None and record.sandbox_spans.dropped:
            self._on_dropped(record.sandbox_spans.dropped)

    def shutdown(self) -> None:
        """Export what is left (the batch processor's queue) before the process ends."""
        if self._provider is not None:
            self._provider.shutdown()


def _parent(carrier: str | None) -> Context | None:
    match = _TRACEPARENT.fullmatch(carrier) if carrier is not None else None
    if match is None or match[3] == "ff":
        return None  # absent or malformed: a new trace (version 00 only, W3C's "ff" is invalid)
    trace_id, span_id = int(match[1], 16), int(match[2], 16)
    if trace_id == 0 or span_id == 0:
        return None
    flags = TraceFlags(int(match[3], 16) & TraceFlags.SAMPLED)
    remote = SpanContext(trace_id, span_id, is_remote=True, trace_flags=flags)
    return trace.set_span_in_context(NonRecordingSpan(remote))


def span_name(record: Ended) -> str:
    """`tools/call read_document`: the method and tool by their audit names."""
    method = audit_method(record.method)
    tool = record.tool if record.tool in c.TOOL_NAMES else None
    return f"{method} {tool}" if tool else method
