"""Docker backend: one hardened container per tenant, MCP over a unix socket (DESIGN §7).

    backend = await DockerBackend.connect(settings.runtime.docker)
    runtime = Runtime(backend, tenants.provision, ...)

Each container gets, and why:

- user 10001:0, `cap_drop ALL`, `no-new-privileges`: no root, no capabilities, no setuid
  escalation. gid 0 is deliberate: under a rootless daemon container gid 0 is the broker
  user's own gid, which is how the broker reads reports (mode 0o040) and connects to the
  socket (mode 0o770) while the sandbox's uid cannot read its own reports back.
- `policies/seccomp.json`: an allow-list (default EPERM) without the chmod/chown/unlink/rename
  family, namespaces, mount, ptrace, bpf, io_uring, keyctl, userfaultfd, and with AF_UNIX
  as the only socket family.
- read-only root fs, a small `noexec,nosuid,nodev` tmpfs on /tmp: nothing written can be run.
- `network_mode="none"`: only `lo`; the MCP socket is a bind-mounted file, not a port.
- memory (swap = memory), CPU, pids, nofile limits — enforced only where the daemon has
  cgroups; `describe()` says which (a rootless daemon on cgroup v1 has none).
- mounts: sources read-only, the drop-box read-write, the tenant's secret read-only as one
  file, the run dir for the socket. Never the Docker socket, never a host system folder.
- labels naming the tenant, so a restarted broker finds (adopts) its containers.

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
import time
from pathlib import Path
from typing import Any

from broker.runtime.base import BackendRefused, SandboxBackend, SandboxStartError
from broker.runtime.daemon import DaemonFacts, daemon_facts
from broker.settings import DockerSettings
from broker.types import DaemonMode, Endpoint, SandboxInfo, SandboxSpec, SandboxState

log = logging.getLogger("docbroker.runtime.docker")

SANDBOX_USER = "10001:0"
DOCS_ROOT = "/srv/docs"
RUN_DIR = "/run/docs"
SECRET_PATH = "/run/secrets/approval.key"  # noqa: S105 - a path, not a secret
SOCKET_NAME = "mcp.sock"

LABEL_MANAGED = "io.docbroker.managed"
LABEL_TENANT = "io.docbroker.tenant"
LABEL_INSTANCE = "io.docbroker.instance"
LABEL_SOCKET = "io.docbroker.socket"


class DaemonUnavailable(BackendRefused):
    reason = "sandbox_daemon_unavailable"


class ImageMissing(BackendRefused):
    reason = "sandbox_image_missing"


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
    ) -> None:
        """Use `connect()`: it talks to the daemon (blocking) and applies the refusals."""
        self._settings = settings
        self._client = client
        self._facts = facts
        self._seccomp = seccomp_json
        self._instance = instance

    @classmethod
    async def connect(cls, settings: DockerSettings, *, instance: str = "default") -> DockerBackend:
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
            await asyncio.to_thread(_require_image, client, settings.image)
        except BaseException:
            client.close()
            raise
        if not facts.limits_enforced:
            log.warning(
                "the Docker daemon does not enforce sandbox limits",
                extra={"mode": facts.mode.value, "cgroup_driver": facts.cgroup_driver},
            )
        return cls(settings, client, facts, seccomp_json=seccomp_json, instance=instance)

    # -- SandboxBackend ---------------------------------------------------------------------

    def mode(self) -> DaemonMode:
        return self._facts.mode

    def describe(self) -> dict[str, Any]:
        return {"backend": self.name, **self._facts.as_dict(), "image": self._settings.image}

    @property
    def facts(self) -> DaemonFacts:
        return self._facts

    def container_name(self, tenant: str) -> str:
        prefix = "docbroker" if self._instance == "default" else f"docbroker-{self._instance}"
        return f"{prefix}-{tenant}"

    async def create(self, spec: SandboxSpec) -> SandboxInfo:
        started = time.monotonic()
        container_id = await asyncio.to_thread(self._create_and_start, spec)
        return SandboxInfo(
            tenant=spec.tenant,
            state=SandboxState.STARTING,
            endpoint=Endpoint(url="http://localhost/mcp", uds=spec.socket_path),
            backend_id=container_id,
            started_at=started,
            last_used=started,
            details={"container": container_id[:12]},
        )

    async def alive(self, info: SandboxInfo) -> bool:
        return await asyncio.to_thread(self._running, info.backend_id)

    async def delete(self, info: SandboxInfo) -> None:
        await asyncio.to_thread(self._remove, info.backend_id)
        if info.endpoint is not None and info.endpoint.uds is not None:
            _remove_stale_socket(info.endpoint.uds)

    async def discover(self) -> list[SandboxInfo]:
        return await asyncio.to_thread(self._discover)

    async def close(self) -> None:
        await asyncio.to_thread(self._client.close)

    # -- blocking helpers (worker threads) ---------------------------------------------------

    def _create_and_start(self, spec: SandboxSpec) -> str:
        import docker.errors

        _check_spec(spec)
        name = self.container_name(spec.tenant)
        # A container of that name is a leftover (crash, or a broker killed mid-create): the
        # lifecycle has already decided to replace it.
        self._remove(name)
        _remove_stale_socket(spec.socket_path)
        try:
            container = self._client.containers.create(**self._container_options(spec, name))
        except docker.errors.ImageNotFound as exc:
            raise ImageMissing(_image_hint(self._settings.image)) from exc
        except docker.errors.APIError as exc:
            raise SandboxStartError("the Docker daemon refused to create the sandbox") from exc
        try:
            container.start()
        except docker.errors.APIError as exc:
            self._remove(container.id)
            raise SandboxStartError("the Docker daemon could not start the sandbox") from exc
        return str(container.id)

    def _container_options(self, spec: SandboxSpec, name: str) -> dict[str, Any]:
        from docker.types import LogConfig, Mount, Ulimit

        s = self._settings
        return {
            "image": s.image,
            "name": name,
            "user": SANDBOX_USER,
            "environment": {
                "DOCS_ROOT": DOCS_ROOT,
                "DOCS_SCOPE": spec.tenant,
                "DOCS_SECRET_FILE": SECRET_PATH,  # the path; the secret itself never enters the env
            },
            "labels": {
                LABEL_MANAGED: "true",
                LABEL_TENANT: spec.tenant,
                LABEL_INSTANCE: self._instance,
                LABEL_SOCKET: spec.socket_path,
            },
            "mounts": [
                Mount(f"{DOCS_ROOT}/sources", spec.sources_dir, type="bind", read_only=True),
                Mount(f"{DOCS_ROOT}/reports", spec.dropbox_dir, type="bind", read_only=False),
                Mount(SECRET_PATH, spec.secret_file, type="bind", read_only=True),
                Mount(RUN_DIR, spec.run_dir, type="bind", read_only=False),
            ],
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
            tenant = labels.get(LABEL_TENANT, "")
            socket_path = labels.get(LABEL_SOCKET)
            running = container.status == "running"
            found.append(
                SandboxInfo(
                    tenant=tenant,
                    state=SandboxState.RUNNING if running else SandboxState.FAILED,
                    endpoint=Endpoint(url="http://localhost/mcp", uds=socket_path) if socket_path else None,
                    backend_id=container.id,
                    started_at=now,
                    last_used=now,
                )
            )
        return found


# --- module helpers -------------------------------------------------------------------------------


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


def _remove_stale_socket(path: str) -> None:
    # The sandbox cannot unlink (seccomp), so a socket left by a previous container would make
    # the next bind fail: the broker, owner of the run dir, removes it.
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
