"""The sandbox image by digest, on real daemons (issue 27 items 5 and 7; DESIGN §13).

The broker resolves the configured name to the image's id (`sha256:…`, the digest of its
config: its content) at every start and creates the container from that digest, never the
name; a warm container remembers the digest it was made from and is never bound after the
name has moved. The attacker here moves the name: the tests' own temporary tag (never
`docbroker-server:latest`, which other tests on the same daemons use) first names the real
server image, then a derived one with a different id (`FROM` it plus a label: a "different
image" that would still answer, which is the dangerous kind).
"""

from __future__ import annotations

import asyncio
import io
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from broker.runtime.docker import DockerBackend
from tests.docker.conftest import IMAGE, Daemon, Layout, remove_instance, unique_tenant
from tests.docker.test_docker_pool import containers, warm_backend

pytestmark = pytest.mark.docker

REPO = "docbroker-server"


@dataclass
class Swap:
    """A tag of the test's own, and two images it can be pointed at."""

    daemon: Daemon
    tag: str  # "docbroker-server:pin-…"
    real: str  # the server image's id
    other: str  # a derived image's id (same content plus a label: another digest)

    def point_at(self, image_id: str) -> None:
        client = self.daemon.client()
        try:
            client.images.get(image_id).tag(REPO, self.tag.partition(":")[2])
        finally:
            client.close()


@pytest.fixture
def swap(daemon: Daemon) -> Iterator[Swap]:
    client = daemon.client()
    suffix = uuid.uuid4().hex[:10]
    tag, other_tag = f"{REPO}:pin-{suffix}", f"{REPO}:other-{suffix}"
    real = client.images.get(IMAGE)
    dockerfile = f"FROM {real.id}\nLABEL io.docbroker.test.swap={suffix}\n".encode()
    # Built from the image already there: nothing is pulled, one metadata layer, a second or so.
    other, _ = client.images.build(fileobj=io.BytesIO(dockerfile), tag=other_tag, pull=False, rm=True)
    assert other.id != real.id
    real.tag(REPO, tag.partition(":")[2])
    client.close()
    yield Swap(daemon, tag, str(real.id), str(other.id))
    client = daemon.client()
    try:
        for name in (tag, other_tag):
            client.images.remove(name, noprune=False)
    finally:
        client.close()


@pytest.fixture
def instance(daemon: Daemon, swap: Swap) -> Iterator[str]:
    """The deployment's containers, removed before the images they run (hence `swap`)."""
    name = f"pin{uuid.uuid4().hex[:8]}"
    yield name
    remove_instance(daemon, name)


def image_of(daemon: Daemon, container_id: str) -> tuple[str, str]:
    """(the image the container runs, the image it was asked for) as the daemon records them."""
    client = daemon.client()
    try:
        attrs: dict[str, Any] = client.containers.get(container_id).attrs
        return attrs["Image"], attrs["Config"]["Image"]
    finally:
        client.close()


def test_a_sandbox_is_created_from_the_digest_and_the_digest_is_reported(
    daemon: Daemon, layout: Layout, instance: str, swap: Swap
) -> None:
    async def scenario() -> tuple[dict[str, Any], dict[str, Any]]:
        backend = await DockerBackend.connect(daemon.settings(image=swap.tag), instance=instance)
        try:
            described = backend.describe()
            info = await backend.create(layout.tenant(unique_tenant()).spec)
            await backend.delete(info)
            return described, info.details
        finally:
            await backend.close()

    described, details = asyncio.run(scenario())
    assert described["image"] == swap.tag
    assert described["image_digest"] == swap.real
    assert described["image_trust"]["state"] == "off"  # no keys: said, not hidden
    assert details["image_digest"] == swap.real


def test_the_container_names_the_digest_not_the_tag(
    daemon: Daemon, layout: Layout, instance: str, swap: Swap
) -> None:
    """Created from `sha256:…`: a tag moved between the broker's look and the daemon's create
    cannot change what runs (the daemon's record of what was asked for shows it)."""

    async def scenario() -> str:
        backend = await DockerBackend.connect(daemon.settings(image=swap.tag), instance=instance)
        try:
            info = await backend.create(layout.tenant(unique_tenant()).spec)
            return info.backend_id
        finally:
            await backend.close()

    container = asyncio.run(scenario())
    runs, asked = image_of(daemon, container)
    assert runs == swap.real
    assert asked == swap.real  # not swap.tag


def test_a_warm_sandbox_from_before_a_swap_is_never_handed_out(
    daemon: Daemon, layout: Layout, instance: str, swap: Swap
) -> None:
    """Warmed from the real image; the name then moves. The tenant's first call must not get
    the warm container (made from the old digest): it is removed, and the tenant's sandbox is
    made from what the name means now. (With trust on, that new digest is then refused:
    test_docker_image_trust.py.)"""
    tenant = layout.tenant(unique_tenant())

    async def scenario() -> tuple[str, str, set[str], dict[str, Any]]:
        backend = await warm_backend(daemon, layout, instance, image=swap.tag)
        try:
            [warm_id] = [a["Id"] for a in containers(daemon, instance).values()]
            assert image_of(daemon, warm_id)[0] == swap.real
            swap.point_at(swap.other)
            info = await backend.create(tenant.spec)
            left = {a["Id"] for a in containers(daemon, instance).values()}
            return warm_id, info.backend_id, left, info.details
        finally:
            await backend.close()

    warm_id, tenant_container, left, details = asyncio.run(scenario())
    assert tenant_container != warm_id
    assert warm_id not in left  # removed, not kept for someone else
    assert image_of(daemon, tenant_container)[0] == swap.other
    assert details["image_digest"] == swap.other
