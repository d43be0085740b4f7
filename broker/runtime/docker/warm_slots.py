"""The Docker side of the warm pool (broker/runtime/warm_pool.py keeps the slots): its
`start` and `remove` callbacks, and the bind of a slot to a tenant. Tenant-less sandboxes are
started ahead, each bound to a tenant on demand, then renamed to the tenant's name.

It reaches the daemon only through the backend's public seam (`ContainerSeam`: create, rename,
remove, is it running), so the backend imports this module and never the other way round.

A warm sandbox's name carries a per-process tag: `discover()` removes an earlier broker's
spares, not this one's, and a live peer replica's spares stay its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol, TypeVar

import docker.errors

from broker.runtime.base import SandboxStartError
from broker.runtime.docker.hardening import RUN_DIR, Mounts
from broker.runtime.readiness import wait_ready
from broker.runtime.warm_pool import Slot
from broker.settings import DockerSettings
from broker.types import Endpoint, SandboxInfo, SandboxSpec, SandboxState
from server import landlock
from server.binding import send_binding

_T = TypeVar("_T")

SOCKET_NAME = "mcp.sock"
BIND_SOCKET_NAME = "bind.sock"
POOL_NAME_TAG = ".pool-"  # a dot: no tenant id (a DNS label) can make a name like it
BIND_TIMEOUT_SECONDS = 5.0
WARM_START_TIMEOUT_SECONDS = 60.0  # generous: a warm start is in the background, on a busy host
# Refills wait until no tenant took a spare for this long: the tenants just bound are making
# their first calls (answered in ~0.1 s alone, ~1 s for twenty at once on two cores), and a
# spare's start would take its CPU from them. A tenant that finds no spare starts one at once.
REFILL_PAUSE_SECONDS = 1.0
LABEL_POOL = "io.docbroker.pool"  # started tenant-less; its tenant is in its name once bound
LABEL_SOCKET = "io.docbroker.socket"


class NameTaken(Exception):
    """Another replica's container got the tenant's name first."""


class ContainerSeam(Protocol):
    """What the warm slots need of the Docker backend (DockerBackend is one). The container
    calls block: they run through `blocking`, on the backend's own threads."""

    @property
    def name_prefix(self) -> str: ...

    def container_name(self, tenant: str) -> str: ...

    async def image(self) -> str: ...

    async def blocking(self, fn: Callable[..., _T], *args: Any) -> _T: ...

    def hardened_options(
        self, name: str, *, image: str, labels: dict[str, str], environment: dict[str, str], mounts: Mounts
    ) -> dict[str, Any]: ...

    def start_container(self, options: dict[str, Any]) -> str: ...

    def rename_container(self, container: str, name: str) -> None: ...

    def remove_container(self, container: str) -> None: ...

    def is_running(self, container: str) -> bool: ...


class WarmSlots:
    """Starts, binds and removes the Docker containers of warm slots, for one backend."""

    def __init__(self, backend: ContainerSeam, pool_dir: Path | None) -> None:
        self._backend = backend
        self._pool_dir = pool_dir
        self.tag = f"{POOL_NAME_TAG}{secrets.token_hex(3)}-"

    async def start(self) -> Slot:
        """Start one tenant-less sandbox and wait until it is warm (its binding socket listens)."""
        assert self._pool_dir is not None
        token = secrets.token_hex(6)
        run_dir = self._pool_dir / token
        slot = Slot(
            sandbox_id="",
            run_dir=str(run_dir),
            bind_socket=str(run_dir / BIND_SOCKET_NAME),
            mcp_socket=str(run_dir / SOCKET_NAME),
        )
        name = f"{self._backend.name_prefix}{self.tag}{token}"
        endpoint = Endpoint(url="http://localhost/mcp", uds=slot.bind_socket)

        async def alive() -> bool:
            return await self._backend.blocking(self._backend.is_running, name)

        try:
            # Vouched for and pinned like a cold start's: a warm sandbox runs the image too.
            slot.image = await self._backend.image()
            slot.sandbox_id = await self._backend.blocking(self._create, slot, name)
            if not await wait_ready(endpoint, WARM_START_TIMEOUT_SECONDS, alive):
                raise SandboxStartError("a warm sandbox did not become ready")
        except BaseException:
            # Failed, or cancelled by a shutdown: remove what was made (by name: the create may
            # have failed before the daemon gave it an id). Nothing is left.
            await asyncio.shield(self._backend.blocking(self.remove_now, name, slot.run_dir))
            raise
        return slot

    async def remove(self, slot: Slot) -> None:
        await self._backend.blocking(self.remove_now, slot.sandbox_id, slot.run_dir)

    def remove_now(self, container: str, run_dir: str) -> None:
        if container:
            self._backend.remove_container(container)
        self.remove_dir(run_dir)

    def _create(self, slot: Slot, name: str) -> str:
        assert self._pool_dir is not None
        self._pool_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.mkdir(slot.run_dir)
        os.chmod(slot.run_dir, 0o1777)  # noqa: S103 - as a tenant's run dir: the sandbox's (sub-)uid binds here
        options = self._backend.hardened_options(
            name,
            image=slot.image,
            labels={LABEL_POOL: "true", LABEL_SOCKET: slot.mcp_socket},
            environment={},
            mounts=[(RUN_DIR, slot.run_dir, False)],
        )
        options["command"] = ["--bind", f"{RUN_DIR}/{BIND_SOCKET_NAME}"]
        try:
            return self._backend.start_container(options)
        except docker.errors.DockerException as exc:  # the caller removes what was made
            raise SandboxStartError("the Docker daemon could not start a warm sandbox") from exc

    def bind(self, slot: Slot, spec: SandboxSpec) -> SandboxInfo:
        """Give a warm sandbox its tenant: the folders as descriptors, then the tenant's name."""
        started = time.monotonic()
        send_binding(
            slot.bind_socket,
            tenant=spec.tenant,
            sources_dir=spec.sources_dir,
            dropbox_dir=spec.dropbox_dir,
            secret_file=spec.secret_file,
            timeout=BIND_TIMEOUT_SECONDS,
        )
        remove_stale_socket(slot.bind_socket)
        name = self._backend.container_name(spec.tenant)
        try:
            # The name is how a restarted broker knows the tenant (labels cannot change), and
            # what replicas agree on: the daemon gives it to one container only.
            self._backend.rename_container(slot.sandbox_id, name)
        except docker.errors.APIError as exc:
            if getattr(exc, "status_code", None) == 409:
                raise NameTaken from exc
            raise SandboxStartError("the Docker daemon could not rename a warm sandbox") from exc
        return SandboxInfo(
            tenant=spec.tenant,
            state=SandboxState.STARTING,
            endpoint=Endpoint(url="http://localhost/mcp", uds=slot.mcp_socket),
            backend_id=slot.sandbox_id,
            started_at=started,
            last_used=started,
            details={"container": slot.sandbox_id[:12], "image_digest": slot.image},
        )

    def remove_dir(self, run_dir: str) -> None:
        """A warm slot's run dir goes with its sandbox; a tenant's own run dir stays."""
        if self._pool_dir is not None and Path(run_dir).parent == self._pool_dir:
            shutil.rmtree(run_dir, ignore_errors=True)


def remove_stale_socket(path: str) -> None:
    # The sandbox cannot unlink (seccomp), so a socket left by a previous container would make
    # the next bind fail: the broker, owner of the run dir, removes it.
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)


def pool_off_reason(settings: DockerSettings, pool_dir: Path | None) -> str | None:
    """Why the warm pool cannot run here, if it cannot; containers share the host's kernel."""
    if pool_dir is None or settings.pool_size == 0:
        return None
    abi = landlock.abi_version()
    if abi < landlock.MIN_ABI:
        return f"the kernel offers Landlock ABI {abi} (at least {landlock.MIN_ABI} needed)"
    return None
