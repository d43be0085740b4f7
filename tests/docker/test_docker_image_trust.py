"""The sandbox image by digest, and vouched for, on real daemons (issue 27 items 5 and 7;
DESIGN §13).

The broker resolves the configured name to the image's id (`sha256:…`, the digest of its
config: its content) at every start and creates the container from that digest, never the
name; a warm container remembers the digest it was made from and is never bound after the
name has moved. With release keys configured, a digest without provenance signed by one of
them, naming that digest, starts nothing.

The attacker here moves the name: the tests' own temporary tag (never `docbroker-server:latest`,
which other tests on the same daemons use) first names the real server image, then a derived
one with a different id (`FROM` it plus a label: a "different image" that would still answer,
which is the dangerous kind). Decided: the swap is REFUSED at the next start, not quietly
ignored by keeping the first digest, because a legitimate new build under the same name must
be taken without a restart, and an operator must learn that the name now means something else
(sandbox.failed `image_untrusted` in the audit, the broker's log).
"""

from __future__ import annotations

import asyncio
import io
import json
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from broker.runtime.base import ImageUntrusted
from broker.runtime.docker import DockerBackend
from broker.runtime.imagetrust import ImageTrust
from broker.runtime.lifecycle import Runtime
from broker.settings import ImageSupplySettings
from broker.testing import make_broker
from broker.types import SandboxInfo
from tests.docker.conftest import (
    IMAGE,
    SECCOMP,
    Daemon,
    HostTenant,
    Layout,
    remove_instance,
    unique_tenant,
    wait_ready,
)
from tests.docker.test_docker_pool import containers, pool_dir, warm_backend
from tests.signed_images import Release

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


# --- with release keys: the image must be vouched for -----------------------------------------


@dataclass
class Signed:
    """The release's key, the records a build wrote (the real image signed), the check."""

    release: Release
    records: Path
    trust: ImageTrust


@pytest.fixture
def signed(layout: Layout, swap: Swap) -> Signed:
    release = Release(layout.root / "keys")
    records = layout.root / "images"
    release.sign(records, swap.real)
    trust = ImageTrust.from_settings(ImageSupplySettings(records_dir=records, trust_keys=(release.public,)))
    assert trust is not None
    return Signed(release, records, trust)


def tenant_containers(daemon: Daemon, instance: str) -> set[str]:
    """Names of the instance's containers bound to a tenant (not warm spares)."""
    return {name for name in containers(daemon, instance) if ".pool-" not in name}


def test_a_tag_swapped_while_the_broker_runs_is_refused_at_the_next_start(
    daemon: Daemon, layout: Layout, instance: str, swap: Swap, signed: Signed
) -> None:
    first, second = layout.tenant(unique_tenant("a")), layout.tenant(unique_tenant("b"))

    async def scenario() -> tuple[str, str, dict[str, Any]]:
        backend = await DockerBackend.connect(
            daemon.settings(image=swap.tag, pool_size=0), instance=instance, trust=signed.trust
        )
        try:
            info = await backend.create(first.spec)
            swap.point_at(swap.other)  # while the broker runs
            with pytest.raises(ImageUntrusted) as caught:
                await backend.create(second.spec)
            return info.backend_id, str(caught.value), backend.describe()
        finally:
            await backend.close()

    container, refused, described = asyncio.run(scenario())
    assert image_of(daemon, container)[0] == swap.real
    assert (
        refused == f"the sandbox image {swap.other} has no readable provenance in DOCBROKER_IMAGE_RECORDS "
        "(not built and signed by `docbroker image build`?)"
    )
    assert tenant_containers(daemon, instance) == {f"docbroker-{instance}-{first.spec.tenant}"}  # none for b
    assert described["image_digest"] == swap.real  # what sandboxes are made from: never the refused one
    assert described["image_trust"]["state"] == "on"


def test_a_provenance_signed_by_another_key_is_refused(
    daemon: Daemon, layout: Layout, instance: str, swap: Swap, signed: Signed
) -> None:
    Release(layout.root / "attacker", "attacker").sign(signed.records, swap.other)
    swap.point_at(swap.other)

    async def scenario() -> str:
        with pytest.raises(ImageUntrusted) as caught:  # refused before the broker would serve
            await DockerBackend.connect(
                daemon.settings(image=swap.tag), instance=instance, trust=signed.trust
            )
        return str(caught.value)

    assert (
        asyncio.run(scenario())
        == f"the sandbox image {swap.other}: provenance is not signed by a trusted key"
    )
    assert containers(daemon, instance) == {}


def test_an_unsigned_image_is_refused(
    daemon: Daemon, layout: Layout, instance: str, swap: Swap, signed: Signed
) -> None:
    """The real image, by its own name, without a record: nothing vouches for it."""
    (signed.records / f"{swap.real.removeprefix('sha256:')}.provenance.dsse.json").unlink()

    async def scenario() -> None:
        await DockerBackend.connect(daemon.settings(image=swap.tag), instance=instance, trust=signed.trust)

    with pytest.raises(ImageUntrusted, match="has no readable provenance"):
        asyncio.run(scenario())
    assert containers(daemon, instance) == {}


def test_with_trust_a_warm_sandbox_from_before_a_swap_is_never_handed_out(
    daemon: Daemon, layout: Layout, instance: str, swap: Swap, signed: Signed
) -> None:
    tenant = layout.tenant(unique_tenant())

    async def scenario() -> tuple[list[str], set[str]]:
        backend = await DockerBackend.connect(
            daemon.settings(image=swap.tag), instance=instance, pool_dir=pool_dir(layout), trust=signed.trust
        )
        try:
            await backend.start()
            await wait_warm(backend)
            swap.point_at(swap.other)
            with pytest.raises(ImageUntrusted):
                await backend.create(tenant.spec)
            return list(containers(daemon, instance)), tenant_containers(daemon, instance)
        finally:
            await backend.close()

    names, bound = asyncio.run(scenario())
    assert bound == set()  # the tenant got nothing: not the warm one, not a new one
    assert len(names) == 1 and ".pool-" in names[0]  # the warm one is still nobody's


async def wait_warm(backend: DockerBackend) -> None:
    for _ in range(600):
        if backend.describe()["pool"]["ready"]:
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"no warm sandbox after 30 s: {backend.describe()['pool']}")


def test_doctor_names_the_digest_and_says_whether_trust_is_on(
    daemon: Daemon, layout: Layout, swap: Swap, signed: Signed
) -> None:
    base = make_broker(
        layout.root / "doctor",
        runtime="docker",
        env={
            "DOCBROKER_DOCKER_HOST": daemon.host,
            "DOCBROKER_DOCKER_IMAGE": swap.tag,
            "DOCBROKER_DOCKER_SECCOMP_PROFILE": str(SECCOMP),
            "DOCBROKER_DOCKER_POOL_SIZE": "0",
            "DOCBROKER_IMAGE_RECORDS": str(signed.records),
        },
    ).env

    def doctor(**env: str) -> dict[str, tuple[str, str]]:
        done = subprocess.run(
            [sys.executable, "-m", "broker", "doctor", "--json"],
            capture_output=True,
            text=True,
            timeout=120,
            env={**base, **env},
        )
        assert "Traceback" not in done.stdout + done.stderr
        return {row["check"]: (row["level"], row["detail"]) for row in json.loads(done.stdout)["checks"]}

    off = doctor()["sandbox image"]
    assert off[0] == "WARN" and swap.real in off[1] and "image trust OFF" in off[1]
    on = doctor(DOCBROKER_IMAGE_TRUST_KEYS=str(signed.release.public))
    assert on["sandbox image"][0] == "OK" and swap.real in on["sandbox image"][1]
    assert "provenance verified" in on["sandbox image"][1]
    swap.point_at(swap.other)
    swapped = doctor(DOCBROKER_IMAGE_TRUST_KEYS=str(signed.release.public))
    assert (
        swapped["sandbox runtime"][0] == "FAIL"
        and "has no readable provenance" in swapped["sandbox runtime"][1]
    )
    assert swapped["sandbox image"][0] == "FAIL"


# --- issue 34 item 12: a running sandbox is checked again before it is adopted -----------------


@dataclass
class Leak:
    """The documented key-leak procedure, half done: the image built and signed with the
    leaked key runs; the new key signed a rebuild, and the broker now trusts only that key."""

    leaked: ImageTrust  # what the broker trusted before
    current: ImageTrust  # what it trusts now


@pytest.fixture
def leak(layout: Layout, swap: Swap) -> Leak:
    records = layout.root / "images"
    leaked, new = Release(layout.root / "keys", "leaked"), Release(layout.root / "keys", "new")
    leaked.sign(records, swap.real)
    new.sign(records, swap.other)  # the rebuild: another image, signed with the new key only

    def trusting(release: Release) -> ImageTrust:
        trust = ImageTrust.from_settings(
            ImageSupplySettings(records_dir=records, trust_keys=(release.public,))
        )
        assert trust is not None
        return trust

    return Leak(trusting(leaked), trusting(new))


Events = list[tuple[str, str, dict[str, Any]]]


async def connected(daemon: Daemon, instance: str, swap: Swap, trust: ImageTrust) -> DockerBackend:
    return await DockerBackend.connect(
        daemon.settings(image=swap.tag, pool_size=0), instance=instance, trust=trust
    )


async def started_by(daemon: Daemon, instance: str, swap: Swap, trust: ImageTrust, tenant: HostTenant) -> str:
    """The tenant's sandbox as a broker trusting `trust` starts it (this one before a restart,
    or a peer), running and ready: its container id."""
    backend = await connected(daemon, instance, swap, trust)
    try:
        info = await backend.create(tenant.spec)
        await wait_ready(info)
        return info.backend_id
    finally:
        await backend.close()


def runtime_on(backend: DockerBackend, tenant: HostTenant, events: Events) -> Runtime:
    async def record(event: str, name: str, sandbox: str, details: dict[str, Any]) -> None:
        events.append((event, name, details))

    return Runtime(
        backend, lambda _: tenant.spec, max_sandboxes=5, idle_timeout=300, start_timeout=30, on_event=record
    )


async def serve(
    runtime: Runtime, daemon: Daemon, instance: str, tenant: HostTenant, untrusted: str
) -> SandboxInfo:
    """The tenant's next call: its sandbox, once the untrusted container is gone."""
    await runtime.ensure(tenant.spec.tenant)
    info = runtime.get(tenant.spec.tenant)
    assert info is not None
    assert untrusted not in {a["Id"] for a in containers(daemon, instance).values()}
    return info


def removed_untrusted(events: Events, tenant: HostTenant, digest: str) -> None:
    """One stop, audited `image_untrusted` with the digest it ran (the shutdown's aside)."""
    found = [e for e in events if e[0] == "sandbox.stopped" and e[2]["reason"] != "shutdown"]
    assert found == [
        ("sandbox.stopped", tenant.spec.tenant, {"reason": "image_untrusted", "image_digest": digest})
    ]


def test_a_sandbox_from_a_withdrawn_key_is_removed_at_start_up_not_adopted(
    daemon: Daemon, layout: Layout, instance: str, swap: Swap, leak: Leak
) -> None:
    """A broker restarted with only the new key meets the sandbox it (or a peer) started from
    the leaked key's image: removed, audited, and the tenant's next call gets the rebuild."""
    tenant = layout.tenant(unique_tenant())
    events: Events = []

    async def scenario() -> tuple[SandboxInfo | None, str]:
        old = await started_by(daemon, instance, swap, leak.leaked, tenant)
        swap.point_at(swap.other)  # the rebuild, under the same name
        runtime = runtime_on(await connected(daemon, instance, swap, leak.current), tenant, events)
        await runtime.start()
        try:
            adopted = runtime.get(tenant.spec.tenant)
            info = await serve(runtime, daemon, instance, tenant, old)
            return adopted, image_of(daemon, info.backend_id)[0]  # before close stops it
        finally:
            await runtime.close()

    adopted, runs = asyncio.run(scenario())
    assert adopted is None  # not served on
    removed_untrusted(events, tenant, swap.real)
    assert runs == swap.other


def test_a_peers_sandbox_from_a_withdrawn_key_is_not_taken_over_at_a_start(
    daemon: Daemon, layout: Layout, instance: str, swap: Swap, leak: Leak
) -> None:
    """A replica still on the old keys started the tenant's sandbox after this one came up;
    this replica's first call for the tenant finds it running (the daemon's name conflict) and
    would share it: removed instead, and this replica starts its own from the rebuild."""
    tenant = layout.tenant(unique_tenant())
    events: Events = []

    async def scenario() -> tuple[str, SandboxInfo, str]:
        swap.point_at(swap.other)
        runtime = runtime_on(await connected(daemon, instance, swap, leak.current), tenant, events)
        await runtime.start()
        try:
            swap.point_at(swap.real)  # the peer resolves the name as it was, with its old key
            theirs = await started_by(daemon, instance, swap, leak.leaked, tenant)
            swap.point_at(swap.other)
            info = await serve(runtime, daemon, instance, tenant, theirs)
            return theirs, info, image_of(daemon, info.backend_id)[0]
        finally:
            await runtime.close()

    theirs, mine, runs = asyncio.run(scenario())
    assert mine.backend_id != theirs and not mine.details.get("adopted")
    assert runs == swap.other
    removed_untrusted(events, tenant, swap.real)
