"""`docbroker sandbox replace TENANT` on Docker: found by labels, from another process.

The command builds a backend of its own (as another broker replica would be) and removes the
tenant's containers wherever they came from (started cold, or a warm one bound to the
tenant); other tenants' sandboxes and the warm spares of a running broker stay.
"""

from __future__ import annotations

import asyncio
import os

import pytest

from broker.runtime.docker import DockerBackend
from tests.docker.conftest import Daemon, Layout, unique_tenant, wait_ready
from tests.docker.test_docker_pool import connect_pooled, containers, instance, warm_again, warm_backend

pytestmark = pytest.mark.docker
__all__ = ["instance"]  # the fixture, shared with the pool tests


def test_replace_removes_only_that_tenants_sandboxes_by_labels(
    daemon: Daemon, layout: Layout, instance: str
) -> None:
    cold = layout.tenant(unique_tenant("cold"), {"notes.md": "cold\n"})
    bound = layout.tenant(unique_tenant("bound"), {"notes.md": "bound\n"})
    other = layout.tenant(unique_tenant("other"), {"notes.md": "other\n"})

    async def scenario() -> None:
        serving = await warm_backend(daemon, layout, instance)  # the running broker
        try:
            bound_info = await serving.create(bound.spec)  # from the warm pool
            await warm_again(serving)
            cold_backend = await DockerBackend.connect(daemon.settings(), instance=instance)
            cold_info = await cold_backend.create(cold.spec)  # started cold (no pool)
            other_info = await cold_backend.create(other.spec)
            for info in (bound_info, cold_info, other_info):
                await wait_ready(info)
            spares = {n for n in containers(daemon, instance) if ".pool-" in n}
            assert len(spares) == 1

            operator = await connect_pooled(daemon, layout, instance)  # `docbroker sandbox replace`
            try:
                assert await operator.remove_tenant(cold.spec.tenant, cold.spec.run_dir) == 1
                assert await operator.remove_tenant(bound.spec.tenant, bound.spec.run_dir) == 1
                assert await operator.remove_tenant(cold.spec.tenant, cold.spec.run_dir) == 0  # gone
            finally:
                await operator.close()

            assert not await serving.alive(bound_info) and not await cold_backend.alive(cold_info)
            assert await cold_backend.alive(other_info)
            assert {n for n in containers(daemon, instance) if ".pool-" in n} == spares
            for gone in (cold_info, bound_info):
                assert gone.endpoint is not None and gone.endpoint.uds is not None
                assert not os.path.exists(gone.endpoint.uds)  # no stale socket for the successor
            # the successor comes up where the broker looks for it
            again = await cold_backend.create(cold.spec)
            await wait_ready(again)
            assert again.backend_id != cold_info.backend_id
            await cold_backend.close()
        finally:
            await serving.close()

    asyncio.run(scenario())
