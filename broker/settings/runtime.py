"""Where tenants' sandboxes run (Docker, Kubernetes, local processes) and their bounds."""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path

from broker.settings.kubernetes import KubernetesSettings, kubernetes_settings
from broker.settings.reader import INSTANCE_RE, MIB, PREFIX, Reader, SettingsError


@dataclass(frozen=True)
class DockerSettings:
    base_url: str | None = None  # None: DOCKER_HOST or the default socket
    image: str = "docbroker-server:latest"
    require_rootless: bool = False  # refuse a rootful daemon
    memory_bytes: int = 128 * 1024 * 1024
    nano_cpus: int = 1_000_000_000  # one core: start-up is CPU-bound (SDK import), 0.5 doubles it
    pids_limit: int = 64
    nofile: int = 256
    tmpfs_bytes: int = 8 * 1024 * 1024
    seccomp_profile: Path = Path("policies/seccomp.json")
    # Warm, tenant-less sandboxes kept ready so a first call skips the ~1 s SDK import
    # (broker/runtime/warm_pool.py). Each costs an idle sandbox's memory; 0 turns the pool off.
    pool_size: int = 1
    # How far the pool grows when new tenants arrive faster than one spare warms up
    # (broker/runtime/warm_pool_sizer.py); never below pool_size. Spares above pool_size go once no
    # new tenant came for the idle timeout.
    pool_max: int = 10
    # Each blocking call to the daemon, at most (docker-py's own default is 60 s, longer than
    # a whole sandbox start): a hung daemon fails a start, it does not hold it.
    api_timeout_seconds: float = 10.0


# Descriptors a sandbox's server holds for itself (interpreter, listening socket, event loop,
# the files a tool has open) beside the broker's connections; measured ~20, kept generous.
SANDBOX_OWN_FILES = 64
CONTAINERD_NOFILE = 1024  # the open-file limit of a container in containerd's default spec


class RuntimeKind(StrEnum):
    """The engine sandboxes run on (DOCBROKER_RUNTIME)."""

    DOCKER = "docker"
    KUBERNETES = "kubernetes"
    LOCAL = "local"  # plain processes: insecure, development and tests


@dataclass(frozen=True)
class RuntimeSettings:
    kind: RuntimeKind = RuntimeKind.DOCKER
    # The deployment's name on the engine: its replicas share it (and so their sandboxes);
    # two deployments on one daemon keep apart by it.
    instance: str = "default"
    allow_insecure_local: bool = False
    # Local runtime only: the server command (`--socket PATH` is appended). For tests that put
    # a deliberately hostile server behind the real broker.
    local_command: tuple[str, ...] | None = None
    max_sandboxes: int = 100
    idle_timeout_seconds: float = 600.0
    start_timeout_seconds: float = 20.0
    call_timeout_seconds: float = 30.0
    breaker_threshold: int = 3  # consecutive sandbox failures that open the circuit
    breaker_cooldown_seconds: float = 30.0
    docker: DockerSettings = field(default_factory=DockerSettings)
    kubernetes: KubernetesSettings = field(default_factory=KubernetesSettings)

    @property
    def sandbox_connections(self) -> int:
        """Connections one broker opens to one sandbox at once, at most: below the open-file
        limit its server runs under, less what the server holds itself. Past that limit a
        sandbox cannot accept, and a call on a connection it never accepts waits out its
        deadline (seen with a tenant's `max_concurrent` of 1000 against 256 files)."""
        if self.kind is RuntimeKind.DOCKER:
            return max(8, self.docker.nofile - SANDBOX_OWN_FILES)
        return CONTAINERD_NOFILE - SANDBOX_OWN_FILES  # a Pod: containerd's default limit


def runtime_settings(r: Reader, policies_dir: Path) -> RuntimeSettings:
    start_timeout = r.number(
        "START_TIMEOUT",
        20.0,
        low=1,
        high=600,
        doc=(
            "seconds a sandbox may take to start and answer (1-600); past it the call fails and the "
            "sandbox is removed"
        ),
    )
    docker = docker_settings(r, start_timeout=start_timeout, policies_dir=policies_dir)
    kind = r.choice(
        "RUNTIME",
        RuntimeKind.DOCKER.value,
        tuple(k.value for k in RuntimeKind),
        doc=(
            "`docker`, `kubernetes` (one Pod per tenant, [docs/kubernetes.md](docs/kubernetes.md)) or "
            "`local` (insecure, needs `DOCBROKER_ALLOW_INSECURE_LOCAL_RUNTIME=1`)"
        ),
    )
    command = r.text(
        "LOCAL_SERVER_COMMAND",
        "",
        doc=(
            "local runtime only: the tenant server's command, split as a shell would, `--socket PATH` "
            "appended (tests put a hostile server behind the real broker with it)"
        ),
    )
    runtime = RuntimeSettings(
        kind=RuntimeKind(kind),
        instance=instance(r),
        allow_insecure_local=r.flag(
            "ALLOW_INSECURE_LOCAL_RUNTIME",
            False,
            doc=(
                "accept `DOCBROKER_RUNTIME=local`: tenant servers as plain processes, no sandbox "
                "(development and tests only)"
            ),
        ),
        local_command=tuple(shlex.split(command)) or None,
        max_sandboxes=r.integer(
            "MAX_SANDBOXES", 100, low=1, high=10_000, doc="cap on running sandboxes; more get 503"
        ),
        idle_timeout_seconds=r.number(
            "IDLE_TIMEOUT",
            600.0,
            low=1,
            high=86_400,
            doc=(
                "seconds before an idle sandbox is stopped (idle on every replica: see Replicas); also "
                "how long warm sandboxes above `DOCBROKER_DOCKER_POOL_SIZE` are kept without a new tenant"
            ),
        ),
        start_timeout_seconds=start_timeout,
        call_timeout_seconds=r.number(
            "CALL_TIMEOUT", 30.0, low=0.1, high=600, doc="seconds per forwarded call"
        ),
        breaker_threshold=r.integer(
            "BREAKER_THRESHOLD",
            3,
            low=1,
            high=1000,
            doc=(
                "consecutive failures of a tenant's sandbox that open its circuit: calls then get `503` "
                "with `Retry-After` at once (1-1000)"
            ),
        ),
        breaker_cooldown_seconds=r.number(
            "BREAKER_COOLDOWN",
            30.0,
            low=0.1,
            high=3600,
            doc="seconds the circuit stays open before one trial call (0.1-3600)",
        ),
        docker=docker,
        kubernetes=kubernetes_settings(r, by_digest=kind == RuntimeKind.KUBERNETES),
    )
    if runtime.kind is RuntimeKind.LOCAL and not runtime.allow_insecure_local:
        raise SettingsError(
            f"{PREFIX}RUNTIME=local runs tenant servers as plain processes without a sandbox; "
            f"set {PREFIX}ALLOW_INSECURE_LOCAL_RUNTIME=1 to accept that (development and tests only)"
        )
    return runtime


def docker_settings(r: Reader, *, start_timeout: float, policies_dir: Path) -> DockerSettings:
    pool_size = r.integer(
        "DOCKER_POOL_SIZE",
        1,
        low=0,
        high=32,
        doc=(
            "warm, tenant-less sandboxes kept ready at least, the pool's floor (0-32; 0: no pool, "
            "every sandbox starts cold); they come on top of `DOCBROKER_MAX_SANDBOXES`"
        ),
    )
    pool_max = r.integer(
        "DOCKER_POOL_MAX",
        10,
        low=0,
        high=64,
        doc=(
            "the most warm sandboxes the pool grows to when new tenants arrive faster than one warms "
            "up (0-64, never below `DOCBROKER_DOCKER_POOL_SIZE`): it keeps as many as new tenants "
            "came within one warm-up time in the last `DOCBROKER_IDLE_TIMEOUT` seconds, then falls "
            "back to the floor; each costs an idle sandbox's memory"
        ),
    )
    api_timeout = r.number(
        "DOCKER_API_TIMEOUT",
        10.0,
        low=1,
        high=120,
        doc=(
            "seconds one call to the Docker daemon may take (1-120, never more than "
            "`DOCBROKER_START_TIMEOUT`); a daemon that does not answer in time fails the start with "
            "503 (`sandbox_daemon_unavailable`). Docker calls run on the backend's own 32 threads, so "
            "a hung daemon never holds the rest of the broker's worker threads"
        ),
    )
    return DockerSettings(
        base_url=docker_host(r),
        image=docker_image(r),
        require_rootless=r.flag("DOCKER_REQUIRE_ROOTLESS", False, doc="refuse a rootful daemon"),
        memory_bytes=MIB
        * r.integer("DOCKER_MEMORY_MB", 128, low=32, high=65_536, doc="sandbox memory limit, MiB (32-65536)"),
        nano_cpus=int(r.number("DOCKER_CPUS", 1.0, low=0.05, high=64, doc="sandbox CPUs (0.05-64)") * 1e9),
        pids_limit=r.integer("DOCKER_PIDS_LIMIT", 64, low=8, high=4096, doc="sandbox process limit (8-4096)"),
        nofile=r.integer(
            "DOCKER_NOFILE",
            256,
            low=32,
            high=65_536,
            doc=(
                "sandbox open-file limit (32-65536); a broker opens at most this less 64 connections to "
                "one sandbox, further calls wait for one"
            ),
        ),
        pool_size=pool_size,
        pool_max=max(pool_size, pool_max),
        # Never above the start timeout: one call must not outlast the start it serves.
        api_timeout_seconds=min(api_timeout, start_timeout),
        # Beside the tenant policies unless named: one folder holds every policy file.
        seccomp_profile=r.folder(
            "DOCKER_SECCOMP_PROFILE",
            policies_dir / "seccomp.json",
            doc="the sandbox's seccomp profile (Docker's JSON format), loaded at start",
        ),
    )


def docker_host(r: Reader) -> str | None:
    return r.optional("DOCKER_HOST", doc="daemon socket, e.g. `unix:///run/user/1000/docker.sock`")


def docker_image(r: Reader) -> str:
    return r.text(
        "DOCKER_IMAGE",
        "docbroker-server:latest",
        doc=("sandbox image; resolved to its digest at each start, and the sandbox made from the digest"),
    )


def instance(r: Reader) -> str:
    name = r.text(
        "INSTANCE",
        "default",
        doc=(
            "the deployment's name on the sandbox engine (a-z 0-9 -, up to 32): its replicas share it "
            "and so their sandboxes; two deployments on one Docker daemon keep apart by it "
            "(containers `docbroker-<instance>-<tenant>`)"
        ),
    )
    if not INSTANCE_RE.fullmatch(name):
        raise SettingsError(f"{PREFIX}INSTANCE must be 1-32 of a-z 0-9 - (a DNS label's characters)")
    return name
