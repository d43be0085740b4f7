"""End to end on Docker: `docbroker sandbox replace` beside a running broker.

The operator's command runs as another process (as the broker's user, with the broker's
settings) and removes the tenant's container by its labels; the broker finds it gone on the
next call, starts a new one, pins it afresh, and the client's call succeeds. Pooled and cold.
"""

from __future__ import annotations

import json
import os
import pwd
import subprocess
import sys
from typing import Any

import pytest

from broker.testing import Broker, structured
from tests.docker.conftest import Daemon
from tests.docker.test_docker_broker_e2e import DOC, docker_broker

pytestmark = [pytest.mark.docker, pytest.mark.anyio]
__all__ = ["docker_broker"]  # the fixture, shared with the end-to-end test


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def _sandbox_replace(broker: Broker, daemon: Daemon, tenant: str) -> dict[str, Any]:
    """The command as the broker's user runs it (the code from the copy that user can read)."""
    base = broker.data_dir.parent
    uid, gid = daemon.owner_uid, daemon.owner_gid
    if uid == 0:
        python, pythonpath, home = sys.executable, broker.env["PYTHONPATH"], broker.env["HOME"]
    else:
        runtime = base / "runtime"
        python = os.path.realpath(sys.executable)
        pythonpath, home = f"{runtime / 'src'}:{runtime / 'site'}", pwd.getpwuid(uid).pw_dir
    done = subprocess.run(
        [python, "-m", "broker", "sandbox", "replace", tenant],
        cwd=base, env={**broker.env, "PYTHONPATH": pythonpath, "HOME": home},
        user=uid, group=gid, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    answer: dict[str, Any] = json.loads(done.stdout)
    return answer


def _acme_container(daemon: Daemon) -> str | None:
    client = daemon.client()
    try:
        found = client.containers.list(all=True, filters={"name": "docbroker-acme"})
        return str(found[0].id) if found else None
    finally:
        client.close()


async def test_an_operator_replaces_the_sandbox_of_a_running_broker(
    docker_broker: Broker, daemon: Daemon
) -> None:
    broker = docker_broker
    token = broker.token("acme", scope="docs:read")
    async with broker.client(token) as client:
        read = structured(await client.call_tool("read_document", {"filename": "notes.md"}))
        assert read["status"] == "ok"
    old = _acme_container(daemon)
    assert old is not None

    assert _sandbox_replace(broker, daemon, "acme") == {"tenant": "acme", "removed": 1}
    assert _acme_container(daemon) is None  # gone from the engine, not only from a broker's view

    async with broker.client(token) as client:
        read = structured(await client.call_tool("read_document", {"filename": "notes.md"}))
        assert read["status"] == "ok" and read["data"]["content"] == DOC
    new = _acme_container(daemon)
    assert new is not None and new != old
    seen = [
        (e["event"], e.get("sandbox")) for e in broker.audit_events() if e["event"].startswith("sandbox.")
    ]
    assert ("sandbox.failed", old) in seen and ("sandbox.started", new) in seen
