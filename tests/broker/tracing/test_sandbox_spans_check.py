"""The checks on a sandbox's span records, fed what a hostile sandbox could put in its answer:
never an exception (it would fail the call), every bad record dropped and counted."""

from __future__ import annotations

from typing import Any

import pytest

from broker.tracing import MAX_SANDBOX_SPANS, SandboxSpans
from server.spans import SPANS_META

TRACE, BROKER_SPAN = "ab" * 16, "cd" * 8
TRACEPARENT = f"00-{TRACE}-{BROKER_SPAN}-01"
WINDOW = 1_000_000


def answer(records: Any, trace_id: Any = TRACE) -> dict[str, Any]:
    return {
        "jsonrpc": "2.0",
        "id": 1,
        "result": {"_meta": {SPANS_META: {"trace_id": trace_id, "spans": records}}},
    }


def record(**changes: Any) -> dict[str, Any]:
    base = {"name": "sandbox.request", "span_id": "ef" * 8, "parent_id": BROKER_SPAN,
            "start_ns": 0, "end_ns": 10, "status": "ok"}  # fmt: skip
    return {**base, **changes}


@pytest.mark.parametrize(
    "odd",
    [
        {"jsonrpc": "2.0", "id": 1, "result": "text"},
        {"jsonrpc": "2.0", "id": 1, "result": {"_meta": ["x"]}},
        {"jsonrpc": "2.0", "id": 1, "result": {"_meta": {SPANS_META: None}}},
        [1, 2],
        None,
    ],
)
def test_no_records_where_the_answer_has_none(odd: Any) -> None:
    checked = SandboxSpans.check(odd, TRACEPARENT, WINDOW)
    assert checked.spans == [] and checked.dropped == 0


@pytest.mark.parametrize(
    "bad",
    [
        record(name=["sandbox.request"]),  # unhashable values: no exception
        record(parent_id={"a": 1}),
        record(span_id=["ef" * 8]),
        record(status={"ok": 1}),
        record(name="sandbox.other"),
        record(span_id="EF" * 8),
        record(span_id=BROKER_SPAN),  # the broker's own id
        record(parent_id="12" * 8),
        record(start_ns=-1),
        record(start_ns=11),
        record(end_ns=WINDOW + 1),
        record(end_ns=True),
        record(end_ns=10.0),
        record(status="fine"),
        {**record(), "attributes": {"k": "v"}},
        "sandbox.request",
        None,
    ],
)
def test_a_bad_record_is_dropped_and_counted(bad: Any) -> None:
    checked = SandboxSpans.check(answer([bad]), TRACEPARENT, WINDOW)
    assert checked.spans == [] and checked.dropped == 1


def test_an_honest_pair_is_kept_and_a_child_of_a_dropped_record_is_not() -> None:
    child = record(name="sandbox.tool", span_id="12" * 8, parent_id="ef" * 8)
    checked = SandboxSpans.check(answer([record(), child]), TRACEPARENT, WINDOW)
    assert [s.span_id for s in checked.spans] == ["ef" * 8, "12" * 8] and checked.dropped == 0
    checked = SandboxSpans.check(answer([record(status="x"), child]), TRACEPARENT, WINDOW)
    assert checked.spans == [] and checked.dropped == 2


def test_past_the_limit_and_of_another_trace() -> None:
    many = [record(span_id=f"{i:016x}") for i in range(1, 100)]
    checked = SandboxSpans.check(answer(many), TRACEPARENT, WINDOW)
    assert len(checked.spans) == MAX_SANDBOX_SPANS and checked.dropped == 99 - MAX_SANDBOX_SPANS
    assert SandboxSpans.check(answer([record()], trace_id="00" * 16), TRACEPARENT, WINDOW).dropped == 1
    assert SandboxSpans.check(answer([record()], trace_id=["x"]), TRACEPARENT, WINDOW).dropped == 1
    assert SandboxSpans.check(answer("spans"), TRACEPARENT, WINDOW).dropped == 1
