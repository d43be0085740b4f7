"""The sandbox's server sleeps while idle, and still stops at once when told (server/quiet.py).

uvicorn's own loop wakes ten times a second; hundreds of idle sandboxes on one host paid for it
in CPU (bench/scale.py). The real `python -m server` is counted from outside: its main thread's
voluntary context switches (each a wake-up from a wait) over an idle window.
"""

from __future__ import annotations

import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from tests.server.test_bearer import free_port, start, stop, wait_serving

WINDOW_S = 3.0


def wakeups(pid: int) -> int:
    status = Path(f"/proc/{pid}/task/{pid}/status").read_text()
    return int(
        next(line for line in status.splitlines() if line.startswith("voluntary_ctxt_switches")).split()[1]
    )


@pytest.fixture
def idle_server(kit: Any, tmp_path: Path) -> Any:
    port = free_port()
    proc, log = start(kit, tmp_path, ["--http", f"127.0.0.1:{port}"])
    try:
        wait_serving(proc, port, log)
        yield proc
    finally:
        stop(proc)


def test_an_idle_server_wakes_about_once_a_second_not_ten_times(idle_server: subprocess.Popen[bytes]) -> None:
    before, began = wakeups(idle_server.pid), time.monotonic()
    time.sleep(WINDOW_S)  # the window measured, not a synchronisation
    woke, took = wakeups(idle_server.pid) - before, time.monotonic() - began
    # uvicorn's loop: ~10 a second (30 here); ours: one a second, and a few of anything else.
    assert woke <= 2 * took + 2, f"{woke} wake-ups in {took:.1f} s"


def test_a_stop_signal_still_stops_it(idle_server: subprocess.Popen[bytes]) -> None:
    """SIGTERM ends the sleeping server (uvicorn re-raises the signal once it has shut down)."""
    idle_server.send_signal(signal.SIGTERM)
    assert idle_server.wait(timeout=10) in (0, -signal.SIGTERM)
