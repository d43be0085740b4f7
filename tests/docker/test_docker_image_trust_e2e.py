"""The image check through the whole broker, on real daemons (issue 27 items 5 and 7).

A real broker process with release keys (DOCBROKER_IMAGE_TRUST_KEYS) and a build's records
(DOCBROKER_IMAGE_RECORDS), the warm pool on, a real MCP client. The image's name is swapped
to another image while the broker runs: the next tenant to need a sandbox gets a clear
refusal (no traceback, no hang), the audit log says `sandbox.failed` `image_untrusted`, and
nothing of that image runs; a statement signed by another key changes nothing. The digest is
in `sandbox.started` and in /readyz's authenticated details.
"""

from __future__ import annotations

import shutil
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from broker.testing import Broker, make_broker, structured
from tests.docker.conftest import SECCOMP, Daemon, remove_instance
from tests.docker.test_docker_broker_e2e import start_for_daemon
from tests.docker.test_docker_image_trust import Swap, swap  # noqa: F401 - the fixture
from tests.signed_images import Release

pytestmark = [pytest.mark.docker, pytest.mark.anyio]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def trusting_broker(daemon: Daemon, swap: Swap) -> Iterator[tuple[Broker, Path]]:  # noqa: F811
    # /var/tmp: a rootless daemon (another user) must reach the bind-mount sources.
    base = Path(tempfile.mkdtemp(prefix="docbroker-trust-", dir="/var/tmp"))
    instance = f"trust{uuid.uuid4().hex[:8]}"  # its own containers: other tests share the daemon
    release = Release(base / "keys")
    records = base / "images"
    release.sign(records, swap.real)  # what `docbroker image build` leaves for the real image
    env = {
        "DOCBROKER_DOCKER_HOST": daemon.host,
        "DOCBROKER_DOCKER_IMAGE": swap.tag,
        "DOCBROKER_DOCKER_SECCOMP_PROFILE": str(base / "policies" / SECCOMP.name),
        "DOCBROKER_DOCKER_POOL_SIZE": "1",
        "DOCBROKER_INSTANCE": instance,
        "DOCBROKER_IMAGE_TRUST_KEYS": str(release.public),
        "DOCBROKER_IMAGE_RECORDS": str(records),
    }
    broker = make_broker(base, runtime="docker", env=env)
    try:
        notes = "# Notes\nsigned images only\n"
        start_for_daemon(broker, daemon, base, {"acme": notes, "globex": notes})
        yield broker, records
    finally:
        broker.stop()
        remove_instance(daemon, instance)
        shutil.rmtree(base, ignore_errors=True)


async def search(broker: Broker, tenant: str) -> str:
    """The search's status, or the client's error in one line."""
    try:
        async with broker.client(broker.token(tenant, scope="docs:read")) as client:
            result = structured(await client.call_tool("search_documents", {"query": "signed"}))
    except Exception as exc:  # the SDK may wrap it in an ExceptionGroup
        while isinstance(exc, ExceptionGroup) and len(exc.exceptions) == 1:
            exc = exc.exceptions[0]
        return f"{type(exc).__name__}: {exc}"
    return str(result["status"])


def containers_of(daemon: Daemon, tenant: str) -> list[dict[str, Any]]:
    client = daemon.client()
    try:
        found = client.containers.list(all=True, filters={"name": f"-{tenant}"}, ignore_removed=True)
        return [c.attrs for c in found if c.name.endswith(f"-{tenant}") and "trust" in c.name]
    finally:
        client.close()


async def test_a_swapped_image_is_refused_audited_and_never_run(
    trusting_broker: tuple[Broker, Path],
    daemon: Daemon,
    swap: Swap,  # noqa: F811
) -> None:
    broker, records = trusting_broker
    assert await search(broker, "acme") == "ok"
    with broker.http() as http:
        ready = http.get("/readyz", headers=broker.ops_headers).json()
    sandboxes = ready["checks"]["sandboxes"]
    assert sandboxes["image_digest"] == swap.real and sandboxes["image_trust"]["state"] == "on"

    swap.point_at(swap.other)  # the attacker retags, the broker keeps running
    unsigned = await search(broker, "globex")
    Release(broker.data_dir.parent / "attacker", "attacker").sign(records, swap.other)
    forged = await search(broker, "globex")
    logs = broker.logs()

    refused = "MCPError: Tool sandbox unavailable, retry later"
    assert (unsigned, forged) == (refused, refused)
    events = broker.audit_events()
    [started] = [e for e in events if e["event"] == "sandbox.started"]
    assert (started["tenant"], started["image_digest"]) == ("acme", swap.real)
    failed = [e for e in events if e["event"] == "sandbox.failed"]
    assert failed and {(e["tenant"], e["reason"]) for e in failed} == {("globex", "image_untrusted")}
    assert containers_of(daemon, "globex") == []  # nothing of the swapped image ran for it
    [acme] = containers_of(daemon, "acme")
    assert acme["Image"] == swap.real
    assert "has no readable provenance" in logs and "not signed by a trusted key" in logs
    assert "Traceback" not in logs
