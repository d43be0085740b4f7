"""From the attacker's side: a sandbox that forges its span records (forging_server.py). What
fails a check is dropped and counted on the broker's span; nothing it wrote in free text is
exported, and none of it reaches the client."""

from __future__ import annotations

import secrets
import shlex
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from broker.testing import Broker, make_broker
from tests.broker.support import call_modern, open_http, tool_status
from tests.broker.tracing.forging_server import CANARY
from tests.broker.tracing.otlp_receiver import Receiver, otlp_receiver
from tests.broker.tracing.test_trace_through_sandbox import one, spans_of, tracing_env

FORGING_SERVER = Path(__file__).with_name("forging_server.py")


@pytest.fixture(scope="module")
def receiver() -> Iterator[Receiver]:
    with otlp_receiver() as r:
        yield r


@pytest.fixture(scope="module")
def forged(tmp_path_factory: pytest.TempPathFactory, receiver: Receiver) -> Iterator[Broker]:
    env = {
        **tracing_env(receiver),
        "DOCBROKER_LOCAL_SERVER_COMMAND": shlex.join([sys.executable, str(FORGING_SERVER)]),
    }
    broker = make_broker(tmp_path_factory.mktemp("forged"), env=env)
    sources = broker.sources("acme")
    sources.mkdir(parents=True)
    (sources / "notes.md").write_text("hello\n")
    broker.start()
    try:
        yield broker
    finally:
        broker.stop()


def traced_call(broker: Broker, lie: str) -> tuple[str, str]:
    trace_id, parent = lie + secrets.token_hex(16)[1:], secrets.token_hex(8)
    with open_http(broker, broker.token()) as http:
        http.headers["traceparent"] = f"00-{trace_id}-{parent}-01"
        response = call_modern(http, "read_document", {"filename": "notes.md"})
    assert tool_status(response)["status"] == "ok"  # the tool's answer stands; only its spans lied
    assert "io.docbroker/spans" not in response.text and CANARY not in response.text
    return trace_id, parent


def test_forged_records_are_dropped_and_counted_and_the_honest_ones_kept(
    forged: Broker, receiver: Receiver
) -> None:
    trace_id, parent = traced_call(forged, "a")
    spans = spans_of(receiver, trace_id, 3)
    call = one(spans, "tools/call read_document")
    assert call.parent_id == parent
    # 8 read: 2 honest, 6 forged (foreign parent, own name, free text, outside the window,
    # a reused id, an unknown status); 30 more past the limit
    assert call.attributes["docbroker.sandbox_spans_dropped"] == 6 + 30
    request, tool = one(spans, "sandbox.request"), one(spans, "sandbox.tool")
    assert request.parent_id == call.span_id and tool.parent_id == request.span_id
    assert len(spans) == 3
    assert call.start_ns <= request.start_ns <= request.end_ns <= call.end_ns
    assert CANARY.encode() not in receiver.raw()
    with open_http(forged) as http:
        page = http.get("/metrics", headers=forged.ops_headers).text
    counted = [
        line for line in page.splitlines() if line.startswith("docbroker_sandbox_span_records_dropped_total ")
    ]
    assert len(counted) == 1 and float(counted[0].split()[1]) >= 36


def test_records_of_another_trace_are_all_dropped(forged: Broker, receiver: Receiver) -> None:
    trace_id, _ = traced_call(forged, "b")
    (call,) = spans_of(receiver, trace_id, 1)
    assert call.attributes["docbroker.sandbox_spans_dropped"] == 2


def test_records_that_are_no_list_count_as_one_dropped(forged: Broker, receiver: Receiver) -> None:
    trace_id, _ = traced_call(forged, "c")
    (call,) = spans_of(receiver, trace_id, 1)
    assert call.attributes["docbroker.sandbox_spans_dropped"] == 1
    assert CANARY.encode() not in receiver.raw()


def test_records_of_objects_and_lists_fail_nothing_but_themselves(forged: Broker, receiver: Receiver) -> None:
    trace_id, _ = traced_call(forged, "d")  # the call's answer stands (asserted there)
    (call,) = spans_of(receiver, trace_id, 1)
    assert call.attributes["docbroker.sandbox_spans_dropped"] == 2
    assert CANARY.encode() not in receiver.raw()
