"""Resource limits: enforced where the daemon has cgroups, and reported where it has not.

A rootless daemon on cgroup v1 accepts memory/CPU/pids limits and silently ignores them.
The backend must say so in describe() (DESIGN §7: report it, don't hide it).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from tests.docker.conftest import LiveSandbox

pytestmark = pytest.mark.docker

THREAD_BOMB = r"""
import json, threading, time
count, error = 0, None
stop = threading.Event()
try:
    while count < 10_000:
        threading.Thread(target=stop.wait, daemon=True).start()
        count += 1
except RuntimeError as exc:
    error = type(exc).__name__
print(json.dumps({"threads": count, "error": error}))
stop.set()
"""

MEMORY_HOG = r"""
chunks = []
for _ in range(64):
    chunks.append(bytearray(16 * 1024 * 1024))  # touched: bytearray zero-fills
print("survived", flush=True)
"""


def test_limits_enforced_or_reported(live: LiveSandbox) -> None:
    described = live.backend.describe()
    facts = live.backend.facts
    if not facts.limits_enforced:
        # The only setup allowed to lack them: a rootless daemon without cgroups.
        assert described["mode"] == "rootless"
        assert described["cgroup_driver"] == "none"
        assert described["limits_enforced"] == {"memory": False, "cpu": False, "pids": False}
        return

    assert described["limits_enforced"] == {"memory": True, "cpu": True, "pids": True}
    settings = live.daemon.settings()
    bomb = live.probe(THREAD_BOMB)
    assert bomb["error"] == "RuntimeError"  # "can't start new thread": the pids cgroup said no
    assert bomb["threads"] < settings.pids_limit

    exit_code, output = live.run_python(MEMORY_HOG)  # 1 GiB against a 128 MiB limit
    assert "survived" not in output
    assert exit_code in (137, 1), (exit_code, output)  # OOM-killed, or MemoryError
    # The server itself survives a hog next to it and still answers.
    live.container.reload()
    assert live.container.status == "running"
