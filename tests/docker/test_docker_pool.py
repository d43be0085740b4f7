"""The warm pool with real containers: hardening, binding, escapes, lifecycle (both daemons).

A warm sandbox starts with no tenant files at all, is bound on a tenant's first call (its
folders passed as descriptors, server/binding.py) and locks itself down with Landlock. These
tests check it from the outside (HostConfig, names, adoption, clean-up) and from the inside:
a probe that stands in for a compromised server, bound and confined by the same code as the
real one, tries to leave its tenant's folders.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from bench.first_call import CountingProxy
from broker.runtime.docker import DockerBackend
from broker.runtime.readiness import wait_ready
from broker.types import DaemonMode
from server.binding import send_binding
from tests.docker.conftest import PYTHON, Daemon, Layout, remove_instance, unique_tenant
from tests.docker.test_docker_mcp import call_all
from tests.escape_probe import HELPERS

pytestmark = pytest.mark.docker

HARDENING_KEYS = (
    "CapDrop",
    "SecurityOpt",
    "ReadonlyRootfs",
    "NetworkMode",
    "IpcMode",
    "Privileged",
    "Memory",
    "MemorySwap",
    "NanoCpus",
    "PidsLimit",
    "Ulimits",
    "Tmpfs",
    "RestartPolicy",
)


@pytest.fixture
def instance(daemon: Daemon) -> Iterator[str]:
    name = f"pool{uuid.uuid4().hex[:8]}"
    yield name
    remove_instance(daemon, name)


def pool_dir(layout: Layout) -> Path:
    """Where the broker keeps warm slots' run dirs; owned by the broker's user, as in production."""
    path = layout.root / "run" / ".pool"
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    os.chown(path.parent, layout.daemon.owner_uid, layout.daemon.owner_gid)
    os.chown(path, layout.daemon.owner_uid, layout.daemon.owner_gid)
    return path


async def connect_pooled(daemon: Daemon, layout: Layout, instance: str, **overrides: Any) -> DockerBackend:
    return await DockerBackend.connect(
        daemon.settings(**overrides), instance=instance, pool_dir=pool_dir(layout)
    )


async def warm_backend(daemon: Daemon, layout: Layout, instance: str, **overrides: Any) -> DockerBackend:
    backend = await connect_pooled(daemon, layout, instance, **overrides)
    await backend.start()
    for _ in range(600):
        if backend.describe()["pool"]["ready"]:
            return backend
        await asyncio.sleep(0.05)
    raise AssertionError(f"no warm sandbox after 30 s: {backend.describe()['pool']}")


def containers(daemon: Daemon, instance: str) -> dict[str, Any]:
    client = daemon.client()
    try:
        found = client.containers.list(
            all=True, filters={"label": f"io.docbroker.instance={instance}"}, ignore_removed=True
        )
        return {c.name: c.attrs for c in found}
    finally:
        client.close()


def test_warm_sandbox_is_hardened_like_a_cold_one_and_holds_no_tenant_files(
    daemon: Daemon, layout: Layout, instance: str
) -> None:
    async def scenario() -> tuple[dict[str, Any], dict[str, Any], DaemonMode]:
        backend = await warm_backend(daemon, layout, instance)
        try:
            [(name, warm)] = containers(daemon, instance).items()
            assert ".pool-" in name
            cold_backend = await DockerBackend.connect(daemon.settings(), instance=instance)
            info = await cold_backend.create(layout.tenant(unique_tenant()).spec)
            cold = containers(daemon, instance)[cold_backend.container_name(info.tenant)]
            await cold_backend.delete(info)
            await cold_backend.close()
            return warm, cold, backend.mode()
        finally:
            await backend.close()

    warm, cold, mode = asyncio.run(scenario())
    for key in HARDENING_KEYS:
        assert warm["HostConfig"][key] == cold["HostConfig"][key], key
    # gid 0 only where it is the broker user's own (rootless); else a dedicated group (DESIGN §7)
    expected = "10001:0" if mode is DaemonMode.ROOTLESS else "10001:10001"
    assert warm["Config"]["User"] == cold["Config"]["User"] == expected
    assert [m["Destination"] for m in warm["Mounts"]] == ["/run/docs"]  # no sources, reports, secret
    assert not any(e.startswith("DOCS_SCOPE=") for e in warm["Config"]["Env"])
    assert warm["Config"]["Labels"]["io.docbroker.pool"] == "true"
    assert "io.docbroker.tenant" not in warm["Config"]["Labels"]
    assert containers(daemon, instance) == {}, "close() left a container"
    assert os.listdir(layout.root / "run" / ".pool") == []


def test_first_call_binds_the_warm_sandbox_and_it_serves_the_tenant(
    daemon: Daemon, layout: Layout, instance: str
) -> None:
    content = "# Pooled\n\nwritten by a sandbox that was warm before its tenant existed\n"
    tenant = layout.tenant(unique_tenant(), {"notes.md": "hello docbroker sandbox\n"})

    async def scenario() -> tuple[str, str, dict[str, Any], dict[str, Any]]:
        backend = await warm_backend(daemon, layout, instance)
        try:
            [warm_id] = [a["Id"] for a in containers(daemon, instance).values()]
            info = await backend.create(tenant.spec)
            assert info.endpoint is not None and info.endpoint.uds is not None
            assert await wait_ready(info.endpoint, 20.0)
            result = await call_all(info.endpoint.uds, tenant.secret, tenant.spec.tenant, content)
            return warm_id, info.backend_id, result, backend.describe()["pool"]
        finally:
            await backend.close()

    warm_id, bound_id, result, pool = asyncio.run(scenario())
    assert bound_id == warm_id, "the first call must take the warm sandbox, not start a cold one"
    assert pool["state"] == "on"
    assert result["search"]["status"] == "ok"
    assert result["read"]["data"]["content"] == "hello docbroker sandbox\n"
    assert result["saved"]["status"] == "ok" and result["replay"]["status"] == "rejected"
    assert (tenant.dropbox / "summary.md").read_bytes() == content.encode()


ESCAPE_PROBE = (
    HELPERS
    + r"""
from server import binding

bound, _ = binding.accept_binding(binding.listen("/run/docs/bind.sock"), run_dir="/run/docs")
src, rep = bound.sources_fd, bound.reports_fd
other = sys.argv[1]

def walk_up(levels):
    return os.open("/".join([".."] * levels), os.O_PATH, dir_fd=src)

results = {
    "read own source": attempt(lambda: read_at(src, "notes.md")),
    "list own sources": attempt(lambda: os.listdir(os.open(".", os.O_RDONLY | os.O_DIRECTORY, dir_fd=src))),
    "create a report": attempt(lambda: create_at(rep, "probe.md", b"probe report", 0o040)),
    "list ..": attempt(lambda: os.listdir(os.open("..", os.O_RDONLY | os.O_DIRECTORY, dir_fd=src))),
    "stat ../reports": attempt(lambda: os.stat("../reports", dir_fd=src)),
    "read other tenant by ..": attempt(lambda: read_at(src, f"../../../{other}/docs/sources/secret.md")),
    "read other tenant by /proc": attempt(
        lambda: read_at(None, f"/proc/self/fd/{src}/../../../{other}/docs/sources/secret.md")
    ),
    "read secrets dir by ..": attempt(
        lambda: os.listdir(os.open("../../../../secrets", os.O_RDONLY, dir_fd=src))
    ),
    "write own source": attempt(lambda: os.close(os.open("notes.md", os.O_WRONLY, dir_fd=src))),
    "create in sources": attempt(lambda: create_at(src, "planted.md")),
    "read a report back": attempt(lambda: read_at(rep, "probe.md")),
    "list reports": attempt(lambda: os.listdir(os.open(".", os.O_RDONLY | os.O_DIRECTORY, dir_fd=rep))),
    "remove a report": attempt(lambda: os.unlink("probe.md", dir_fd=rep)),
    "create in the run dir": attempt(lambda: create_at(None, "/run/docs/planted")),
}
for levels in (1, 2, 3, 4):
    def look(levels=levels):
        fd = walk_up(levels)
        try:
            os.listdir(os.open(".", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd))
        finally:
            os.close(fd)
    results[f"list {levels} up"] = attempt(look)
print("PROBE " + json.dumps(results), flush=True)
"""
)


def test_a_bound_sandbox_cannot_leave_its_tenants_folders(
    daemon: Daemon, layout: Layout, instance: str
) -> None:
    mine = layout.tenant(unique_tenant("a"), {"notes.md": "mine\n"})
    other = layout.tenant(unique_tenant("b"), {"secret.md": "CANARY-OTHER-TENANT\n"})

    async def scenario() -> str:
        backend = await connect_pooled(daemon, layout, instance)
        slot_dir = pool_dir(layout) / "probe"
        slot_dir.mkdir()
        slot_dir.chmod(0o1777)
        # The warm sandbox's exact options, with the server swapped for the probe.
        options = backend.hardened_options(
            f"docbroker-{instance}.pool-probe",
            image=await backend.image(),
            labels={"io.docbroker.pool": "true"},
            environment={},
            mounts=[("/run/docs", str(slot_dir), False)],
        )
        options["entrypoint"] = [PYTHON, "-c", ESCAPE_PROBE, other.spec.tenant]
        client = daemon.client()
        container = client.containers.create(**options)
        container.start()
        try:
            bind_socket = str(slot_dir / "bind.sock")
            for _ in range(600):
                if os.path.exists(bind_socket):
                    break
                await asyncio.sleep(0.05)
            send_binding(
                bind_socket,
                tenant=mine.spec.tenant,
                sources_dir=mine.spec.sources_dir,
                dropbox_dir=mine.spec.dropbox_dir,
                secret_file=mine.spec.secret_file,
                timeout=10,
            )
            assert container.wait(timeout=60)["StatusCode"] == 0, container.logs().decode()
            return str(container.logs().decode())
        finally:
            container.remove(force=True)
            client.close()
            await backend.close()

    logs = asyncio.run(scenario())
    [line] = [line for line in logs.splitlines() if line.startswith("PROBE ")]
    results = json.loads(line.removeprefix("PROBE "))
    controls = ("read own source", "list own sources", "create a report")
    assert {k: results.pop(k) for k in controls} == dict.fromkeys(controls, "allowed")
    denied = {k: v for k, v in results.items() if v == "allowed"}
    assert not denied, f"a bound sandbox got out: {denied}"
    assert "CANARY-OTHER-TENANT" not in logs
    assert (mine.dropbox / "probe.md").read_bytes() == b"probe report"
    assert not (mine.sources / "planted.md").exists()


def test_another_process_in_the_container_cannot_reach_the_servers_descriptors(
    daemon: Daemon, layout: Layout, instance: str
) -> None:
    tenant = layout.tenant(unique_tenant(), {"notes.md": "x\n"})
    probe = (
        "import json, os\n"
        "def attempt(path):\n"
        "    try:\n        os.listdir(path)\n        return 'allowed'\n"
        "    except OSError as exc:\n        return exc.strerror\n"
        "lines = open('/proc/1/status').read().splitlines()\n"
        "status = dict(line.split(':\\t', 1) for line in lines if ':\\t' in line)\n"
        "ids = lambda key: [int(n) for n in status[key].split()]\n"
        "print(json.dumps({'self': attempt('/proc/self/fd'), 'server': attempt('/proc/1/fd'),\n"
        "    'gid': ids('Gid'), 'groups': ids('Groups')}))\n"
    )

    async def scenario() -> tuple[str, DaemonMode]:
        backend = await warm_backend(daemon, layout, instance)
        try:
            info = await backend.create(tenant.spec)
            assert info.endpoint is not None and await wait_ready(info.endpoint, 20.0)
            client = daemon.client()
            try:
                result = client.containers.get(info.backend_id).exec_run(
                    [PYTHON, "-c", probe], user=backend.sandbox_user
                )
            finally:
                client.close()
            assert result.exit_code == 0, result.output
            return str(result.output.decode()), backend.mode()
        finally:
            await backend.close()

    output, mode = asyncio.run(scenario())
    facts = json.loads(output.strip().splitlines()[-1])
    assert facts["self"] == "allowed"  # the control: /proc works for the probe itself
    assert facts["server"] != "allowed"  # the server is not dumpable: its fds stay its own
    # A bound warm server's group: 0 only rootless (the broker user's gid), else never 0
    if mode is DaemonMode.ROOTLESS:
        assert facts["gid"][:2] == [0, 0]
    else:
        assert facts["gid"][:2] == [10001, 10001] and 0 not in facts["groups"]


def test_restarted_broker_adopts_bound_sandboxes_and_removes_old_spares(
    daemon: Daemon, layout: Layout, instance: str
) -> None:
    tenant = layout.tenant(unique_tenant(), {"notes.md": "adopt me\n"})

    async def first_broker() -> str:
        backend = await warm_backend(daemon, layout, instance)
        info = await backend.create(tenant.spec)
        assert info.endpoint is not None and await wait_ready(info.endpoint, 20.0)
        await warm_again(backend)
        # The broker dies here: nothing is closed.
        return info.backend_id

    async def second_broker() -> list[Any]:
        backend = await connect_pooled(daemon, layout, instance)
        found = await backend.discover()
        for info in found:
            await backend.delete(info)
        await backend.close()
        return found

    bound_id = asyncio.run(first_broker())
    names = set(containers(daemon, instance))
    assert len(names) == 2 and any(".pool-" in n for n in names)  # the bound one and a new spare
    found = asyncio.run(second_broker())
    assert [(i.tenant, i.backend_id) for i in found] == [(tenant.spec.tenant, bound_id)]
    assert containers(daemon, instance) == {}, "the old spare must be removed, the adopted one deleted"
    assert os.listdir(layout.root / "run" / ".pool") == []


async def warm_again(backend: DockerBackend) -> None:
    for _ in range(600):
        if backend.describe()["pool"]["ready"]:
            return
        await asyncio.sleep(0.05)
    raise AssertionError("the pool did not refill")


def test_a_dead_warm_sandbox_falls_back_to_a_cold_start(
    daemon: Daemon, layout: Layout, instance: str
) -> None:
    tenant = layout.tenant(unique_tenant(), {"notes.md": "hello docbroker sandbox\n"})

    async def scenario() -> tuple[dict[str, Any], dict[str, Any]]:
        backend = await warm_backend(daemon, layout, instance)
        try:
            client = daemon.client()
            for container in client.containers.list(
                filters={"label": f"io.docbroker.instance={instance}"}, ignore_removed=True
            ):
                container.kill()
            client.close()
            info = await backend.create(tenant.spec)
            assert info.endpoint is not None and await wait_ready(info.endpoint, 30.0)
            result = await call_all(info.endpoint.uds or "", tenant.secret, tenant.spec.tenant, "# r\n")
            return containers(daemon, instance)[backend.container_name(tenant.spec.tenant)], result
        finally:
            await backend.close()

    cold, result = asyncio.run(scenario())
    assert cold["Config"]["Labels"].get("io.docbroker.tenant") is not None  # started cold
    assert result["read"]["data"]["content"] == "hello docbroker sandbox\n"


def container_ids(daemon: Daemon, instance: str) -> list[str]:
    """The instance's containers as one list call (no inspect each: one may go meanwhile)."""
    client = daemon.client()
    try:
        found = client.api.containers(all=True, filters={"label": f"io.docbroker.instance={instance}"})
        return [str(c["Id"]) for c in found]
    finally:
        client.close()


def test_close_while_warming_leaves_nothing(daemon: Daemon, layout: Layout, instance: str) -> None:
    async def scenario() -> None:
        backend = await connect_pooled(daemon, layout, instance)
        await backend.start()
        # The race entered: the daemon holds the warm sandbox's container, not yet ready.
        async with asyncio.timeout(30):
            while not await asyncio.to_thread(container_ids, daemon, instance):
                await asyncio.sleep(0.02)
        pool = backend.describe()["pool"]
        assert (pool["warming"], pool["ready"]) == (1, 0), pool
        await backend.close()

    asyncio.run(scenario())
    assert containers(daemon, instance) == {}
    assert os.listdir(layout.root / "run" / ".pool") == []


def test_a_pool_that_cannot_start_turns_itself_off_and_sandboxes_start_cold(
    daemon: Daemon, layout: Layout, instance: str
) -> None:
    blocker = layout.root / "not-a-folder"
    blocker.write_text("a file where the pool's folder should be")
    tenant = layout.tenant(unique_tenant(), {"notes.md": "hello docbroker sandbox\n"})

    async def scenario() -> tuple[dict[str, Any], str]:
        backend = await DockerBackend.connect(
            daemon.settings(), instance=instance, pool_dir=blocker / ".pool"
        )
        await backend.start()
        try:
            for _ in range(200):  # three failed starts, 0 + 1 + 2 s apart
                if backend.describe()["pool"]["state"] == "off":
                    break
                await asyncio.sleep(0.05)
            info = await backend.create(tenant.spec)
            assert info.endpoint is not None and await wait_ready(info.endpoint, 30.0)
            return backend.describe()["pool"], info.backend_id
        finally:
            await backend.close()

    pool, sandbox_id = asyncio.run(scenario())
    assert pool["state"] == "off" and "did not start" in pool["reason"]
    [(name, attrs)] = containers(daemon, instance).items()  # the tenant's, started cold; no spare
    assert attrs["Id"] == sandbox_id and ".pool-" not in name


def test_an_unprovisioned_tenant_is_refused_without_spending_the_warm_sandbox(
    daemon: Daemon, layout: Layout, instance: str
) -> None:
    from broker.runtime.base import SandboxStartError
    from broker.types import SandboxSpec

    missing = layout.root / "tenants" / "ghost"
    spec = SandboxSpec(
        tenant="ghost", docs_root=str(missing / "docs"), secret_file=str(missing / "k"), run_dir=str(missing)
    )

    async def scenario() -> dict[str, Any]:
        backend = await warm_backend(daemon, layout, instance)
        try:
            with pytest.raises(SandboxStartError, match="provision the tenant first"):
                await backend.create(spec)
            return dict(backend.describe()["pool"])
        finally:
            await backend.close()

    pool = asyncio.run(scenario())
    assert {k: pool[k] for k in ("size", "state", "ready", "warming", "waiting")} == {
        "size": 1,
        "state": "on",
        "ready": 1,
        "warming": 0,
        "waiting": 0,
    }


def test_a_caller_that_gives_up_mid_binding_leaves_no_sandbox_behind(
    daemon: Daemon, layout: Layout, instance: str
) -> None:
    tenant = layout.tenant(unique_tenant(), {"notes.md": "x\n"})

    async def scenario() -> tuple[str, dict[str, Any]]:
        backend = await warm_backend(daemon, layout, instance)
        try:
            [warm_id] = [a["Id"] for a in containers(daemon, instance).values()]
            task = asyncio.create_task(backend.create(tenant.spec))
            # The race entered: the warm slot is taken, its binding under way in a worker thread.
            async with asyncio.timeout(10):
                while backend.describe()["pool"]["ready"]:
                    await asyncio.sleep(0.001)
            assert not task.done()
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            return warm_id, containers(daemon, instance)
        finally:
            await backend.close()

    warm_id, left = asyncio.run(scenario())
    assert warm_id not in [a["Id"] for a in left.values()], "the half-bound sandbox was left running"
    assert all(".pool-" in name for name in left), left  # at most the new spare, never a tenant's


def test_the_lifecycle_with_warm_sandboxes_crash_replace_reap_close(
    daemon: Daemon, layout: Layout, instance: str
) -> None:
    from broker.runtime.lifecycle import Runtime
    from broker.types import SandboxState

    tenant = layout.tenant(unique_tenant(), {"notes.md": "lifecycle\n"})
    seen: list[tuple[str, str]] = []

    async def on_event(event: str, name: str, sandbox: str, details: dict[str, Any]) -> None:
        seen.append((event, details.get("reason", "")))

    async def scenario() -> tuple[list[str], dict[str, Any], list[str]]:
        backend = await connect_pooled(daemon, layout, instance)
        runtime = Runtime(
            backend,
            lambda _: tenant.spec,
            max_sandboxes=5,
            idle_timeout=600.0,
            start_timeout=30.0,
            on_event=on_event,
        )
        await runtime.start()
        await warm_again(backend)
        ids = []
        for _ in range(2):  # the first sandbox crashes; the second is a new warm one
            endpoint = await runtime.ensure(tenant.spec.tenant)
            assert endpoint.uds is not None and endpoint.uds.startswith(str(pool_dir(layout)))
            (info,) = runtime.list()
            ids.append(info.backend_id)
            result = await call_all(endpoint.uds, tenant.secret, tenant.spec.tenant, f"# {len(ids)}\n")
            assert result["read"]["data"]["content"] == "lifecycle\n"
            (tenant.dropbox / "summary.md").unlink()  # as the broker moves reports out
            client = daemon.client()
            client.containers.get(info.backend_id).kill()
            client.close()
            await runtime.mark_broken(tenant.spec.tenant)
            assert info.state is SandboxState.FAILED
            await warm_again(backend)
        await runtime.stop(tenant.spec.tenant, reason="idle")
        left_dirs = sorted(os.listdir(pool_dir(layout)))
        alive = containers(daemon, instance)
        await runtime.close()
        return ids, alive, left_dirs

    ids, alive, left_dirs = asyncio.run(scenario())
    assert len(set(ids)) == 2
    [(spare, attrs)] = alive.items()  # only the current spare: both tenant sandboxes are gone
    assert ".pool-" in spare and attrs["Id"] not in ids
    assert len(left_dirs) == 1  # the spare's slot dir; the two used ones were removed with them
    assert containers(daemon, instance) == {}
    assert os.listdir(pool_dir(layout)) == []
    assert [e for e, _ in seen].count("sandbox.started") == 2


@pytest.mark.timeout(600)
def test_a_burst_of_new_tenants_grows_the_pool_and_idle_shrinks_it_back(
    daemon: Daemon, layout: Layout, instance: str
) -> None:
    """Four new tenants at once against a pool of one (cap 3): each is served by a warm
    sandbox (the spare, or one started for it: none cold), then the pool starts spares up to
    its cap, and with no new tenant for the idle time it is back at its floor, the spares
    above it removed from the daemon."""
    tenants = [layout.tenant(unique_tenant(f"b{i}"), {"notes.md": "burst\n"}) for i in range(4)]

    async def scenario() -> tuple[list[str], dict[str, Any], dict[str, Any], list[str]]:
        backend = await DockerBackend.connect(
            daemon.settings(pool_size=1, pool_max=3),
            instance=instance,
            pool_dir=pool_dir(layout),
            # Longer than a start on a loaded host: the spares are started before it runs out.
            pool_idle_seconds=60.0,
        )
        await backend.start()
        try:
            await until(backend, lambda p: p["ready"] == 1)
            infos = await asyncio.gather(*(backend.create(t.spec) for t in tenants))
            grown = await until(backend, lambda p: p["waiting"] == 0 and p["ready"] + p["warming"] == 3)
            shrunk = await until(backend, lambda p: (p["size"], p["ready"], p["warming"]) == (1, 1, 0))
            # The pool counts a spare gone when its removal starts; the daemon's list follows.
            async with asyncio.timeout(60):
                while len(spares := await asyncio.to_thread(spare_names, daemon, instance)) > 1:
                    await asyncio.sleep(0.1)
            for info in infos:
                assert info.endpoint is not None and await wait_ready(info.endpoint, 60.0)
                await backend.delete(info)
            return [i.endpoint.uds or "" for i in infos if i.endpoint], grown, shrunk, spares
        finally:
            await backend.close()

    sockets, grown, shrunk, spares = asyncio.run(scenario())
    # Served warm: every tenant's socket is in a warm slot's run dir, none in its own (cold).
    assert all(s.startswith(str(pool_dir(layout))) for s in sockets), sockets
    assert (grown["size"], grown["peak"]) == (3, 3)
    assert (shrunk["size"], shrunk["peak"]) == (1, 3)
    assert len(spares) == 1  # the spares above the floor removed from the daemon
    assert containers(daemon, instance) == {}


async def until(backend: DockerBackend, check: Any, timeout: float = 240.0) -> dict[str, Any]:
    """The pool's facts once `check` holds for them (polled: the pool's own observable)."""
    deadline = time.monotonic() + timeout
    while not check(pool := backend.describe()["pool"]):
        assert time.monotonic() < deadline, f"the pool did not get there in {timeout} s: {pool}"
        await asyncio.sleep(0.05)
    return dict(pool)


def spare_names(daemon: Daemon, instance: str) -> list[str]:
    """The unbound spares' names, in one list call (a spare being removed may go meanwhile)."""
    client = daemon.client()
    try:
        found = client.api.containers(all=True, filters={"label": f"io.docbroker.instance={instance}"})
        return [name for c in found for name in c["Names"] if ".pool-" in name]
    finally:
        client.close()


def test_a_claim_asks_the_daemon_three_times_and_waits_for_nothing_after(
    daemon: Daemon, layout: Layout, instance: str
) -> None:
    """A tenant's first call on a warm sandbox, counted on a real daemon through a proxy socket:
    the image's digest, the tenant's name (another replica's container?), the rename. No spare's
    start in between (refills wait until the takes pause: the tenant's first call goes first),
    and no inspect while waiting for the MCP socket (it listens when the binding is answered)."""
    tenant = layout.tenant(unique_tenant(), {"notes.md": "hello\n"})
    proxy = CountingProxy(daemon.host.removeprefix("unix://"))

    async def scenario() -> list[str]:
        backend = await warm_backend(daemon, layout, instance, base_url=f"unix://{proxy.path}")
        try:
            started = time.monotonic()
            info = await backend.create(tenant.spec)
            assert info.endpoint is not None
            assert await wait_ready(info.endpoint, 20.0, lambda: backend.alive(info))
            return [f"{method} {path}" for method, path in proxy.between(started, time.monotonic())]
        finally:
            await backend.close()

    try:
        calls = asyncio.run(scenario())
    finally:
        proxy.close()
    assert len(calls) == 3, calls
    assert [c.split()[0] for c in calls] == ["GET", "GET", "POST"], calls
    assert "/images/" in calls[0] and calls[2].split("?")[0].endswith("/rename"), calls


def test_callers_at_once_resolve_the_image_once(daemon: Daemon, instance: str) -> None:
    """Twenty first calls at once ask the daemon for the image's digest once, not twenty times."""
    proxy = CountingProxy(daemon.host.removeprefix("unix://"))

    async def scenario() -> tuple[set[str], list[tuple[str, str]]]:
        backend = await DockerBackend.connect(
            daemon.settings(base_url=f"unix://{proxy.path}"), instance=instance
        )
        try:
            started = time.monotonic()
            digests = await asyncio.gather(*(backend.image() for _ in range(20)))
            return set(digests), proxy.between(started, time.monotonic())
        finally:
            await backend.close()

    try:
        digests, calls = asyncio.run(scenario())
    finally:
        proxy.close()
    assert len(digests) == 1 and next(iter(digests)).startswith("sha256:")
    assert [m for m, p in calls if "/images/" in p] == ["GET"], calls
