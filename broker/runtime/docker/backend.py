# Over 450 lines: one class, the Docker backend: the containers' lifecycle on one daemon.
"""The Docker backend's lifecycle: connect and check the daemon, create (cold, or bind a warm
slot), adopt another replica's container, discover, remove. The security options are in
hardening.py, the warm slots in warm_slots.py (which reach the daemon only through this
backend's public container seam); the reasons for both in the package docstring.

    backend = await DockerBackend.connect(settings.runtime.docker)
    runtime = Runtime(backend, tenants.provision, ...)

Every blocking SDK call runs on this backend's own bounded pool of threads, never the event
loop's default executor (a handful of threads, sized by CPU count, that everything else in the
broker shares): a daemon that hangs holds Docker's calls, not every `to_thread` in the process.
Each call is bounded by DockerSettings.api_timeout_seconds (docker-py's default is 60 s), and a
daemon that does not answer in time is DaemonUnavailable, one line. Past 400 lines: one class,
the SandboxBackend and the blocking helpers of its container lifecycle, kept together.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import os
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import docker
import docker.errors
import requests.exceptions

from broker.runtime.base import (
    BackendRefused,
    ImageCheck,
    ImageUntrusted,
    NoImageTrust,
    SandboxBackend,
    SandboxStartError,
)
from broker.runtime.daemon import DaemonFacts, daemon_facts
from broker.runtime.docker import hardening
from broker.runtime.docker.hardening import SANDBOX_GID, load_seccomp_profile
from broker.runtime.docker.warm_slots import (
    LABEL_POOL,
    LABEL_SOCKET,
    REFILL_PAUSE_SECONDS,
    WARM_START_TIMEOUT_SECONDS,
    NameTaken,
    WarmSlots,
    pool_off_reason,
    remove_stale_socket,
)
from broker.runtime.host_replicas import Replicas
from broker.runtime.warm_pool import WarmPool
from broker.runtime.warm_pool_sizer import PoolSizer
from broker.settings import DockerSettings
from broker.threads import in_pool_to_the_end
from broker.types import DaemonMode, Endpoint, SandboxInfo, SandboxSpec, SandboxState, TenantId
from server.binding import BindingError
from server.contracts import TENANT_RE

log = logging.getLogger("docbroker.runtime.docker")
_T = TypeVar("_T")
WINNER_WAIT_SECONDS = 10.0  # for a peer's container still being started ("created")
# Threads of the backend's own pool, as many as the client keeps connections to the daemon:
# twenty tenants starting at once do not queue behind each other or behind the broker's files.
WORKERS = 32

LABEL_MANAGED = "io.docbroker.managed"
LABEL_TENANT = "io.docbroker.tenant"
LABEL_INSTANCE = "io.docbroker.instance"
LABEL_REPLICA = "io.docbroker.replica"  # the replica that started it
DIGEST_RE = re.compile(r"sha256:[0-9a-f]{64}")


class DaemonUnavailable(BackendRefused):
    reason = "sandbox_daemon_unavailable"


class ImageMissing(BackendRefused):
    reason = "sandbox_image_missing"


class DockerBackend(SandboxBackend):
    name = "docker"

    def __init__(
        self,
        settings: DockerSettings,
        client: Any,
        facts: DaemonFacts,
        *,
        seccomp_json: str,
        instance: str = "default",
        pool_dir: Path | None = None,
        replicas: Replicas | None = None,
        threads: concurrent.futures.ThreadPoolExecutor | None = None,
        trust: ImageCheck | None = None,
        image_digest: str = "",
        pool_idle_seconds: float = 600.0,
    ) -> None:
        """Use `connect()`: it talks to the daemon (blocking) and applies the refusals.

        `pool_dir` (host folder for the warm slots' run dirs) turns the warm pool on, with
        `settings.pool_size` to `settings.pool_max` slots, back at the floor after
        `pool_idle_seconds` without a new tenant (the broker's idle timeout); without it every
        sandbox starts cold. `threads`: the pool `connect()` talked to the daemon on, kept for
        every later call. `trust` vouches for the image's digest before any sandbox is made
        from it (none: trust off, reported).
        """
        self._settings = settings
        self._client = client
        self._threads = threads or _thread_pool()
        self._facts = facts
        self._seccomp = seccomp_json
        self._trust: ImageCheck = trust or NoImageTrust()
        self._digest = image_digest  # the digest sandboxes were last made from, vouched for (describe)
        self._resolving: asyncio.Future[str] | None = None  # image(): the resolution in flight
        self._instance = instance
        self._pool_dir = pool_dir
        self.replicas = replicas or Replicas(None, "local")
        self._slots = WarmSlots(self, pool_dir)
        pooled = pool_dir is not None and settings.pool_size > 0
        sizer = PoolSizer(
            floor=settings.pool_size if pooled else 0,
            cap=max(settings.pool_size, settings.pool_max) if pooled else 0,
            idle_seconds=pool_idle_seconds,
            clock=time.monotonic,
        )
        self._pool = WarmPool(
            sizer=sizer,
            start=self._slots.start,
            remove=self._slots.remove,
            off_reason=pool_off_reason(settings, pool_dir),
            refills_at_once=os.cpu_count() or 1,
            refill_pause=REFILL_PAUSE_SECONDS,
        )

    @classmethod
    async def connect(
        cls,
        settings: DockerSettings,
        *,
        instance: str = "default",
        pool_dir: Path | None = None,
        replicas: Replicas | None = None,
        trust: ImageCheck | None = None,
        pool_idle_seconds: float = 600.0,
    ) -> DockerBackend:
        """Connect, learn the daemon's mode, and refuse what the settings do not accept.

        Raises DaemonUnavailable (no daemon), BackendRefused (rootful daemon while rootless
        is required; no seccomp; bad profile), ImageMissing or ImageUntrusted (the image's
        digest is not vouched for by `trust`).
        """
        seccomp_json = load_seccomp_profile(settings.seccomp_profile)
        threads = _thread_pool()
        try:
            client, facts = await _in_pool(
                threads, _open_client, settings.base_url, settings.api_timeout_seconds
            )
        except BaseException:
            threads.shutdown(wait=False, cancel_futures=True)
            raise
        try:
            if settings.require_rootless and facts.mode is not DaemonMode.ROOTLESS:
                raise BackendRefused(
                    f"the Docker daemon is {facts.mode.value}, and DOCBROKER_DOCKER_REQUIRE_ROOTLESS is set"
                )
            if not facts.seccomp:
                raise BackendRefused("the Docker daemon has no seccomp: sandboxes would run unfiltered")
            if facts.mode is DaemonMode.ROOTFUL and not hardening.in_sandbox_group():
                raise BackendRefused(
                    f"on a rootful Docker daemon the broker must run as root or in group {SANDBOX_GID}: "
                    "it reads reports and reaches the sandbox's socket through that group"
                )
            digest = await _in_pool(threads, _resolve_image, client, settings.image)
            await _in_pool(threads, (trust or NoImageTrust()).check, digest)
        except BaseException:
            threads.shutdown(wait=False, cancel_futures=True)
            client.close()
            raise
        if trust is None:
            log.warning("image trust is off: sandboxes run whatever the image name resolves to")
        if not facts.limits_enforced:
            log.warning(
                "the Docker daemon does not enforce sandbox limits",
                extra={"mode": facts.mode.value, "cgroup_driver": facts.cgroup_driver},
            )
        return cls(
            settings,
            client,
            facts,
            seccomp_json=seccomp_json,
            instance=instance,
            pool_dir=pool_dir,
            replicas=replicas,
            threads=threads,
            trust=trust,
            image_digest=digest,
            pool_idle_seconds=pool_idle_seconds,
        )

    async def image(self) -> str:
        """The configured image's digest now, vouched for: what the next sandbox is made from.

        Resolved at every start, cold or warm (one inspect call to the daemon, a few ms), and
        the container is then created from the digest, never the name: a tag moved after this
        cannot change what runs, and a new signed build under the same name is taken without
        a restart. Raises ImageMissing, or ImageUntrusted when the digest is not vouched for
        (a tag swapped to another image while the broker runs is refused here).

        Callers at once share the resolution in flight: a burst of twenty first calls asks
        the daemon (and checks the provenance) once, not twenty times on a CPU they all need.
        A caller joining it gets the digest of a moment a few ms before its call: the same
        race as a tag moved just after the inspect, which the digest pinning covers.
        """
        if self._resolving is None:
            resolving = asyncio.ensure_future(self._resolve_image())
            self._resolving = resolving
            resolving.add_done_callback(self._resolved)
        # Shielded: one caller giving up does not cancel the others' resolution.
        return await asyncio.shield(self._resolving)

    async def _resolve_image(self) -> str:
        digest = await self.blocking(_resolve_image, self._client, self._settings.image)
        await self.blocking(self._trust.check, digest)
        self._digest = digest  # reported (describe): the digest sandboxes are now made from
        return digest

    def _resolved(self, resolving: asyncio.Future[str]) -> None:
        self._resolving = None  # the next caller asks the daemon again
        if not resolving.cancelled():
            resolving.exception()  # retrieved: every caller may have given up meanwhile

    async def blocking(self, fn: Callable[..., _T], *args: Any) -> _T:
        """`fn` (SDK calls, this backend's and its warm slots') on this backend's threads. A
        cancelled caller still waits for it: a container made after the caller's clean-up
        would run unknown to the lifecycle. The wait is bounded: each SDK call times out."""
        return await _in_pool(self._threads, fn, *args)

    # -- SandboxBackend ---------------------------------------------------------------------

    def mode(self) -> DaemonMode:
        return self._facts.mode

    @property
    def sandbox_user(self) -> str:
        return hardening.sandbox_user(self._facts.mode)

    def describe(self) -> dict[str, Any]:
        return {
            "backend": self.name,
            **self._facts.as_dict(),
            "image": self._settings.image,
            "image_digest": self._digest,
            "image_trust": self._trust.describe(),
            "pool": self._pool.describe(),
        }

    @property
    def facts(self) -> DaemonFacts:
        return self._facts

    @property
    def name_prefix(self) -> str:
        return "docbroker" if self._instance == "default" else f"docbroker-{self._instance}"

    def container_name(self, tenant: str) -> str:
        return f"{self.name_prefix}-{tenant}"

    async def start(self) -> None:
        self._pool.fill()

    async def create(self, spec: SandboxSpec) -> SandboxInfo:
        # An unprovisioned tenant is the caller's error, not a broken warm sandbox: refuse it
        # before one is taken from the pool.
        _check_spec(spec)
        # Before anything else: an image nobody vouches for starts nothing, and is audited.
        image = await self.image()
        name = self.container_name(spec.tenant)
        winner = await self.blocking(self._winner, name)
        if winner is not None:  # another replica's, running: share it, keep the warm slot
            return winner
        slot = await self._pool.take(wait=WARM_START_TIMEOUT_SECONDS)
        if slot is not None and slot.image != image:
            # Warmed from the image the name meant before it moved (a rebuild, or a swap):
            # never handed to a tenant. Removed, not counted as a failure; the pool refills
            # from the current digest.
            await self._pool.drop(slot)
            slot = None
        if slot is not None:
            try:
                return await self.blocking(self._slots.bind, slot, spec)
            except NameTaken:
                # Lost the race to another replica: this slot is bound to the tenant now, so it
                # goes; the winner is adopted below.
                await self._slots.remove(slot)
            except asyncio.CancelledError:
                # The caller gave up: what the bind made is removed, so no sandbox is left
                # running that the lifecycle does not know.
                await asyncio.shield(self._slots.remove(slot))
                raise
            except Exception as exc:
                # The warm sandbox is unusable (dead, refused the binding, could not be
                # renamed): remove it and start this tenant's cold, as without a pool.
                reason = (
                    str(exc) if isinstance(exc, (BindingError, SandboxStartError)) else type(exc).__name__
                )
                await self._pool.discard(slot, why=reason)
        return await self.blocking(self._create_and_start, spec, image)

    async def alive(self, info: SandboxInfo) -> bool:
        return await self.blocking(self.is_running, info.backend_id)

    async def delete(self, info: SandboxInfo) -> None:
        await self.blocking(self.remove_container, info.backend_id)
        if info.endpoint is not None and info.endpoint.uds is not None:
            remove_stale_socket(info.endpoint.uds)
            self._slots.remove_dir(os.path.dirname(info.endpoint.uds))

    async def discover(self) -> list[SandboxInfo]:
        return await self.blocking(self._discover)

    async def vouched_for(self, info: SandboxInfo) -> bool:
        # The image it runs, as the daemon listed it (discover) or inspected it (a winner).
        digest = str(info.details.get("image_digest", ""))
        try:
            await self.blocking(self._trust.check, digest)
        except ImageUntrusted as exc:
            log.warning("running sandbox not adopted: %s", exc)  # the digest and why, as at a start
            return False
        return True

    async def remove_tenant(self, tenant: str, run_dir: str) -> int:
        return await self.blocking(self._remove_tenant, tenant)

    async def sandboxes(self) -> list[SandboxInfo]:
        return await self.blocking(self._sandboxes)

    async def stderr(self, tenant: str, lines: int) -> bytes:
        # stderr only: the server's stdout is unused (MCP runs over the socket), and stderr
        # carries its log lines, which name tools and codes, never arguments or contents.
        return b"".join(await self.blocking(self._stderr, tenant, lines))

    async def close(self) -> None:
        await self._pool.close()
        self._threads.shutdown(wait=False, cancel_futures=True)
        self._client.close()  # closes the connection pool's sockets: no call to the daemon

    # -- blocking helpers (worker threads) ---------------------------------------------------

    def _create_and_start(self, spec: SandboxSpec, image: str) -> SandboxInfo:
        """The tenant's container: a running one of that name (another replica's) is adopted,
        a dead one removed, and of replicas creating at once the daemon lets one win."""
        name = self.container_name(spec.tenant)
        for _ in range(3):
            winner = self._winner(name)
            if winner is not None:
                return winner
            remove_stale_socket(spec.socket_path)
            started = time.monotonic()
            try:
                container = self._client.containers.create(**self._container_options(spec, name, image))
            except docker.errors.ImageNotFound as exc:
                raise ImageMissing(_image_hint(self._settings.image)) from exc
            except docker.errors.APIError as exc:
                if getattr(exc, "status_code", None) == 409:
                    continue  # another replica created it first: adopt it
                raise SandboxStartError("the Docker daemon refused to create the sandbox") from exc
            try:
                container.start()
            except docker.errors.APIError as exc:
                self.remove_container(container.id)
                raise SandboxStartError("the Docker daemon could not start the sandbox") from exc
            return SandboxInfo(
                tenant=spec.tenant,
                state=SandboxState.STARTING,
                endpoint=Endpoint(url="http://localhost/mcp", uds=spec.socket_path),
                backend_id=str(container.id),
                started_at=started,
                last_used=started,
                details={"container": str(container.id)[:12], "image_digest": image},
            )
        raise SandboxStartError("the tenant's sandbox kept being replaced while starting")

    def _winner(self, name: str) -> SandboxInfo | None:
        """The running container of this name, whichever replica started it, as adopted; None
        if there is none. One still being started ("created") is waited for a while; one that
        has stopped (a crash, a broker killed mid-create) is removed."""
        deadline = time.monotonic() + WINNER_WAIT_SECONDS
        while True:
            try:
                container = self._client.containers.get(name)
            except docker.errors.NotFound:
                return None
            labels = container.labels or {}
            socket_path = labels.get(LABEL_SOCKET)
            if container.status == "running" and socket_path:
                now = time.monotonic()
                return SandboxInfo(
                    tenant=TenantId(
                        labels.get(LABEL_TENANT) or self._bound_tenant(container.name or "") or ""
                    ),
                    state=SandboxState.STARTING,
                    endpoint=Endpoint(url="http://localhost/mcp", uds=socket_path),
                    backend_id=str(container.id),
                    started_at=now,
                    last_used=now,
                    details={
                        "container": str(container.id)[:12],
                        "adopted": True,
                        "image_digest": str(container.attrs.get("Image", "")),
                    },
                )
            if container.status in ("created", "restarting") and time.monotonic() < deadline:
                time.sleep(0.1)
                continue
            self.remove_container(str(container.id))
            return None

    def _container_options(self, spec: SandboxSpec, name: str, image: str) -> dict[str, Any]:
        return self.hardened_options(
            name,
            image=image,
            labels={LABEL_TENANT: spec.tenant, LABEL_SOCKET: spec.socket_path},
            environment=hardening.tenant_environment(spec.tenant),
            mounts=hardening.tenant_mounts(spec),
        )

    # -- the container seam (warm_slots.ContainerSeam; blocking: call through `blocking`) -----

    def hardened_options(
        self,
        name: str,
        *,
        image: str,
        labels: dict[str, str],
        environment: dict[str, str],
        mounts: hardening.Mounts,
    ) -> dict[str, Any]:
        """This backend's sandbox options (hardening.py), labelled as its own, from `image` (a digest)."""
        own = {LABEL_MANAGED: "true", LABEL_INSTANCE: self._instance, LABEL_REPLICA: self.replicas.me}
        return hardening.hardened_options(
            self._settings,
            image=image,
            name=name,
            user=self.sandbox_user,
            seccomp_json=self._seccomp,
            labels={**own, **labels},
            environment=environment,
            mounts=mounts,
        )

    def start_container(self, options: dict[str, Any]) -> str:
        """Create and start a container from `options` (hardened_options'); its id. Raises the
        SDK's DockerException: the caller says what failed and removes what was made."""
        container = self._client.containers.create(**options)
        container.start()
        return str(container.id)

    def rename_container(self, container: str, name: str) -> None:
        """Give a container its new name; the daemon gives a name to one container only (a
        conflict is the SDK's APIError with status 409)."""
        self._client.api.rename(container, name)

    def is_running(self, container_id: str) -> bool:
        try:
            container = self._client.containers.get(container_id)
        except docker.errors.NotFound:
            return False
        except docker.errors.APIError:
            return False  # cannot tell: the lifecycle replaces it, which is the safe side
        return bool(container.status == "running")

    def remove_container(self, container_id_or_name: str) -> None:
        try:
            # force: SIGKILL and remove in one call. Reaped sandboxes are idle, and a crash
            # mid-write is already reported as result_unknown by the server's contract.
            self._client.api.remove_container(container_id_or_name, force=True, v=True)
        except docker.errors.NotFound:
            return
        except docker.errors.APIError as exc:
            if getattr(exc, "status_code", None) == 409:  # removal already in progress
                return
            raise

    # -- blocking helpers: what the engine holds ------------------------------------------------

    def _discover(self) -> list[SandboxInfo]:
        filters = {"label": [f"{LABEL_MANAGED}=true", f"{LABEL_INSTANCE}={self._instance}"]}
        found = []
        now = time.monotonic()
        # One list request, whose answer has each container's labels, name and state: every
        # reaper pass walks all of them, and the SDK's `containers.list` would inspect each
        # (one request to the daemon per tenant, its parsing in the broker holding the GIL).
        for container in self._client.api.containers(all=True, filters=filters):
            labels = container.get("Labels") or {}
            name = (container.get("Names") or [""])[0]
            container_id = str(container["Id"])
            socket_path = labels.get(LABEL_SOCKET)
            if labels.get(LABEL_POOL) == "true":
                tenant = self._bound_tenant(name)
                if tenant is None and self._slots.tag in name:
                    continue  # one of this broker's own spares
                owner = labels.get(LABEL_REPLICA, "")
                if tenant is None and owner != self.replicas.me and self.replicas.alive(owner):
                    continue  # a live peer's spare: its own to give out
                if tenant is None:  # still warm, never bound: a spare of a broker that is gone
                    self.remove_container(container_id)
                    if socket_path:
                        self._slots.remove_dir(os.path.dirname(socket_path))
                    continue
            else:
                tenant = TenantId(labels.get(LABEL_TENANT, ""))
            running = container.get("State") == "running"
            found.append(
                SandboxInfo(
                    tenant=tenant,
                    state=SandboxState.RUNNING if running else SandboxState.FAILED,
                    endpoint=Endpoint(url="http://localhost/mcp", uds=socket_path) if socket_path else None,
                    backend_id=container_id,
                    started_at=now,
                    last_used=now,
                    details={
                        "replica": labels.get(LABEL_REPLICA, ""),
                        "image_digest": str(container.get("ImageID", "")),
                    },
                )
            )
        return found

    def _remove_tenant(self, tenant: str) -> int:
        """Remove the tenant's containers, found by labels (cold) or by name (a bound warm one),
        of this instance, whichever broker started them; other tenants' and spares stay."""
        removed = 0
        for _, container in self._tenant_containers(tenant):
            self.remove_container(container.id)
            socket_path = (container.labels or {}).get(LABEL_SOCKET)
            if socket_path:
                remove_stale_socket(socket_path)
                self._slots.remove_dir(os.path.dirname(socket_path))
            removed += 1
        return removed

    def _tenant_containers(self, tenant: str | None) -> list[tuple[TenantId, Any]]:
        """(tenant, container) for the tenants' sandboxes of this instance — all, or one
        tenant's — whichever broker started them; unbound spares are nobody's yet."""
        filters = {"label": [f"{LABEL_MANAGED}=true", f"{LABEL_INSTANCE}={self._instance}"]}
        found = []
        for container in self._client.containers.list(all=True, filters=filters, ignore_removed=True):
            labels = container.labels or {}
            owner = TenantId(labels.get(LABEL_TENANT) or "") or (
                self._bound_tenant(container.name or "") if labels.get(LABEL_POOL) == "true" else None
            )
            if owner and (tenant is None or owner == tenant):
                found.append((owner, container))
        return found

    def _sandboxes(self) -> list[SandboxInfo]:
        now = time.monotonic()
        return [
            SandboxInfo(
                tenant=tenant,
                state=SandboxState.RUNNING if container.status == "running" else SandboxState.FAILED,
                endpoint=None,
                backend_id=str(container.id),
                started_at=now,
                last_used=now,
                details={
                    "id": str(container.id)[:12],
                    "status": container.status,
                    "replica": (container.labels or {}).get(LABEL_REPLICA, ""),
                    "warm": (container.labels or {}).get(LABEL_POOL) == "true",
                },
            )
            for tenant, container in self._tenant_containers(None)
        ]

    def _stderr(self, tenant: str, lines: int) -> list[bytes]:
        return [
            container.logs(stdout=False, stderr=True, tail=lines, timestamps=False)
            for _, container in self._tenant_containers(tenant)
        ]

    def _bound_tenant(self, name: str) -> TenantId | None:
        """The tenant a warm sandbox was bound to, from the name `_bind` gave it."""
        prefix = f"{self.name_prefix}-"
        name = name.removeprefix("/")
        if not name.startswith(prefix):
            return None  # still named `<prefix>.pool-…`: never bound
        tenant = name[len(prefix) :]
        return TenantId(tenant) if TENANT_RE.fullmatch(tenant) else None


# --- module helpers -------------------------------------------------------------------------------


def _thread_pool() -> concurrent.futures.ThreadPoolExecutor:
    return concurrent.futures.ThreadPoolExecutor(WORKERS, thread_name_prefix="docker")


async def _in_pool(threads: concurrent.futures.Executor, fn: Callable[..., _T], *args: Any) -> _T:
    try:
        return await in_pool_to_the_end(threads, fn, *args)
    except (requests.exceptions.Timeout, requests.exceptions.ConnectionError) as exc:
        # docker-py lets the HTTP library's errors through (its APIError is an answer, these
        # are none): translated here, one line naming the setting, for every call alike.
        raise DaemonUnavailable(
            "the Docker daemon did not answer within DOCBROKER_DOCKER_API_TIMEOUT (hung? overloaded?)"
        ) from exc


def _open_client(base_url: str | None, timeout: float) -> tuple[Any, DaemonFacts]:
    try:
        client = (
            docker.DockerClient(base_url=base_url, max_pool_size=WORKERS, timeout=timeout)
            if base_url
            else docker.from_env(max_pool_size=WORKERS, timeout=timeout)
        )
        info = client.info()
        version = client.version().get("Version", "")
    except docker.errors.DockerException as exc:
        raise DaemonUnavailable("the Docker daemon does not answer (running? DOCKER_HOST right?)") from exc
    return client, daemon_facts(info, version)


def _resolve_image(client: Any, image: str) -> str:
    """The image id (`sha256:<hex>`, the digest of its config: its content) the name means now."""
    try:
        digest = str(client.images.get(image).id)
    except docker.errors.ImageNotFound:
        raise ImageMissing(_image_hint(image)) from None
    if not DIGEST_RE.fullmatch(digest):  # not a content digest: nothing to pin or verify
        raise ImageMissing(f"the Docker daemon gave no sha256 id for the sandbox image {image}")
    return digest


def _image_hint(image: str) -> str:
    return f"the sandbox image {image} is not in the Docker daemon: run `docbroker image build`"


def _check_spec(spec: SandboxSpec) -> None:
    """Fail with a clear message before Docker does (it would create missing bind sources as dirs)."""
    for path, kind in (
        (spec.sources_dir, "sources folder"),
        (spec.dropbox_dir, "drop-box folder"),
        (spec.run_dir, "run folder"),
    ):
        if not os.path.isdir(path):
            raise SandboxStartError(f"the tenant's {kind} does not exist; provision the tenant first")
    if not os.path.isfile(spec.secret_file):
        raise SandboxStartError("the tenant's secret file does not exist; provision the tenant first")
