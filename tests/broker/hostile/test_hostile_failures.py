"""Failure handling, from the attacker's side: sandboxes that hang, stall, drip and crash.

Per-call timeouts (DOCBROKER_CALL_TIMEOUT) end every call with a clean answer, never a hang;
reads are retried once on a transport failure, writes never (a write that may have happened
is result_unknown); a circuit breaker per tenant answers fast 503s with Retry-After while a
sandbox keeps failing, then lets one trial call through.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import anyio
import pytest
from mcp.shared.exceptions import MCPError

from broker.testing import Broker
from tests.broker.hostile.hostile_helpers import (
    BREAKER_COOLDOWN,
    CALL_TIMEOUT,
    Reply,
    Rpc,
    events,
    last_request,
    tool_calls,
    unique,
)

TENANTS = ("honest", "slow", "crashy", "crashonce")
# A timed-out call must end within the call timeout plus what a loaded host adds, and long
# before the hostile server's 30-second sleeps would.
BOUND = CALL_TIMEOUT + 4
UNKNOWN = "result_unknown"


def timed(fn: Callable[..., Reply], *args: str) -> tuple[Reply, float]:
    began = time.monotonic()
    reply = fn(*args)
    return reply, time.monotonic() - began


def timed_out(reply: Reply, elapsed: float) -> None:
    assert elapsed < BOUND, elapsed
    assert (reply.status, reply.error_code) == (200, -32603), reply
    assert reply.answer is not None and reply.answer["error"]["message"] == "Tool call timed out"


@pytest.mark.parametrize("filename", ["slow.md", "stall.md", "drip.md"])
def test_a_read_past_the_call_timeout_is_a_clean_error(hostile: Broker, filename: str) -> None:
    # slow: sleeps before answering; stall: starts an SSE stream, then sleeps; drip: starts an
    # SSE stream and sends a keep-alive comment every 0.2 s forever (no read ever times out)
    rpc = Rpc(hostile, "slow")
    reply, elapsed = timed(rpc.read, filename)
    timed_out(reply, elapsed)
    event = last_request(hostile, "slow", tool="read_document")
    assert (event["outcome"], event["reason"]) == ("error", "upstream_timeout")
    assert event["duration_ms"] < BOUND * 1000
    # the sandbox's other answers still pass (and this success closes the breaker's count)
    assert rpc.read("notes.md").structured["status"] == "ok"


@pytest.mark.anyio
async def test_a_real_client_gets_the_timeout_not_a_hang(hostile: Broker) -> None:
    async with hostile.client(hostile.token(tenant="slow")) as client:
        with anyio.fail_after(BOUND):
            with pytest.raises(MCPError) as caught:
                await client.call_tool("read_document", {"filename": "drip.md"})
        assert caught.value.code == -32603
        ok = await client.call_tool("read_document", {"filename": "notes.md"})
        assert ok.structured_content is not None and ok.structured_content["status"] == "ok"


def test_a_save_past_the_call_timeout_is_unknown_and_not_retried(hostile: Broker) -> None:
    rpc = Rpc(hostile, "slow")
    name = unique()
    before = len(tool_calls(hostile, "slow", "save_report"))
    reply, elapsed = timed(rpc.save_approved, name, "# Slow\n")
    assert elapsed < BOUND + 2, elapsed  # + the approval round trip
    assert reply.structured["status"] == UNKNOWN, reply
    event = last_request(hostile, "slow", tool="save_report")
    assert (event["outcome"], event["reason"]) == (UNKNOWN, "upstream_timeout")
    assert len(tool_calls(hostile, "slow", "save_report")) == before + 1
    assert not (hostile.reports("slow") / name).exists()
    assert rpc.read("notes.md").structured["status"] == "ok"


def test_a_read_is_retried_once_on_a_transport_failure(hostile: Broker) -> None:
    rpc = Rpc(hostile, "crashonce")
    crashes = len(events(hostile, "sandbox.failed", tenant="crashonce"))
    before = len(tool_calls(hostile, "crashonce", "read_document"))
    reply = rpc.read("crash.md")  # the first server dies reading it; its replacement answers
    assert reply.structured["data"] == {"filename": "crash.md", "content": "survived\n"}, reply
    attempts = tool_calls(hostile, "crashonce", "read_document")[before:]
    assert len(attempts) == 2 and attempts[0]["pid"] != attempts[1]["pid"]
    assert last_request(hostile, "crashonce", tool="read_document")["outcome"] == "ok"
    assert len(events(hostile, "sandbox.failed", tenant="crashonce", reason="crashed")) == crashes + 1


def test_a_write_is_never_retried(hostile: Broker) -> None:
    rpc = Rpc(hostile, "crashonce")
    name = unique()
    before = len(tool_calls(hostile, "crashonce", "save_report"))
    reply = rpc.save_approved(name, "# Crash\n")  # the server dies on every save
    assert reply.structured["status"] == UNKNOWN, reply
    event = last_request(hostile, "crashonce", tool="save_report")
    assert (event["outcome"], event["reason"]) == (UNKNOWN, "upstream_failed")
    assert len(tool_calls(hostile, "crashonce", "save_report")) == before + 1
    assert not (hostile.reports("crashonce") / name).exists()
    assert rpc.read("notes.md").structured["status"] == "ok"  # a new sandbox serves the tenant


def test_the_breaker_opens_fails_fast_and_closes_after_one_trial(hostile: Broker) -> None:
    rpc = Rpc(hostile, "crashy")
    failed = rpc.read("crash.md")  # two crashes (the read and its one retry): threshold reached
    assert (failed.status, failed.error_code) == (200, -32603), failed
    assert last_request(hostile, "crashy")["reason"] == "upstream_failed"
    calls = len(tool_calls(hostile, "crashy"))

    fast, elapsed = timed(rpc.read, "notes.md")
    assert elapsed < 1.5
    assert (fast.status, fast.error_code) == (503, -32001), fast
    wait = int(fast.headers["retry-after"])
    assert 1 <= wait <= BREAKER_COOLDOWN
    assert last_request(hostile, "crashy")["reason"] == "circuit_open"
    assert len(tool_calls(hostile, "crashy")) == calls  # the sandbox was not bothered
    assert Rpc(hostile, "honest").read("notes.md").structured["status"] == "ok"  # per tenant

    time.sleep(wait + 0.2)
    trial: list[Reply] = []
    thread = threading.Thread(target=lambda: trial.append(rpc.read("pause.md")))  # in flight 0.8 s+
    thread.start()
    wait_for_trial = time.monotonic() + 10
    while not any(c["arguments"] == {"filename": "pause.md"} for c in tool_calls(hostile, "crashy")):
        assert time.monotonic() < wait_for_trial, "the trial call never reached the sandbox"
        time.sleep(0.02)
    during = rpc.read("notes.md")  # one trial at a time
    assert (during.status, during.error_code) == (503, -32001), during
    assert 1 <= int(during.headers["retry-after"]) <= BREAKER_COOLDOWN
    thread.join()
    assert trial[0].structured["data"]["content"] == "took a while\n", trial
    assert rpc.read("notes.md").structured["status"] == "ok"  # closed again
