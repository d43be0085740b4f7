"""Stopping the broker: Ctrl-C (SIGINT) and SIGTERM shut it down cleanly.

A real broker process is stopped by each signal after serving a call: it must exit 0 with no
traceback, stop its sandbox, and leave an audit log that verifies.
"""

from __future__ import annotations

import signal
from pathlib import Path

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
