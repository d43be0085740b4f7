"""The circuit breaker's trial (`broker/gateway/breaker.py`) from the failure's side: a trial
that ends without an outcome must not lock the tenant out (issue 24 item 1).

A real broker in front of the real server (local runtime): the server is stopped (SIGSTOP)
so that a call times out and opens the one-failure breaker while the server, its legacy
session included, lives on; after the cool-down the trial is a GET stream of that session
whose client leaves. That call has no outcome. The call after it must be served.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

from broker.gateway.breaker import BreakerState, CircuitBreakers
from broker.testing import Broker, running_broker
from tests.broker.support import (
    LegacySession,
    events_since,
    last_seq,
    open_http,
    rpc_reply,
    server_pids,
    wait_for,
)

CALL_TIMEOUT = 4.0
READ = {"jsonrpc": "2.0", "id": 9, "method": "tools/call",
        "params": {"name": "read_document", "arguments": {"filename": "notes.md"}}}  # fmt: skip


def read_status(session: LegacySession) -> tuple[int, str | None]:
    """The HTTP status of a read, and the tool's status when it answered."""
    r = session.post(READ)
    reply = rpc_reply(r)
    if "result" not in reply:
        return r.status_code, None
    return r.status_code, reply["result"]["structuredContent"]["status"]


def open_the_breaker(broker: Broker, session: LegacySession) -> None:
    (server,) = server_pids(broker, "acme")
    os.kill(server, signal.SIGSTOP)
    try:
        r = session.post(READ)  # times out: the one failure that opens the breaker
        assert rpc_reply(r)["error"]["message"] == "Tool call timed out", r.text
    finally:
        os.kill(server, signal.SIGCONT)  # alive again, with its sessions
    refused = session.post(READ)
    assert refused.status_code == 503 and "retry-after" in refused.headers, refused.text


def test_a_trial_whose_client_leaves_does_not_lock_the_tenant_out(tmp_path: Path) -> None:
    env = {
        "DOCBROKER_CALL_TIMEOUT": str(CALL_TIMEOUT),
        "DOCBROKER_BREAKER_THRESHOLD": "1",
        "DOCBROKER_BREAKER_COOLDOWN": "2",  # time enough to see it open
    }
    with running_broker(tmp_path, env=env) as broker:
        broker.sources("acme").mkdir(parents=True, exist_ok=True)
        (broker.sources("acme") / "notes.md").write_text("hello\n")
        with open_http(broker, broker.token()) as http:
            session = LegacySession(http)
            assert read_status(session) == (200, "ok")
            open_the_breaker(broker, session)

            # After the cool-down the first call through is the trial: a GET stream.
            deadline = time.monotonic() + 10
            while True:
                seq = last_seq(broker)
                trial_began = time.monotonic()
                with http.stream("GET", "/mcp", headers=session.headers()) as stream:
                    if stream.status_code == 200:
                        break  # the trial is running: the client leaves it here
                    assert stream.status_code == 503, stream.status_code
                    assert time.monotonic() < deadline, "the breaker never let a trial through"
                    time.sleep(int(stream.headers["retry-after"]))

            def left() -> bool:
                ended = [e for e in events_since(broker, seq) if e.get("method") == "GET"]
                return any(e["reason"] == "client_disconnected" for e in ended)

            assert wait_for(left), "the broker never saw the trial's client leave"
            # The trial ended without an outcome; the next call is served, at once.
            assert read_status(session) == (200, "ok")
            # (Not the trial's expiry after the call timeout: that had not come yet.)
            assert time.monotonic() - trial_began < CALL_TIMEOUT
            assert read_status(session) == (200, "ok")


def test_a_hundred_malformed_calls_leave_the_breaker_closed(tmp_path: Path) -> None:
    """A client's own malformed requests are its errors (issue 35 item 2): passed on as
    JSON-RPC errors, audited as refused requests, never `upstream_error`, never a failure of
    its sandbox. With a one-failure breaker and a long cool-down, one counted would show."""
    env = {"DOCBROKER_BREAKER_THRESHOLD": "1", "DOCBROKER_BREAKER_COOLDOWN": "600"}
    with running_broker(tmp_path, env=env) as broker:
        broker.sources("acme").mkdir(parents=True, exist_ok=True)
        (broker.sources("acme") / "notes.md").write_text("hello\n")
        with open_http(broker, broker.token()) as http:
            session = LegacySession(http)
            seq = last_seq(broker)
            for i in range(100):
                # The sandbox itself refuses these (the SDK's -32602): arguments not an object.
                bad = {"name": "read_document", "arguments": [i] if i % 2 else "notes.md"}
                r = session.post({"jsonrpc": "2.0", "id": i, "method": "tools/call", "params": bad})
                error = rpc_reply(r)["error"]
                assert error == {"code": -32602, "message": "Invalid request parameters"}, r.text
            ended = [e for e in events_since(broker, seq) if e["event"] == "mcp.request"]
            assert len(ended) == 100
            assert {(e["outcome"], e["reason"]) for e in ended} == {("error", "request_invalid")}
            started = time.monotonic()
            assert read_status(session) == (200, "ok")  # not 503: the breaker is closed
            assert time.monotonic() - started < CALL_TIMEOUT


# -- the breaker alone, on its own clock --------------------------------------------------------


def opened(now: list[float]) -> CircuitBreakers:
    breakers = CircuitBreakers(threshold=1, cooldown=5, trial_timeout=30, clock=lambda: now[0])
    breakers.failure("t")
    now[0] += 5  # the cool-down is over
    return breakers


def test_a_trial_released_without_an_outcome_lets_the_next_call_be_the_trial() -> None:
    now = [0.0]
    breakers = opened(now)
    trial = breakers.admit("t")
    assert (trial.wait, breakers.state("t")) == (0, BreakerState.HALF_OPEN) and trial.trial
    assert breakers.admit("t").wait == 1  # one trial at a time
    breakers.release("t", trial)
    second = breakers.admit("t")
    assert second.wait == 0 and second.trial != trial.trial
    breakers.release("t", trial)  # the first one's release again: not the running trial
    assert breakers.admit("t").wait == 1
    breakers.success("t")
    assert breakers.state("t") is BreakerState.CLOSED
    breakers.release("t", second)  # after its outcome: nothing left to end
    assert breakers.admit("t").wait == 0


def test_a_trial_never_released_expires_after_the_trial_timeout() -> None:
    now = [0.0]
    breakers = opened(now)
    stuck = breakers.admit("t")  # an exit nothing reports: never released
    now[0] += 29.9
    assert breakers.admit("t").wait == 1
    now[0] += 0.1
    after = breakers.admit("t")
    assert after.wait == 0 and after.trial != stuck.trial
    breakers.release("t", stuck)  # the stale trial ending late does not end the new one
    assert breakers.admit("t").wait == 1
    breakers.failure("t")  # the new trial's outcome: open again for the cool-down
    assert breakers.admit("t").wait == 5


def test_a_late_release_does_not_end_a_trial_of_a_later_circuit() -> None:
    now = [0.0]
    breakers = opened(now)
    early = breakers.admit("t")
    breakers.success("t")  # another call's success closed the breaker meanwhile
    breakers.failure("t")  # and a new failure opened it again
    now[0] += 5
    later = breakers.admit("t")
    assert later.wait == 0 and later.trial != early.trial
    breakers.release("t", early)
    assert breakers.admit("t").wait == 1  # still one trial at a time
