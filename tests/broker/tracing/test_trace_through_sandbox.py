"""A traced call through the real broker and the real server (local runtime), collected by a
real OTLP/HTTP receiver: the broker's span under the caller's trace, the sandbox's spans under
it, names and timings only — no argument value (a canary) in anything exported."""

from __future__ import annotations

import secrets
from collections.abc import Iterator

import pytest

from broker.testing import Broker, make_broker
from tests.broker.support import (
    MODERN,
    LegacySession,
    call_modern,
    modern_headers,
    open_http,
    rpc_reply,
    tool_status,
    wait_for,
)
from tests.broker.tracing.otlp_receiver import ReceivedSpan, Receiver, otlp_receiver

SERVER, INTERNAL = 2, 1  # OTLP SpanKind numbers
ERROR = 2  # OTLP status code


@pytest.fixture(scope="module")
def receiver() -> Iterator[Receiver]:
    with otlp_receiver() as r:
        yield r


def tracing_env(receiver: Receiver) -> dict[str, str]:
    return {
        "DOCBROKER_TRACING": "1",
        "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint,
        "OTEL_BSP_SCHEDULE_DELAY": "50",  # export within 50 ms, not the default 5 s
    }


@pytest.fixture(scope="module")
def traced(tmp_path_factory: pytest.TempPathFactory, receiver: Receiver) -> Iterator[Broker]:
    env = {**tracing_env(receiver), "OTEL_SERVICE_NAME": "docbroker-eu1"}
    broker = make_broker(tmp_path_factory.mktemp("traced"), env=env)
    broker.start()
    try:
        yield broker
    finally:
        broker.stop()


def new_trace() -> tuple[str, str, str]:
    trace_id, parent = secrets.token_hex(16), secrets.token_hex(8)
    return trace_id, parent, f"00-{trace_id}-{parent}-01"


def spans_of(receiver: Receiver, trace_id: str, count: int) -> list[ReceivedSpan]:
    assert wait_for(lambda: len(receiver.in_trace(trace_id)) >= count, timeout=15)
    return receiver.in_trace(trace_id)


def one(spans: list[ReceivedSpan], name: str) -> ReceivedSpan:
    found = [s for s in spans if s.name == name]
    assert len(found) == 1, [s.name for s in spans]
    return found[0]


def canary_source(broker: Broker, tenant: str) -> tuple[str, str]:
    """A document whose name and content are canaries: values that must never be exported."""
    name, word = f"canary-{secrets.token_hex(6)}.md", f"canaryword{secrets.token_hex(6)}"
    sources = broker.sources(tenant)
    sources.mkdir(parents=True, exist_ok=True)
    (sources / name).write_text(f"intro\n{word} is the secret\n")
    return name, word


def assert_no_values(receiver: Receiver, values: list[str]) -> None:
    raw = receiver.raw()
    assert raw  # something was exported, or the check proves nothing
    for value in values:
        assert value.encode() not in raw


def test_one_call_is_one_trace_through_broker_and_sandbox(traced: Broker, receiver: Receiver) -> None:
    name, word = canary_source(traced, "acme")
    trace_id, parent, traceparent = new_trace()
    with open_http(traced, traced.token()) as http:
        http.headers["traceparent"] = traceparent
        http.headers["tracestate"] = f"vendor={word}"  # not taken: free text of the client's
        response = call_modern(http, "read_document", {"filename": name})
    assert tool_status(response)["status"] == "ok"
    assert "io.docbroker/spans" not in response.text  # the records are the broker's, not the client's

    spans = spans_of(receiver, trace_id, 3)
    call = one(spans, "tools/call read_document")
    request, tool = one(spans, "sandbox.request"), one(spans, "sandbox.tool")
    assert call.parent_id == parent and call.kind == SERVER
    assert {s.service for s in spans} == {"docbroker-eu1"}  # OTEL_SERVICE_NAME, read by the SDK
    assert request.parent_id == call.span_id and request.kind == SERVER
    assert tool.parent_id == request.span_id and tool.kind == INTERNAL
    assert call.start_ns <= request.start_ns <= tool.start_ns <= tool.end_ns <= request.end_ns <= call.end_ns
    assert call.attributes == {
        "docbroker.request_id": call.attributes["docbroker.request_id"],
        "mcp.method.name": "tools/call",
        "docbroker.tool": "read_document",
        "docbroker.tenant": "acme",
        "docbroker.outcome": "ok",
        "docbroker.reason": "tool_ok",
        "http.response.status_code": 200,
        "docbroker.sandbox_spans_dropped": 0,
    }
    request_id = call.attributes["docbroker.request_id"]
    audited = [e for e in traced.audit_events() if e.get("request_id") == request_id]
    assert [e["event"] for e in audited] == ["mcp.request"]  # the span and the audit line are one request
    assert request.attributes == {} and tool.attributes == {}
    assert call.trace_state == ""
    assert_no_values(receiver, [name, word, name.removesuffix(".md")])


def test_trace_context_from_the_modern_meta_field(traced: Broker, receiver: Receiver) -> None:
    trace_id, parent, traceparent = new_trace()
    query = f"canaryquery{secrets.token_hex(6)}"
    body = {
        "jsonrpc": "2.0",
        "id": 7,
        "method": "tools/call",
        "params": {
            "name": "search_documents",
            "arguments": {"query": query},
            "_meta": {
                "io.modelcontextprotocol/protocolVersion": MODERN,
                "io.modelcontextprotocol/clientCapabilities": {},
                "traceparent": traceparent,
                "io.example/secret": f"{query}-meta",  # other _meta fields are never read
            },
        },
    }
    with open_http(traced, traced.token()) as http:
        response = http.post("/mcp", json=body, headers=modern_headers("tools/call", "search_documents"))
    assert "result" in rpc_reply(response)
    spans = spans_of(receiver, trace_id, 3)
    call = one(spans, "tools/call search_documents")
    assert call.parent_id == parent
    assert one(spans, "sandbox.request").parent_id == call.span_id
    assert_no_values(receiver, [query])  # the meta canary starts with it


def test_a_refused_call_is_traced_by_name_without_its_reason_text(traced: Broker, receiver: Receiver) -> None:
    trace_id, parent, traceparent = new_trace()
    secret = f"canarytoken{secrets.token_hex(6)}"
    with open_http(traced, secret) as http:
        http.headers["traceparent"] = traceparent
        response = call_modern(http, "read_document", {"filename": f"{secret}.md"})
    assert response.status_code == 401
    (span,) = spans_of(receiver, trace_id, 1)
    assert span.parent_id == parent
    assert span.attributes["docbroker.outcome"] == "denied"
    assert span.attributes["http.response.status_code"] == 401
    assert "docbroker.tenant" not in span.attributes
    assert_no_values(receiver, [secret])


def test_a_malformed_traceparent_starts_a_new_trace(traced: Broker, receiver: Receiver) -> None:
    name, _ = canary_source(traced, "globex")
    bad = f"00-{'0' * 32}-{secrets.token_hex(8)}-01"  # an all-zero trace id is invalid
    with open_http(traced, traced.token(tenant="globex")) as http:
        http.headers["traceparent"] = bad
        response = call_modern(http, "read_document", {"filename": name})
    request_id = next(
        e["request_id"]
        for e in reversed(traced.audit_events())
        if e.get("tenant") == "globex" and e.get("event") == "mcp.request"
    )
    assert tool_status(response)["status"] == "ok"

    def found() -> list[ReceivedSpan]:
        with receiver.lock:
            return [s for s in receiver.spans if s.attributes.get("docbroker.request_id") == request_id]

    assert wait_for(lambda: bool(found()), timeout=15)
    (span,) = found()
    assert span.parent_id == "" and span.trace_id != "0" * 32
    assert len(receiver.in_trace(span.trace_id)) >= 1


def test_names_the_client_chose_are_exported_as_other(traced: Broker, receiver: Receiver) -> None:
    """A tool or argument name no contract declares is the client's free text (a value)."""
    trace_id, parent, traceparent = new_trace()
    tool, key, value = (f"canary{what}{secrets.token_hex(6)}" for what in ("tool", "key", "value"))
    with open_http(traced, traced.token()) as http:
        http.headers["traceparent"] = traceparent
        unknown_tool = call_modern(http, tool, {"query": value})
        http.headers["traceparent"] = f"00-{trace_id}-{secrets.token_hex(8)}-01"
        unknown_key = call_modern(http, "search_documents", {"query": "a", key: value})
    assert "result" in rpc_reply(unknown_key) and unknown_tool.status_code in (200, 400, 403)
    spans = spans_of(receiver, trace_id, 2)
    assert {s.name for s in spans if s.parent_id != "" and s.kind == SERVER} >= {
        "tools/call search_documents"
    }
    named = [s for s in spans if s.attributes.get("docbroker.tool") == "other"]
    assert len(named) == 1 and named[0].parent_id == parent and named[0].name == "tools/call"
    assert_no_values(receiver, [tool, key, value])


def test_calls_of_one_legacy_session_are_each_their_own_trace(traced: Broker, receiver: Receiver) -> None:
    """In the 2025-11-25 handshake era the server runs a session's calls in the session's
    task, started by its `initialize`: each call's records must still be that call's."""
    name, word = canary_source(traced, "acme")
    traces = [new_trace() for _ in range(3)]
    with open_http(traced, traced.token()) as http:
        http.headers["traceparent"] = traces[0][2]
        session = LegacySession(http)
        for _, _, traceparent in traces[1:]:
            http.headers["traceparent"] = traceparent
            assert tool_status(session.call("read_document", {"filename": name}))["status"] == "ok"
    for trace_id, _, _ in traces[1:]:
        spans = spans_of(receiver, trace_id, 3)
        call = one(spans, "tools/call read_document")
        assert call.attributes["docbroker.sandbox_spans_dropped"] == 0
        request = one(spans, "sandbox.request")
        assert request.parent_id == call.span_id
        assert one(spans, "sandbox.tool").parent_id == request.span_id
    assert_no_values(receiver, [name, word])


def test_off_by_default_even_with_an_otlp_endpoint_set(
    tmp_path_factory: pytest.TempPathFactory, receiver: Receiver
) -> None:
    env = {k: v for k, v in tracing_env(receiver).items() if k != "DOCBROKER_TRACING"}
    broker = make_broker(tmp_path_factory.mktemp("untraced"), env=env)
    name, _ = canary_source(broker, "acme")
    trace_id, _, traceparent = new_trace()
    broker.start()
    try:
        with open_http(broker, broker.token()) as http:
            http.headers["traceparent"] = traceparent
            assert tool_status(call_modern(http, "read_document", {"filename": name}))["status"] == "ok"
    finally:
        broker.stop()  # a provider would export what it holds at shutdown: after this, nothing can come
    assert receiver.in_trace(trace_id) == []


def test_spans_still_queued_are_exported_at_shutdown(
    tmp_path_factory: pytest.TempPathFactory, receiver: Receiver
) -> None:
    env = {**tracing_env(receiver), "OTEL_BSP_SCHEDULE_DELAY": "600000"}  # no export before the stop
    broker = make_broker(tmp_path_factory.mktemp("queued"), env=env)
    name, _ = canary_source(broker, "acme")
    trace_id, parent, traceparent = new_trace()
    broker.start()
    try:
        with open_http(broker, broker.token()) as http:
            http.headers["traceparent"] = traceparent
            assert tool_status(call_modern(http, "read_document", {"filename": name}))["status"] == "ok"
        assert receiver.in_trace(trace_id) == []  # held in the queue for ten minutes
    finally:
        broker.stop()
    spans = receiver.in_trace(trace_id)
    assert one(spans, "tools/call read_document").parent_id == parent
    assert len(spans) == 3 and {s.service for s in spans} == {"docbroker"}  # unless OTEL_SERVICE_NAME
