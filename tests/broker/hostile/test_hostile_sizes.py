"""Oversized pieces, from the attacker's side: each fails only itself, once, audited.

A megabyte of description excludes that one tool (its siblings stay), a listing page past the
broker's page cap ends the listing there, and a 5 MB answer fails that one call. None of it
is a broken sandbox: nothing is retried, the circuit breaker does not count it (threshold 2
here: three oversized answers in a row would open it), the sandbox is not replaced.
"""

from __future__ import annotations

import pytest

from broker.testing import Broker
from tests.broker.hostile.hostile_helpers import Rpc, events, last_request, rejected, tool_calls, unique

TENANTS = ("hugedesc", "hugepage", "hugeresult")
PREWARM = ()  # started by the first call: fewer sandboxes starting at once with the other modules
INVALID = {"status": "failed", "message": "the tool sandbox returned an invalid result", "data": None}
UNKNOWN = {
    "status": "result_unknown",
    "message": "report write did not complete; it may or may not exist",
    "data": None,
}


def one_sandbox(broker: Broker, tenant: str) -> None:
    """The tenant's sandbox was started once and never stopped, failed or replaced."""
    assert len(events(broker, "sandbox.started", tenant=tenant)) == 1
    assert events(broker, "sandbox.failed", tenant=tenant) == []
    assert events(broker, "sandbox.stopped", tenant=tenant) == []


def test_a_megabyte_description_excludes_only_its_tool_once(hostile: Broker) -> None:
    rpc = Rpc(hostile, "hugedesc")
    for _ in range(3):  # each tools/list lists the sandbox afresh: still one audit event
        assert rpc.tool_names() == ["read_document", "save_report"]
    assert [(e["tool"], e["reason"]) for e in events(hostile, "tools.rejected", tenant="hugedesc")] == [
        ("search_documents", "descriptor_too_large")
    ]
    assert rpc.read("notes.md").structured["status"] == "ok"
    assert rpc.search("docbroker").error_code == -32602
    assert tool_calls(hostile, "hugedesc", "search_documents") == []
    one_sandbox(hostile, "hugedesc")


def test_a_page_past_the_cap_ends_the_listing_not_the_sandbox(hostile: Broker) -> None:
    rpc = Rpc(hostile, "hugepage")
    for _ in range(3):  # more than the breaker's threshold: it would be open by now
        listed = rpc.post("tools/list")
        assert listed.status == 200, listed
        assert listed.result["tools"] == []
    assert rejected(hostile, "hugepage") == {(None, "page_too_large")}
    assert len(events(hostile, "tools.rejected", tenant="hugepage")) == 1
    assert last_request(hostile, "hugepage", method="tools/list")["outcome"] == "ok"
    one_sandbox(hostile, "hugepage")


@pytest.mark.parametrize("filename", ["big.md", "plan.md"])  # as one JSON body; as one SSE event
def test_a_5mb_answer_fails_that_call_once(hostile: Broker, filename: str) -> None:
    rpc = Rpc(hostile, "hugeresult")
    for _ in range(3):
        before = len(tool_calls(hostile, "hugeresult", "read_document"))
        reply = rpc.read(filename)
        assert (reply.status, reply.structured) == (200, INVALID), reply
        assert len(reply.raw) < 2000
        assert len(tool_calls(hostile, "hugeresult", "read_document")) == before + 1  # not retried
        event = last_request(hostile, "hugeresult", tool="read_document")
        assert (event["outcome"], event["reason"]) == ("failed", "result_too_large")
    assert rpc.read("notes.md").structured["status"] == "ok"  # no breaker opened
    one_sandbox(hostile, "hugeresult")


def test_a_5mb_answer_to_a_save_is_unknown_and_not_retried(hostile: Broker) -> None:
    rpc = Rpc(hostile, "hugeresult")
    reply = rpc.save_approved(unique(), "# Report\n")
    assert (reply.status, reply.structured) == (200, UNKNOWN), reply
    assert len(tool_calls(hostile, "hugeresult", "save_report")) == 1
    event = last_request(hostile, "hugeresult", tool="save_report")
    assert (event["outcome"], event["reason"]) == ("result_unknown", "result_too_large")
    assert rpc.read("notes.md").structured["status"] == "ok"
    one_sandbox(hostile, "hugeresult")
