"""Stopping the broker: Ctrl-C (SIGINT) and SIGTERM shut it down cleanly.

A real broker process is stopped by each signal after serving a call: it must exit 0 with no
traceback, stop its sandbox, and leave an audit log that verifies.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import signal
import subprocess
import sys
import threading
from pathlib import Path

import httpx2
import pytest

from broker.audit.verify import verify_file
from broker.testing import make_broker
from tests.broker.support import call_modern, gone, server_pids, wait_for


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_signal_stops_the_broker_cleanly(tmp_path: Path, sig: signal.Signals) -> None:
    broker = make_broker(tmp_path, tenants=("acme",))
    broker.start()
    assert broker.proc is not None
    try:
        with broker.http(broker.token()) as http:
            assert call_modern(http, "read_document", {"filename": "any.md"}).status_code == 200
        sandboxes = server_pids(broker, "acme")
        assert sandboxes, "the call should have started a sandbox"
        broker.proc.send_signal(sig)
        assert broker.proc.wait(timeout=30) == 0
    finally:
        if broker.proc is not None and broker.proc.poll() is None:
            broker.proc.kill()
            broker.proc.wait()
    logs = broker.logs()
    assert "Traceback" not in logs and "KeyboardInterrupt" not in logs and "CancelledError" not in logs
    # The lifespan shutdown stopped the tenant's sandbox.
    assert wait_for(lambda: all(gone(pid) for pid in sandboxes))
    report = verify_file(broker.audit_file)
    assert report.ok and report.lines >= 1


def test_calls_still_waiting_when_the_shutdown_runs_out_are_answered_and_audited(tmp_path: Path) -> None:
    """Issue 25 (found by the lab reliability run: broker Pods stopped while calls waited on
    tenant Pods that started slowly). uvicorn waits 10 s for running requests, then cancels
    them: a call waiting behind the tenant's sandbox start got uvicorn's 500 and a traceback,
    and no audit event at all. Each is now refused "retry later" (503) with its one terminal
    event."""
    # A sandbox that never comes up: the first call waits on its start (START_TIMEOUT) past the
    # shutdown's 10 s, the second behind it; two in flight are the tenant's limit here.
    sleeper = shlex.join([sys.executable, "-c", "import time; time.sleep(120)"])
    broker = make_broker(
        tmp_path,
        tenants=("acme",),
        env={"DOCBROKER_LOCAL_SERVER_COMMAND": sleeper, "DOCBROKER_START_TIMEOUT": "60"},
        limits="[limits]\nrate_per_minute = 100000\nburst = 10000\nmax_concurrent = 2\n",
    )
    broker.start()
    assert broker.proc is not None
    sandbox = f"time.sleep.120. --socket {broker.data_dir}/run/acme/mcp.sock"
    answers: list[httpx2.Response | BaseException] = []
    auth = {"authorization": f"Bearer {broker.token()}"}
    try:
        with httpx2.Client(base_url=broker.url, headers=auth, timeout=90) as http:

            def call() -> None:
                try:
                    answers.append(call_modern(http, "read_document", {"filename": "any.md"}))
                except BaseException as exc:  # recorded: the assertion below names it
                    answers.append(exc)

            callers = [threading.Thread(target=call) for _ in range(2)]
            callers[0].start()
            assert wait_for(lambda: bool(_pids(sandbox)), timeout=30)  # its start is under way
            callers[1].start()
            # both are in: the tenant's two slots are taken (a refused tool needs no sandbox)
            assert wait_for(lambda: call_modern(http, "no_such_tool", {}).status_code == 429, timeout=30)
            broker.proc.send_signal(signal.SIGTERM)
            for caller in callers:
                caller.join(timeout=60)
            assert broker.proc.wait(timeout=60) == 0
    finally:
        for pid in _pids(sandbox):
            os.kill(pid, signal.SIGKILL)
        if broker.proc is not None and broker.proc.poll() is None:
            broker.proc.kill()
            broker.proc.wait()
    assert len(answers) == 2 and all(isinstance(a, httpx2.Response) for a in answers), answers
    assert sorted(a.status_code for a in answers if isinstance(a, httpx2.Response)) == [503, 503]
    logs = broker.logs()
    assert "Traceback" not in logs and "Exception in ASGI application" not in logs
    calls = [e for e in broker.audit_events() if e.get("tool") == "read_document"]
    assert len(calls) == 2 and {(e["event"], e["outcome"], e["status"]) for e in calls} == {
        ("mcp.request", "error", 503)
    }
    assert "shutting_down" in {e["reason"] for e in calls}


def _pids(pattern: str) -> list[int]:
    out = subprocess.run(["pgrep", "-f", pattern], capture_output=True, text=True, check=False).stdout
    return [int(p) for p in out.split()]


def test_the_sandboxes_are_stopped_at_once_not_one_after_another(tmp_path: Path) -> None:
    """Issue 25: the shutdown stopped sandboxes one after another, each up to its grace period
    (3 s here; a Docker or Kubernetes stop can take longer), so a service manager's stop timeout
    SIGKILLed the broker with the rest still running. Each sandbox here ignores SIGTERM: every
    one must have been asked to stop while the first is still alive (its grace not yet over)."""
    marks = tmp_path / "marks"
    marks.mkdir()
    # The server in the background of a shell that notes SIGTERM and outlives it (its group's
    # SIGKILL, after the grace period, ends it).
    wrapper = (
        f'echo > {marks}/start-$$; trap "echo > {marks}/term-$$" TERM; "$0" -m server "$@" & '
        "while :; do wait; sleep 0.05; done"
    )
    tenants = ("acme", "globex", "initech")
    broker = make_broker(
        tmp_path,
        tenants=tenants,
        env={"DOCBROKER_LOCAL_SERVER_COMMAND": shlex.join(["/bin/sh", "-c", wrapper, sys.executable])},
    )
    broker.start()
    assert broker.proc is not None
    shells: list[int] = []
    try:
        for tenant in tenants:
            with broker.http(broker.token(tenant)) as http:
                assert call_modern(http, "read_document", {"filename": "any.md"}).status_code == 200
        shells = [int(p.name.split("-")[1]) for p in marks.glob("start-*")]
        assert len(shells) == 3
        broker.proc.send_signal(signal.SIGTERM)
        assert wait_for(lambda: len(list(marks.glob("term-*"))) == 3, timeout=30)
        # all three asked, and none killed yet: the stops run side by side
        assert [pid for pid in shells if gone(pid)] == []
        assert broker.proc.wait(timeout=30) == 0
    finally:
        for pid in shells:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)
        if broker.proc is not None and broker.proc.poll() is None:
            broker.proc.kill()
            broker.proc.wait()
    assert wait_for(lambda: all(gone(pid) for pid in shells))
