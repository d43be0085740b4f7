"""Stopping a broker on Docker leaves none of its sandboxes running (issue 25).

A real broker process on a real daemon (each daemon; on a rootless one the broker runs as the
daemon's user), a call so that a tenant's sandbox runs, and a warm pool: then SIGTERM, Ctrl-C
(SIGINT), or Ctrl-C pressed twice (the second during the shutdown: uvicorn's "force quit",
which skipped the app's shutdown and left every sandbox running). The broker must exit, within
a bound, and no container with its instance label may remain (DESIGN §9: the last replica out
leaves nothing running; there is no other replica here).
"""

from __future__ import annotations

import contextlib
import shutil
import signal
import socket
import subprocess
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx2
import pytest

from broker.testing import Broker, make_broker
from tests.broker.support import call_modern, tool_status, wait_for
from tests.docker.conftest import IMAGE, SECCOMP, Daemon, remove_instance
from tests.docker.test_docker_broker_e2e import start_for_daemon

pytestmark = pytest.mark.docker

EXIT_WITHIN = 30.0  # seconds from the last signal: the graceful wait (10 s) and the removals


@pytest.fixture
def docker_broker(daemon: Daemon) -> Iterator[tuple[Broker, str]]:
    base = Path(tempfile.mkdtemp(prefix="docbroker-signals-", dir="/var/tmp"))
    instance = "sig" + uuid.uuid4().hex[:8]
    env = {
        "DOCBROKER_DOCKER_HOST": daemon.host,
        "DOCBROKER_DOCKER_IMAGE": IMAGE,
        "DOCBROKER_DOCKER_SECCOMP_PROFILE": str(base / "policies" / SECCOMP.name),
        "DOCBROKER_IDLE_TIMEOUT": "300",
        "DOCBROKER_DOCKER_POOL_SIZE": "1",
        "DOCBROKER_INSTANCE": instance,
    }
    broker = make_broker(base, runtime="docker", env=env)
    try:
        start_for_daemon(broker, daemon, base, {"acme": "quarterly numbers\n"})
        yield broker, instance
    finally:
        if broker.proc is not None and broker.proc.poll() is None:
            broker.proc.kill()
            broker.proc.wait()
        remove_instance(daemon, instance)
        shutil.rmtree(base, ignore_errors=True)


def containers(daemon: Daemon, instance: str) -> list[str]:
    client = daemon.client()
    try:
        # One list request: the SDK's containers.list inspects each one it lists, and a spare
        # removed in between (the pool replacing one) made that a 404 here.
        found = client.api.containers(all=True, filters={"label": f"io.docbroker.instance={instance}"})
        return sorted(name.lstrip("/") for c in found for name in c["Names"])
    finally:
        client.close()


def refuses_connections(broker: Broker) -> bool:
    """The server has stopped accepting: its shutdown is under way."""
    try:
        with socket.create_connection(("127.0.0.1", int(broker.env["DOCBROKER_PORT"])), timeout=1):
            return False
    except OSError:
        return True


@contextlib.contextmanager
def request_in_flight(broker: Broker) -> Iterator[None]:
    """A request whose body never ends: uvicorn's graceful shutdown waits on it (up to 10 s),
    which is when an impatient operator presses Ctrl-C again."""
    with socket.create_connection(("127.0.0.1", int(broker.env["DOCBROKER_PORT"])), timeout=5) as conn:
        conn.sendall(
            b"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            b"Content-Length: 1000\r\n\r\n{"
        )
        yield


@pytest.mark.parametrize(
    "signals",
    [(signal.SIGTERM,), (signal.SIGINT,), (signal.SIGINT, signal.SIGINT)],
    ids=["SIGTERM", "SIGINT", "SIGINT-twice"],
)
def test_a_stopped_broker_leaves_no_sandbox_running(
    docker_broker: tuple[Broker, str], daemon: Daemon, signals: tuple[signal.Signals, ...]
) -> None:
    broker, instance = docker_broker
    assert broker.proc is not None
    with broker.http(broker.token("acme")) as http:
        found = tool_status(call_modern(http, "search_documents", {"query": "quarterly"}))
    assert found["status"] == "ok", found
    # the tenant's sandbox and the warm pool's spare both run
    assert wait_for(lambda: len(containers(daemon, instance)) >= 2, timeout=30), containers(daemon, instance)

    with request_in_flight(broker):
        broker.proc.send_signal(signals[0])
        for again in signals[1:]:
            # the shutdown is under way (the listener is closed) and waits on the request
            assert wait_for(lambda: refuses_connections(broker), timeout=10)
            assert broker.proc.poll() is None
            broker.proc.send_signal(again)
        try:
            broker.proc.wait(timeout=EXIT_WITHIN)
        except subprocess.TimeoutExpired:
            pytest.fail(f"the broker did not exit within {EXIT_WITHIN} s of {signals}")
    logs = broker.logs()
    assert containers(daemon, instance) == [], logs[-3000:]
    assert "Traceback" not in logs, logs[-3000:]
    with contextlib.suppress(httpx2.TransportError):
        httpx2.get(f"{broker.url}/healthz", timeout=1)
        pytest.fail("the broker still answers")
