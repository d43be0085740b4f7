"""What only a sandbox's replacement ends: a broken contract, and a sandbox that never starts.

A broker of its own: sandboxes are reaped after one idle second (so a changed sandbox is
replaced without an operator), a start gives up after a few seconds, and one failure opens
a tenant's circuit breaker.
"""

from __future__ import annotations

import time

from harness import Broker
from hostile_helpers import Rpc, contract_breaks, events, last_request, wait_for

TENANTS = ("changing", "nostart")
PREWARM = ()  # sandboxes are reaped after one idle second anyway
START_TIMEOUT = 3
BROKER_ENV = {
    "DOCBROKER_IDLE_TIMEOUT": "1",
    "DOCBROKER_START_TIMEOUT": str(START_TIMEOUT),
    "DOCBROKER_BREAKER_THRESHOLD": "1",
    "DOCBROKER_BREAKER_COOLDOWN": "30",
}


def test_a_replaced_sandbox_is_pinned_afresh(hostile: Broker) -> None:
    contract_breaks(hostile, "changing")
    broken = last_request(hostile, "changing")["sandbox"]
    wait_for(lambda: events(hostile, "sandbox.stopped", tenant="changing", sandbox=broken, reason="idle"))
    # a new instance (of the same, changed program) is listed and pinned as it now is: its
    # read_document is not the contract's any more, its search still is
    rpc = Rpc(hostile, "changing")
    search = rpc.search("docbroker")
    assert search.structured["status"] == "ok", search
    assert last_request(hostile, "changing")["sandbox"] != broken
    assert rpc.tool_names() == ["save_report", "search_documents"]
    assert rpc.read("notes.md").error_code == -32602


def test_a_sandbox_that_never_starts_opens_the_breaker(hostile: Broker) -> None:
    rpc = Rpc(hostile, "nostart")
    began = time.monotonic()
    first = rpc.read("notes.md")
    assert time.monotonic() - began < START_TIMEOUT + 5
    assert (first.status, first.error_code) == (503, -32001), first
    assert int(first.headers["retry-after"]) >= 1
    assert last_request(hostile, "nostart")["reason"] == "sandbox_start_failed"
    assert events(hostile, "sandbox.failed", tenant="nostart")
    # open: refused at once, with the time left to wait
    began = time.monotonic()
    second = rpc.read("notes.md")
    assert time.monotonic() - began < 1.5
    assert (second.status, second.error_code) == (503, -32001), second
    assert 1 <= int(second.headers["retry-after"]) <= 30
    assert last_request(hostile, "nostart")["reason"] == "circuit_open"
