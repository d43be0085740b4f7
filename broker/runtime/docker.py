"""Docker backend: one hardened container per tenant, MCP over a unix socket (DESIGN §7).

    backend = await DockerBackend.connect(settings.runtime.docker)
    runtime = Runtime(backend, tenants.provision, ...)

Each container gets, and why:

- user 10001 (`sandbox_user`), `cap_drop ALL`, `no-new-privileges`: no root, no capabilities,
  no setuid escalation. The group depends on the daemon: under a rootless one, gid 0, which
  there is the broker user's own gid on the host — how the broker reads reports (mode 0o040)
  and connects to the socket (mode 0o770) while the sandbox's uid cannot read its own reports
  back. Anywhere else container gid 0 is the host's root group (DESIGN §7: never), so the
  sandbox gets a dedicated group, 10001; the broker, root there, reads and connects as before.
- `policies/seccomp.json`: an allow-list (default EPERM) without the chmod/chown/unlink/rename
  family, namespaces, mount, ptrace, bpf, io_uring, keyctl, userfaultfd, and with AF_UNIX
  as the only socket family.
- read-only root fs, a small `noexec,nosuid,nodev` tmpfs on /tmp: nothing written can be run.
- `network_mode="none"`: only `lo`; the MCP socket is a bind-mounted file, not a port.
- memory (swap = memory), CPU, pids, nofile limits — enforced only where the daemon has
  cgroups; `describe()` says which (a rootless daemon on cgroup v1 has none).
- mounts: sources read-only, the drop-box read-write, the tenant's secret read-only as one
  file, the run dir for the socket. Never the Docker socket, never a host system folder.
- labels naming the tenant and the replica that started it, so a restarted broker finds
  (adopts) its containers, and replicas on one daemon share them (see Replicas below).

Replicas: the daemon is the source of truth. A tenant's container has a fixed name, so of
replicas racing to start one, the daemon lets one create it (or rename a warm one to it) and
the others get a conflict and adopt the winner's. A warm spare carries its replica's label and
a per-process tag in its name: a starting replica leaves a live peer's spares alone and
removes those of replicas that are gone.

Paths inside the sandbox: DOCS_ROOT=/srv/docs (sources/, reports/ = drop-box), the socket
/run/docs/mcp.sock, the secret /run/secrets/approval.key. DESIGN §1 draws the secret at
/run/docs/approval.key; it moved to its own read-only mount because /run/docs is the
writable run dir the socket lives in, shared with the host.

Every blocking SDK call runs in a worker thread (`asyncio.to_thread`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import secrets
import shutil
import time
from pathlib import Path
from typing import Any, TypeVar

from broker.runtime.base import BackendRefused, SandboxBackend, SandboxStartError, wait_ready
from broker.runtime.daemon import DaemonFacts, daemon_facts
from broker.runtime.pool import Slot, WarmPool
from broker.runtime.shared import Replicas
from broker.settings import DockerSettings
from broker.threads import to_thread_to_the_end
from broker.types import DaemonMode, Endpoint, SandboxInfo, SandboxSpec, SandboxState
from server import landlock
from server.binding import BindingError, send_binding
from server.contracts import TENANT_RE

log = logging.getLogger("docbroker.runtime.docker")
_T = TypeVar("_T")

SANDBOX_UID = 10001
SANDBOX_GID = 10001  # never 0 outside rootless: the host's root group there
DOCS_ROOT = "/srv/docs"
RUN_DIR = "/run/docs"
SECRET_PATH = "/run/secrets/approval.key"  # noqa: S105 - a path, not a secret
SOCKET_NAME = "mcp.sock"
BIND_SOCKET_NAME = "bind.sock"
POOL_NAME_TAG = ".pool-"  # a dot: no tenant id (a DNS label) can make a name like it
BIND_TIMEOUT_SECONDS = 5.0
WARM_START_TIMEOUT_SECONDS = 60.0  # generous: a warm start is in the background, on a busy host
WINNER_WAIT_SECONDS = 10.0  # for a peer's container still being started ("created")

LABEL_MANAGED = "io.docbroker.managed"
LABEL_TENANT = "io.docbroker.tenant"
LABEL_INSTANCE = "io.docbroker.instance"
LABEL_SOCKET = "io.docbroker.socket"
LABEL_POOL = "io.docbroker.pool"  # started tenant-less; its tenant is in its name once bound
LABEL_REPLICA = "io.docbroker.replica"  # the replica that started it


class DaemonUnavailable(BackendRefused):
    reason = "sandbox_daemon_unavailable"


class ImageMissing(BackendRefused):
    reason = "sandbox_image_missing"


class _NameTaken(Exception):
    """Another replica's container got the tenant's name first."""


def load_seccomp_profile(path: Path) -> str:
    """The profile as compact JSON: Docker takes the contents, not a path, over its API."""
    try:
        profile = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise BackendRefused(f"seccomp profile {path} cannot be read as JSON") from exc
    if profile.get("defaultAction") in (None, "SCMP_ACT_ALLOW"):
        # An allow-by-default profile is a deny-list: refuse it rather than run weaker.
        raise BackendRefused(f"seccomp profile {path} must deny by default")
    return json.dumps(profile, separators=(",", ":"))


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
    ) -> None:
        """Use `connect()`: it talks to the daemon (blocking) and applies the refusals.

        `pool_dir` (host folder for the warm slots' run dirs) turns the warm pool on with
        `settings.pool_size` slots; without it every sandbox starts cold.
        """
        self._settings = settings
        self._client = client
        self._facts = facts
        self._seccomp = seccomp_json
        self._instance = instance
        self._pool_dir = pool_dir
        self.replicas = replicas or Replicas(None, "local")
        # In every warm sandbox's name: `discover()` removes an earlier broker's spares, not ours.
        self._pool_tag = f"{POOL_NAME_TAG}{secrets.token_hex(3)}-"
        self._pool = WarmPool(
            size=settings.pool_size if pool_dir is not None else 0,
            start=self._start_slot,
            remove=self._remove_slot,
            off_reason=_pool_off_reason(settings, pool_dir),
        )

    @classmethod
    async def connect(
        cls,
        settings: DockerSettings,
        *,
        instance: str = "default",
        pool_dir: Path | None = None,
        replicas: Replicas | None = None,
    ) -> DockerBackend:
        """Connect, learn the daemon's mode, and refuse what the settings do not accept.

        Raises DaemonUnavailable (no daemon), BackendRefused (rootful daemon while rootless
        is required; no seccomp; bad profile) or ImageMissing.
        """
        seccomp_json = load_seccomp_profile(settings.seccomp_profile)
        client, facts = await asyncio.to_thread(_open_client, settings.base_url)
        try:
            if settings.require_rootless and facts.mode is not DaemonMode.ROOTLESS:
                raise BackendRefused(
                    f"the Docker daemon is {facts.mode.value}, and DOCBROKER_DOCKER_REQUIRE_ROOTLESS is set"
                )
            if not facts.seccomp:
                raise BackendRefused("the Docker daemon has no seccomp: sandboxes would run unfiltered")
            if facts.mode is DaemonMode.ROOTFUL and not _in_sandbox_group():
                raise BackendRefused(
                    f"on a rootful Docker daemon the broker must run as root or in group {SANDBOX_GID}: "
                    "it reads reports and reaches the sandbox's socket through that group"
                )
            await asyncio.to_thread(_require_image, client, settings.image)
        except BaseException:
            client.close()
            raise
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
        )

    # -- SandboxBackend ---------------------------------------------------------------------

    def mode(self) -> DaemonMode:
        return self._facts.mode

    @property
    def sandbox_user(self) -> str:
        return sandbox_user(self._facts.mode)

    def describe(self) -> dict[str, Any]:
        return {
            "backend": self.name,
            **self._facts.as_dict(),
            "image": self._settings.image,
            "pool": self._pool.describe(),
        }

    @property
    def facts(self) -> DaemonFacts:
        return self._facts

    @property
    def _name_prefix(self) -> str:
        return "docbroker" if self._instance == "default" else f"docbroker-{self._instance}"

    def container_name(self, tenant: str) -> str:
        return f"{self._name_prefix}-{tenant}"

    async def start(self) -> None:
        self._pool.fill()

    async def create(self, spec: SandboxSpec) -> SandboxInfo:
        # An unprovisioned tenant is the caller's error, not a broken warm sandbox: refuse it
        # before one is taken from the pool.
        _check_spec(spec)
        name = self.container_name(spec.tenant)
        winner = await asyncio.to_thread(self._winner, name)
        if winner is not None:  # another replica's, running: share it, keep the warm slot
            return winner
        slot = await self._pool.take()
        if slot is not None:
            try:
                return await to_thread_to_the_end(self._bind, slot, spec)
            except _NameTaken:
                # Lost the race to another replica: this slot is bound to the tenant now, so it
                # goes; the winner is adopted below.
                await self._remove_slot(slot)
            except asyncio.CancelledError:
                # The caller gave up: what the bind made is removed, so no sandbox is left
                # running that the lifecycle does not know.
                await asyncio.shield(self._remove_slot(slot))
                raise
            except Exception as exc:
                # The warm sandbox is unusable (dead, refused the binding, could not be
                # renamed): remove it and start this tenant's cold, as without a pool.
                reason = (
                    str(exc) if isinstance(exc, (BindingError, SandboxStartError)) else type(exc).__name__
                )
                await self._pool.discard(slot, why=reason)
        return await asyncio.to_thread(self._create_and_start, spec)

    async def alive(self, info: SandboxInfo) -> bool:
        return await asyncio.to_thread(self._running, info.backend_id)

    async def delete(self, info: SandboxInfo) -> None:
        await asyncio.to_thread(self._remove, info.backend_id)
        if info.endpoint is not None and info.endpoint.uds is not None:
            _remove_stale_socket(info.endpoint.uds)
            self._remove_slot_dir(os.path.dirname(info.endpoint.uds))

    async def discover(self) -> list[SandboxInfo]:
        return await asyncio.to_thread(self._discover)

    async def remove_tenant(self, tenant: str, run_dir: str) -> int:
        return await asyncio.to_thread(self._remove_tenant, tenant)

    async def close(self) -> None:
        await self._pool.close()
        await asyncio.to_thread(self._client.close)

    # -- the warm pool ----------------------------------------------------------------------

    async def _start_slot(self) -> Slot:
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
        name = f"{self._name_prefix}{self._pool_tag}{token}"
        endpoint = Endpoint(url="http://localhost/mcp", uds=slot.bind_socket)

        async def alive() -> bool:
            return await asyncio.to_thread(self._running, name)

        try:
            slot.sandbox_id = await to_thread_to_the_end(self._create_slot, slot, name)
            if not await wait_ready(endpoint, WARM_START_TIMEOUT_SECONDS, alive):
                raise SandboxStartError("a warm sandbox did not become ready")
        except BaseException:
            # Failed, or cancelled by a shutdown: remove what was made (by name: the create may
            # have failed before the daemon gave it an id). Nothing is left.
            await asyncio.shield(asyncio.to_thread(self._remove_slot_now, name, slot.run_dir))
            raise
        return slot

    async def _remove_slot(self, slot: Slot) -> None:
        await asyncio.to_thread(self._remove_slot_now, slot.sandbox_id, slot.run_dir)

    def _remove_slot_now(self, container: str, run_dir: str) -> None:
        if container:
            self._remove(container)
        self._remove_slot_dir(run_dir)

    def _create_slot(self, slot: Slot, name: str) -> str:
        import docker.errors

        assert self._pool_dir is not None
        self._pool_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.mkdir(slot.run_dir)
        os.chmod(slot.run_dir, 0o1777)  # noqa: S103 - as a tenant's run dir: the sandbox's (sub-)uid binds here
        options = self._hardened_options(
            name,
            labels={LABEL_POOL: "true", LABEL_SOCKET: slot.mcp_socket},
            environment={},
            mounts=[(RUN_DIR, slot.run_dir, False)],
        )
        options["command"] = ["--bind", f"{RUN_DIR}/{BIND_SOCKET_NAME}"]
        try:
            container = self._client.containers.create(**options)
            container.start()
        except docker.errors.DockerException as exc:  # the caller removes what was made
            raise SandboxStartError("the Docker daemon could not start a warm sandbox") from exc
        return str(container.id)

    def _bind(self, slot: Slot, spec: SandboxSpec) -> SandboxInfo:
        """Give a warm sandbox its tenant: the folders as descriptors, then the tenant's name."""
        import docker.errors

        started = time.monotonic()
        send_binding(
            slot.bind_socket,
            scope=spec.tenant,
            sources_dir=spec.sources_dir,
            dropbox_dir=spec.dropbox_dir,
            secret_file=spec.secret_file,
            timeout=BIND_TIMEOUT_SECONDS,
        )
        _remove_stale_socket(slot.bind_socket)
        name = self.container_name(spec.tenant)
        try:
            # The name is how a restarted broker knows the tenant (labels cannot change), and
            # what replicas agree on: the daemon gives it to one container only.
            self._client.api.rename(slot.sandbox_id, name)
        except docker.errors.APIError as exc:
            if getattr(exc, "status_code", None) == 409:
                raise _NameTaken from exc
            raise SandboxStartError("the Docker daemon could not rename a warm sandbox") from exc
        return SandboxInfo(
            tenant=spec.tenant,
            state=SandboxState.STARTING,
            endpoint=Endpoint(url="http://localhost/mcp", uds=slot.mcp_socket),
            backend_id=slot.sandbox_id,
            started_at=started,
            last_used=started,
            details={"container": slot.sandbox_id[:12]},
        )

    def _remove_slot_dir(self, run_dir: str) -> None:
        """A warm slot's run dir goes with its sandbox; a tenant's own run dir stays."""
        if self._pool_dir is not None and Path(run_dir).parent == self._pool_dir:
            shutil.rmtree(run_dir, ignore_errors=True)

    # -- blocking helpers (worker threads) ---------------------------------------------------

    def _create_and_start(self, spec: SandboxSpec) -> SandboxInfo:
        """The tenant's container: a running one of that name (another replica's) is adopted,
        a dead one removed, and of replicas creating at once the daemon lets one win."""
        import docker.errors

        name = self.container_name(spec.tenant)
        for _ in range(3):
            winner = self._winner(name)
            if winner is not None:
                return winner
            _remove_stale_socket(spec.socket_path)
            started = time.monotonic()
            try:
                container = self._client.containers.create(**self._container_options(spec, name))
            except docker.errors.ImageNotFound as exc:
                raise ImageMissing(_image_hint(self._settings.image)) from exc
            except docker.errors.APIError as exc:
                if getattr(exc, "status_code", None) == 409:
                    continue  # another replica created it first: adopt it
                raise SandboxStartError("the Docker daemon refused to create the sandbox") from exc
            try:
                container.start()
            except docker.errors.APIError as exc:
                self._remove(container.id)
                raise SandboxStartError("the Docker daemon could not start the sandbox") from exc
            return SandboxInfo(
                tenant=spec.tenant,
                state=SandboxState.STARTING,
                endpoint=Endpoint(url="http://localhost/mcp", uds=spec.socket_path),
                backend_id=str(container.id),
                started_at=started,
                last_used=started,
                details={"container": str(container.id)[:12]},
            )
        raise SandboxStartError("the tenant's sandbox kept being replaced while starting")

    def _winner(self, name: str) -> SandboxInfo | None:
        """The running container of this name, whichever replica started it, as adopted; None
        if there is none. One still being started ("created") is waited for a while; one that
        has stopped (a crash, a broker killed mid-create) is removed."""
        import docker.errors

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
                    tenant=labels.get(LABEL_TENANT) or self._bound_tenant(container.name or "") or "",
                    state=SandboxState.STARTING,
                    endpoint=Endpoint(url="http://localhost/mcp", uds=socket_path),
                    backend_id=str(container.id),
                    started_at=now,
                    last_used=now,
                    details={"container": str(container.id)[:12], "adopted": True},
                )
            if container.status in ("created", "restarting") and time.monotonic() < deadline:
                time.sleep(0.1)
                continue
            self._remove(str(container.id))
            return None

    def _container_options(self, spec: SandboxSpec, name: str) -> dict[str, Any]:
        return self._hardened_options(
            name,
            labels={LABEL_TENANT: spec.tenant, LABEL_SOCKET: spec.socket_path},
            environment={
                "DOCS_ROOT": DOCS_ROOT,
                "DOCS_SCOPE": spec.tenant,
                "DOCS_SECRET_FILE": SECRET_PATH,  # the path; the secret itself never enters the env
            },
            mounts=[
                (f"{DOCS_ROOT}/sources", spec.sources_dir, True),
                (f"{DOCS_ROOT}/reports", spec.dropbox_dir, False),
                (SECRET_PATH, spec.secret_file, True),
                (RUN_DIR, spec.run_dir, False),
            ],
        )

    def _hardened_options(
        self,
        name: str,
        *,
        labels: dict[str, str],
        environment: dict[str, str],
        mounts: list[tuple[str, str, bool]],  # (in the sandbox, on the host, read-only)
    ) -> dict[str, Any]:
        """Every sandbox, cold or warm, gets exactly this hardening; only mounts and env differ."""
        from docker.types import LogConfig, Mount, Ulimit

        s = self._settings
        return {
            "image": s.image,
            "name": name,
            "user": self.sandbox_user,
            "environment": environment,
            "labels": {
                LABEL_MANAGED: "true",
                LABEL_INSTANCE: self._instance,
                LABEL_REPLICA: self.replicas.me,
                **labels,
            },
            "mounts": [Mount(target, source, type="bind", read_only=ro) for target, source, ro in mounts],
            "cap_drop": ["ALL"],
            "security_opt": ["no-new-privileges:true", f"seccomp={self._seccomp}"],
            "privileged": False,
            "read_only": True,
            "tmpfs": {"/tmp": f"rw,noexec,nosuid,nodev,size={s.tmpfs_bytes}"},  # noqa: S108 - in the sandbox
            "network_mode": "none",
            "ipc_mode": "none",  # no /dev/shm: the server shares no memory with anyone
            "mem_limit": s.memory_bytes,
            "memswap_limit": s.memory_bytes,  # equal: no swap on top of the memory limit
            "nano_cpus": s.nano_cpus,
            "pids_limit": s.pids_limit,
            "ulimits": [Ulimit(name="nofile", soft=s.nofile, hard=s.nofile)],
            "restart_policy": {"Name": "no"},  # the broker decides when to restart
            "log_config": LogConfig(type="json-file", config={"max-size": "1m", "max-file": "1"}),
            "stop_signal": "SIGTERM",
            "detach": True,
        }

    def _running(self, container_id: str) -> bool:
        import docker.errors

        try:
            container = self._client.containers.get(container_id)
        except docker.errors.NotFound:
            return False
        except docker.errors.APIError:
            return False  # cannot tell: the lifecycle replaces it, which is the safe side
        return bool(container.status == "running")

    def _remove(self, container_id_or_name: str) -> None:
        import docker.errors

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

    def _discover(self) -> list[SandboxInfo]:
        filters = {"label": [f"{LABEL_MANAGED}=true", f"{LABEL_INSTANCE}={self._instance}"]}
        found = []
        now = time.monotonic()
        for container in self._client.containers.list(all=True, filters=filters):
            labels = container.labels or {}
            socket_path = labels.get(LABEL_SOCKET)
            if labels.get(LABEL_POOL) == "true":
                tenant = self._bound_tenant(container.name or "")
                if tenant is None and self._pool_tag in (container.name or ""):
                    continue  # one of this broker's own spares
                owner = labels.get(LABEL_REPLICA, "")
                if tenant is None and owner != self.replicas.me and self.replicas.alive(owner):
                    continue  # a live peer's spare: its own to give out
                if tenant is None:  # still warm, never bound: a spare of a broker that is gone
                    self._remove(container.id)
                    if socket_path:
                        self._remove_slot_dir(os.path.dirname(socket_path))
                    continue
            else:
                tenant = labels.get(LABEL_TENANT, "")
            running = container.status == "running"
            found.append(
                SandboxInfo(
                    tenant=tenant,
                    state=SandboxState.RUNNING if running else SandboxState.FAILED,
                    endpoint=Endpoint(url="http://localhost/mcp", uds=socket_path) if socket_path else None,
                    backend_id=container.id,
                    started_at=now,
                    last_used=now,
                    details={"replica": labels.get(LABEL_REPLICA, "")},
                )
            )
        return found

    def _remove_tenant(self, tenant: str) -> int:
        """Remove the tenant's containers, found by labels (cold) or by name (a bound warm one),
        of this instance, whichever broker started them; other tenants' and spares stay."""
        filters = {"label": [f"{LABEL_MANAGED}=true", f"{LABEL_INSTANCE}={self._instance}"]}
        removed = 0
        for container in self._client.containers.list(all=True, filters=filters):
            labels = container.labels or {}
            bound = labels.get(LABEL_POOL) == "true" and self._bound_tenant(container.name or "") == tenant
            if labels.get(LABEL_TENANT) != tenant and not bound:
                continue
            self._remove(container.id)
            socket_path = labels.get(LABEL_SOCKET)
            if socket_path:
                _remove_stale_socket(socket_path)
                self._remove_slot_dir(os.path.dirname(socket_path))
            removed += 1
        return removed

    def _bound_tenant(self, name: str) -> str | None:
        """The tenant a warm sandbox was bound to, from the name `_bind` gave it."""
        prefix = f"{self._name_prefix}-"
        name = name.removeprefix("/")
        if not name.startswith(prefix):
            return None  # still named `<prefix>.pool-…`: never bound
        tenant = name[len(prefix) :]
        return tenant if TENANT_RE.fullmatch(tenant) else None


# --- module helpers -------------------------------------------------------------------------------


def sandbox_user(mode: DaemonMode) -> str:
    """The `uid:gid` a sandbox runs as under a daemon of this mode; the gid is 0 only rootless,
    where it maps to the broker user's own gid (see the module docstring)."""
    return f"{SANDBOX_UID}:0" if mode is DaemonMode.ROOTLESS else f"{SANDBOX_UID}:{SANDBOX_GID}"


def _in_sandbox_group() -> bool:
    return os.geteuid() == 0 or SANDBOX_GID == os.getegid() or SANDBOX_GID in os.getgroups()


def _open_client(base_url: str | None) -> tuple[Any, DaemonFacts]:
    import docker
    import docker.errors

    try:
        client = (
            docker.DockerClient(base_url=base_url, max_pool_size=32)
            if base_url
            else docker.from_env(max_pool_size=32)
        )
        info = client.info()
        version = client.version().get("Version", "")
    except docker.errors.DockerException as exc:
        raise DaemonUnavailable("the Docker daemon does not answer (running? DOCKER_HOST right?)") from exc
    return client, daemon_facts(info, version)


def _require_image(client: Any, image: str) -> None:
    import docker.errors

    try:
        client.images.get(image)
    except docker.errors.ImageNotFound:
        raise ImageMissing(_image_hint(image)) from None


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


def _pool_off_reason(settings: DockerSettings, pool_dir: Path | None) -> str | None:
    """Why the warm pool cannot run here, if it cannot; containers share the host's kernel."""
    if pool_dir is None or settings.pool_size == 0:
        return None
    abi = landlock.abi_version()
    if abi < landlock.MIN_ABI:
        return f"the kernel offers Landlock ABI {abi} (at least {landlock.MIN_ABI} needed)"
    return None


def _remove_stale_socket(path: str) -> None:
    # The sandbox cannot unlink (seccomp), so a socket left by a previous container would make
    # the next bind fail: the broker, owner of the run dir, removes it.
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
