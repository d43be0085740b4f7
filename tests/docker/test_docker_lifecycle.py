"""The shared lifecycle (broker.runtime.lifecycle.Runtime) driving real containers.

ensure → reuse → idle reap; crash → mark_broken → restart; broker restart → adopt; cap;
close removes everything. Events are recorded by a no-op sink.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from broker.runtime.base import CapacityError
from broker.runtime.docker import DockerBackend
from broker.runtime.lifecycle import Runtime
from broker.types import SandboxState
from tests.docker.conftest import Daemon, Layout, remove_instance, unique_tenant

pytestmark = pytest.mark.docker


class Events:
    def __init__(self) -> None:
        self.seen: list[tuple[str, str, str, dict[str, Any]]] = []

    async def __call__(self, event: str, tenant: str, sandbox: str, details: dict[str, Any]) -> None:
        self.seen.append((event, tenant, sandbox, details))

    def names(self, tenant: str) -> list[str]:
        return [e for e, t, _, _ in self.seen if t == tenant]


@pytest.fixture
def instance(daemon: Daemon) -> Iterator[str]:
    name = f"life{uuid.uuid4().hex[:8]}"
    yield name
    remove_instance(daemon, name)


def managed(daemon: Daemon, instance: str) -> list[Any]:
    client = daemon.client()
    try:
        return list(
            client.containers.list(
                all=True, filters={"label": f"io.docbroker.instance={instance}"}, ignore_removed=True
            )
        )
    finally:
        client.close()


async def make_runtime(
    daemon: Daemon, layout: Layout, instance: str, events: Events, **options: Any
) -> Runtime:
    backend = await DockerBackend.connect(daemon.settings(), instance=instance)
    specs = {}

    def spec_for(tenant: str) -> Any:
        if tenant not in specs:
            specs[tenant] = layout.tenant(tenant).spec
        return specs[tenant]

    runtime = Runtime(
        backend,
        spec_for,
        max_sandboxes=options.get("max_sandboxes", 10),
        idle_timeout=options.get("idle_timeout", 600.0),
        start_timeout=30.0,
        on_event=events,
    )
    await runtime.start()
    return runtime


def test_ensure_starts_then_reuses(daemon: Daemon, layout: Layout, instance: str) -> None:
    async def scenario() -> None:
        events = Events()
        runtime = await make_runtime(daemon, layout, instance, events)
        tenant = unique_tenant()
        first = await runtime.ensure(tenant)
        second = await runtime.ensure(tenant)
        assert first == second
        assert [s.tenant for s in runtime.list()] == [tenant]
        assert events.names(tenant) == ["sandbox.started"]
        details = events.seen[0][3]
        assert details["backend"] == "docker" and details["mode"] in ("rootless", "rootful", "userns-remap")
        assert len(managed(daemon, instance)) == 1
        await runtime.close()

    asyncio.run(scenario())


def test_idle_sandbox_is_reaped(daemon: Daemon, layout: Layout, instance: str) -> None:
    async def scenario() -> None:
        events = Events()
        runtime = await make_runtime(daemon, layout, instance, events, idle_timeout=1.0)
        tenant = unique_tenant()
        await runtime.ensure(tenant)
        # Wait for the event, not for an empty table: a reaper pass to which the daemon says the
        # container is not running (or does not answer) forgets it without an event, and the
        # next pass takes a running one back and reaps it. Seen once under load: an empty table
        # and only `sandbox.started`.
        for _ in range(60):
            await asyncio.sleep(0.25)
            if "sandbox.stopped" in events.names(tenant):
                break
        assert runtime.list() == []
        assert events.names(tenant) == ["sandbox.started", "sandbox.stopped"]
        assert events.seen[-1][3] == {"reason": "idle"}
        assert managed(daemon, instance) == []
        await runtime.close()

    asyncio.run(scenario())


def test_crash_is_detected_and_replaced(daemon: Daemon, layout: Layout, instance: str) -> None:
    async def scenario() -> None:
        events = Events()
        runtime = await make_runtime(daemon, layout, instance, events)
        tenant = unique_tenant()
        await runtime.ensure(tenant)
        (old,) = runtime.list()
        client = daemon.client()
        client.containers.get(old.backend_id).kill()
        client.close()
        await runtime.mark_broken(tenant)
        assert old.state is SandboxState.FAILED
        assert "sandbox.failed" in events.names(tenant)
        await runtime.ensure(tenant)
        (new,) = runtime.list()
        assert new.backend_id != old.backend_id and new.state is SandboxState.RUNNING
        assert [c.id for c in managed(daemon, instance)] == [new.backend_id]
        await runtime.close()

    asyncio.run(scenario())


def test_restarted_broker_adopts_running_sandboxes(daemon: Daemon, layout: Layout, instance: str) -> None:
    async def scenario() -> None:
        tenant = unique_tenant()
        first = await make_runtime(daemon, layout, instance, Events())
        await first.ensure(tenant)
        (before,) = first.list()
        # The old broker dies without cleaning up: its containers keep running.
        await first.backend.close()

        events = Events()
        second = await make_runtime(daemon, layout, instance, events)
        (adopted,) = second.list()
        assert adopted.tenant == tenant and adopted.backend_id == before.backend_id
        assert await second.ensure(tenant) == before.endpoint
        assert events.seen == []  # nothing started, nothing stopped
        await second.close()
        assert managed(daemon, instance) == []

    asyncio.run(scenario())


def test_cap_reached_raises_capacity_error(daemon: Daemon, layout: Layout, instance: str) -> None:
    async def scenario() -> None:
        runtime = await make_runtime(daemon, layout, instance, Events(), max_sandboxes=1)
        await runtime.ensure(unique_tenant())
        with pytest.raises(CapacityError):
            await runtime.ensure(unique_tenant())
        assert len(managed(daemon, instance)) == 1
        await runtime.close()

    asyncio.run(scenario())


def test_close_removes_every_container(daemon: Daemon, layout: Layout, instance: str) -> None:
    async def scenario() -> None:
        events = Events()
        runtime = await make_runtime(daemon, layout, instance, events)
        tenants = [unique_tenant() for _ in range(3)]
        await asyncio.gather(*(runtime.ensure(t) for t in tenants))
        assert len(managed(daemon, instance)) == 3
        await runtime.close()
        assert managed(daemon, instance) == []
        assert sorted(t for e, t, _, _ in events.seen if e == "sandbox.stopped") == sorted(tenants)

    asyncio.run(scenario())
