"""Replicas on one Docker daemon share the tenant's container, and each keeps its warm pool
(issue 17 item 3, DESIGN §9).

Two real brokers of one deployment (DOCBROKER_INSTANCE) on the same daemon, sharing a data dir
and master key, each with a warm pool of one. Their first calls for a tenant race; the daemon
lets one container have the tenant's name and the other replica adopts it. A replica killed
and started again keeps its live peer's spare, removes its own dead incarnation's, and adopts
the shared container.
"""

from __future__ import annotations

import os
import secrets
import shutil
import sys
import tempfile
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from broker.testing import Broker
from broker.testing.replicas import Replica, Replicas, make_replicas
from tests.broker.support import call_modern, tool_status, wait_for
from tests.docker import test_docker_broker_e2e as e2e
from tests.docker.conftest import IMAGE, SECCOMP, Daemon
from tests.docker.test_docker_broker_e2e import DOC, _chown_tree, _readable_runtime, _start_as

pytestmark = [pytest.mark.docker, pytest.mark.timeout(600)]


@pytest.fixture
def deployment(daemon: Daemon) -> Iterator[tuple[Replicas, str, Path]]:
    base = Path(tempfile.mkdtemp(prefix="docbroker-replicas-", dir="/var/tmp"))
    instance = f"rep{secrets.token_hex(4)}"
    env = {
        "DOCBROKER_DOCKER_HOST": daemon.host,
        "DOCBROKER_DOCKER_IMAGE": IMAGE,
        "DOCBROKER_DOCKER_SECCOMP_PROFILE": str(base / "shared" / "policies" / SECCOMP.name),
        "DOCBROKER_IDLE_TIMEOUT": "300",
        "DOCBROKER_DOCKER_POOL_SIZE": "1",
        "DOCBROKER_INSTANCE": instance,
    }
    replicas = make_replicas(base, 2, runtime="docker", env=env)
    sources = replicas[0].sources("acme")
    sources.mkdir(parents=True)
    (sources / "notes.md").write_text(DOC, encoding="utf-8")
    _chown_tree(base, daemon.owner_uid, daemon.owner_gid)
    base.chmod(0o711)
    try:
        yield replicas, instance, base
    finally:
        replicas.stop()
        client = daemon.client()
        try:
            for container in client.containers.list(
                all=True, filters={"label": f"io.docbroker.instance={instance}"}, ignore_removed=True
            ):
                container.remove(force=True)
        finally:
            client.close()
        shutil.rmtree(base, ignore_errors=True)


def start(replica: Broker, daemon: Daemon, base: Path) -> None:
    """The e2e test's start as the daemon's user; the readable copy of the code it makes for a
    rootless daemon's user is made once, for every replica and restart."""
    if daemon.owner_uid == 0 or not (base / "runtime").exists():
        _start_as(replica, daemon.owner_uid, daemon.owner_gid, base)
        return
    made = _readable_runtime

    def reuse(_: Path) -> tuple[str, str]:
        runtime = base / "runtime"
        return os.path.realpath(sys.executable), f"{runtime / 'src'}:{runtime / 'site'}"

    e2e._readable_runtime = reuse
    try:
        _start_as(replica, daemon.owner_uid, daemon.owner_gid, base)
    finally:
        e2e._readable_runtime = made


def containers(daemon: Daemon, instance: str) -> list[Any]:
    client = daemon.client()
    try:
        return list(
            client.containers.list(
                all=True, filters={"label": f"io.docbroker.instance={instance}"}, ignore_removed=True
            )
        )
    finally:
        client.close()


def spares(daemon: Daemon, instance: str) -> dict[str, list[str]]:
    """Each replica's unbound warm containers, by the replica label."""
    found: dict[str, list[str]] = {}
    for c in containers(daemon, instance):
        if c.labels.get("io.docbroker.pool") == "true" and ".pool-" in c.name and c.status == "running":
            found.setdefault(c.labels.get("io.docbroker.replica", ""), []).append(c.id)
    return found


def tenant_containers(daemon: Daemon, instance: str) -> list[Any]:
    return [c for c in containers(daemon, instance) if c.name == f"docbroker-{instance}-acme"]


def read(replica: Replica) -> dict[str, Any]:
    with replica.http(replica.token("acme", scope="docs:read")) as http:
        return tool_status(call_modern(http, "read_document", {"filename": "notes.md"}))


def sandboxes_used(replica: Replica) -> set[str]:
    return {e["sandbox"] for e in replica.audit_events() if e["event"] == "mcp.request" and e.get("sandbox")}


def test_two_replicas_share_the_tenant_container_and_keep_their_pools(
    deployment: tuple[Replicas, str, Path], daemon: Daemon
) -> None:
    replicas, instance, base = deployment
    a, b = replicas
    for replica in replicas:
        start(replica, daemon, base)
    assert wait_for(lambda: sorted(spares(daemon, instance)) == ["a", "b"], timeout=90), spares(
        daemon, instance
    )

    barrier = threading.Barrier(4)

    def first_read(replica: Replica) -> dict[str, Any]:
        barrier.wait()
        return read(replica)

    with ThreadPoolExecutor(4) as pool:  # both replicas' first calls for the tenant at once
        results = list(pool.map(first_read, [a, b, a, b]))
    assert [r["status"] for r in results] == ["ok"] * 4, results
    assert [r["data"]["content"] for r in results] == [DOC] * 4
    [shared] = tenant_containers(daemon, instance)
    assert shared.status == "running"
    assert sandboxes_used(a) == sandboxes_used(b) == {shared.id}
    started = [e for r in replicas for e in r.audit_events() if e["event"] == "sandbox.started"]
    assert len(started) == 1, started
    # Each replica's pool refills its own slot, and neither removed the other's.
    assert wait_for(lambda: {k: len(v) for k, v in spares(daemon, instance).items()} == {"a": 1, "b": 1}, 90)

    a_spare = spares(daemon, instance)["a"]
    b_spare = spares(daemon, instance)["b"]
    b.kill()  # its spare and the shared container stay behind, running
    assert tenant_containers(daemon, instance)[0].id == shared.id
    assert read(a)["status"] == "ok"
    start(b, daemon, base)
    # b's start-up: a's live spare kept, b's dead incarnation's removed, the shared one adopted.
    assert wait_for(lambda: len(spares(daemon, instance).get("b", [])) == 1, 90)
    now = spares(daemon, instance)
    assert now["a"] == a_spare
    assert now["b"] != b_spare and b_spare[0] not in {c.id for c in containers(daemon, instance)}
    assert read(b)["status"] == "ok" and read(a)["status"] == "ok"
    assert [c.id for c in tenant_containers(daemon, instance)] == [shared.id]
    started = [e for r in replicas for e in r.audit_events() if e["event"] == "sandbox.started"]
    stopped = [e for r in replicas for e in r.audit_events() if e["event"] == "sandbox.stopped"]
    assert len(started) == 1 and stopped == [], (started, stopped)
