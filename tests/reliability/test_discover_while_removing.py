"""The Docker backend's view of the engine holds while containers go away under it (found by the
reliability run, issue 25).

Seen in the run right after the daemon restart: the reaper's pass listed the instance's
containers while a peer replica removed one, the SDK's per-container look-up got 404, and the
whole pass failed ("reaper pass failed", with a traceback in the log). docker-py lists ids
first and inspects each after, so any removal between the two broke `discover` (the reaper,
start-up adoption) and `sandboxes`.

Here, against the rootless daemon the Docker tests use: containers of one instance (created,
never started) are removed from threads while the backend discovers them, again and again;
every pass must succeed and see only containers of the instance.
"""

from __future__ import annotations

import asyncio
import secrets
import threading
from concurrent.futures import ThreadPoolExecutor

import docker
import docker.errors
import pytest

from broker.runtime.docker import DockerBackend
from broker.runtime.docker.backend import LABEL_INSTANCE, LABEL_MANAGED, LABEL_TENANT
from broker.settings import DockerSettings
from tests.docker.conftest import IMAGE, SECCOMP
from tests.reliability.test_docker_reliability import source_host

pytestmark = [pytest.mark.docker, pytest.mark.reliability, pytest.mark.timeout(300)]

CONTAINERS = 40
ROUNDS = 3


def test_discover_survives_containers_removed_while_it_lists() -> None:
    host = source_host()
    instance = f"gone{secrets.token_hex(3)}"
    client = docker.DockerClient(base_url=host, timeout=60)
    settings = DockerSettings(base_url=host, image=IMAGE, seccomp_profile=SECCOMP)
    backend = asyncio.run(DockerBackend.connect(settings, instance=instance))
    labels = {LABEL_MANAGED: "true", LABEL_INSTANCE: instance}
    try:
        for _ in range(ROUNDS):
            made = [
                client.containers.create(IMAGE, labels={**labels, LABEL_TENANT: f"t{i}"}, network_mode="none")
                for i in range(CONTAINERS)
            ]
            passes = 0
            removing = threading.Event()

            with ThreadPoolExecutor(CONTAINERS) as pool:
                done = [pool.submit(_remove, c, removing) for c in made]
                removing.set()
                while not all(f.done() for f in done):
                    seen = asyncio.run(_discover_and_list(backend))
                    assert seen <= {f"t{i}" for i in range(CONTAINERS)}
                    passes += 1
                for future in done:
                    future.result()
            assert passes > 0
            assert asyncio.run(_discover_and_list(backend)) == set()
    finally:
        for container in client.containers.list(
            all=True, filters={"label": f"{LABEL_INSTANCE}={instance}"}, ignore_removed=True
        ):
            container.remove(force=True)
        client.close()
        asyncio.run(backend.close())


def _remove(container: docker.models.containers.Container, go: threading.Event) -> None:
    go.wait()  # all at once, while the backend walks the list
    container.remove(force=True)


async def _discover_and_list(backend: DockerBackend) -> set[str]:
    """Both ways the backend walks the engine's containers: discover() and sandboxes()."""
    found = {info.tenant for info in await backend.discover()}
    found |= {info.tenant for info in await backend.sandboxes()}
    return {t for t in found if t}
