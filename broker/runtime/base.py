"""The interface every runtime's backend implements, and the runtime's errors.

A runtime is the lifecycle (lifecycle.py: ensure, reap, adopt, cap, stop) plus a
`SandboxBackend`, the only part that differs between a local process, a Docker container and
a Kubernetes Pod (create / check / delete one sandbox, and find the ones an earlier broker left
behind). Same shape as httpx's transports: one small base, implementations side by side.

Exceptions:

    RuntimeErrorBase
     ├── CapacityError         the sandbox cap is reached (HTTP 503)
     ├── SandboxStartError     a sandbox did not become ready (HTTP 503)
     └── BackendRefused        the engine refuses by policy, e.g. a rootful daemon (HTTP 503)
          ├── SpecRefused      the sandbox's spec fails the security check (HTTP 503, audited)
          └── ImageUntrusted   the image is not the one that was built and signed (HTTP 503, audited)
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, Protocol

from broker.runtime.host_replicas import FolderUse, Replicas, SharedUse
from broker.types import DaemonMode, SandboxInfo, SandboxSpec


class RuntimeErrorBase(Exception):
    reason = "runtime_error"


class CapacityError(RuntimeErrorBase):
    reason = "sandbox_cap_reached"


class SandboxStartError(RuntimeErrorBase):
    reason = "sandbox_start_failed"


class BackendRefused(RuntimeErrorBase):
    reason = "sandbox_backend_refused"


class SpecRefused(BackendRefused):
    """The sandbox's spec breaks the security profile the broker holds every sandbox to
    (Kubernetes: Pod Security "restricted", podsecurity.py): nothing was created. Audited as
    `sandbox.failed` with this reason: a setting or a code change weakened the sandbox."""

    reason = "pod_security"


class ImageUntrusted(BackendRefused):
    """The configured image is not one the release keys vouch for (DESIGN §13): its digest
    has no signed provenance, a provenance no trusted key signed, or one for another digest;
    or a tenant Pod would name its image by a tag. Nothing was started. Audited as
    `sandbox.failed` with this reason: someone swapped or rebuilt the image."""

    reason = "image_untrusted"


class SourcesBusy(BackendRefused):
    """The tenant's sources are being replaced on a `ReadWriteOnce` claim (`tenant sources
    push`): its Pod may not mount them until the push ends. Nothing was started; retry later."""

    reason = "sources_push"


class ImageCheck(Protocol):
    """Vouches for an image digest before a sandbox is made from it (broker/runtime/imagetrust.py)."""

    def check(self, digest: str) -> None:
        """Return if `digest` (`sha256:<hex>`) may run; raise ImageUntrusted if not. Blocking:
        it reads the image's records (called on a backend's worker thread)."""

    def describe(self) -> dict[str, Any]:
        """For /readyz and `doctor`: `state` on or off, and why."""


class NoImageTrust:
    """No release keys configured: any image under the configured name runs, as it resolves at
    each start. Said loudly in /readyz, `doctor` and the log: a security product that checks
    nothing must not look as if it did."""

    def check(self, digest: str) -> None:
        return None

    def describe(self) -> dict[str, Any]:
        return {"state": "off", "reason": "DOCBROKER_IMAGE_TRUST_KEYS is not set: the image is not verified"}


class SandboxBackend(ABC):
    """Creates, checks and deletes single sandboxes. Knows nothing of idleness or caps."""

    name: str = "abstract"
    # Who else runs on this engine (set by the backend's constructor; alone by default).
    replicas: Replicas = Replicas(None, "local")

    @abstractmethod
    async def create(self, spec: SandboxSpec) -> SandboxInfo:
        """Start a sandbox for `spec` and return it; readiness is waited for by the caller.

        Replicas share one sandbox per tenant: when another replica's sandbox for the tenant
        runs (or wins a race to start one), return that one with `details["adopted"]` set."""

    @abstractmethod
    async def alive(self, info: SandboxInfo) -> bool:
        """Is the sandbox still running?"""

    @abstractmethod
    async def delete(self, info: SandboxInfo) -> None:
        """Stop and remove the sandbox; must succeed for one that is already gone."""

    async def vouched_for(self, info: SandboxInfo) -> bool:
        """May this running sandbox, made by another replica or an earlier broker, be adopted:
        is its image one the trust keys vouch for now? Asked before adopting, since the keys
        may have changed since it started (a leaked key withdrawn). True where the broker
        checks no image (no keys, or a runtime whose node pulls the image)."""
        return True

    @abstractmethod
    async def discover(self) -> list[SandboxInfo]:
        """The sandboxes of this deployment the engine holds, each with `details["replica"]`
        naming the replica that started it (to adopt or clean up)."""

    async def remove_tenant(self, tenant: str, run_dir: str) -> int:
        """Remove every sandbox of `tenant` the engine holds, found by what marks it there
        (labels, a pid file in `run_dir`), whichever broker process started it; returns how
        many. For operators (`docbroker sandbox restart`): a broker using one notices it is
        gone on its next call and starts and pins a new one."""
        raise BackendRefused(f"the {self.name} runtime cannot replace sandboxes from outside the broker")

    def shared_use(self, every: float) -> SharedUse:
        """Where replicas record and read a tenant's last use (the reaper's "idle on every
        replica"): the replicas' folder on one host; engines spanning hosts keep it in the engine."""
        return FolderUse(self.replicas, every)

    async def sandboxes(self) -> list[SandboxInfo]:
        """The tenants' sandboxes the engine holds, whichever broker started them; reads only
        (`docbroker sandbox list`: unlike `discover`, it never cleans anything up)."""
        return await self.discover()

    async def stderr(self, tenant: str, lines: int) -> bytes:
        """The last `lines` lines of the tenant's sandbox's stderr, as the engine kept them
        (`docbroker sandbox logs`)."""
        raise BackendRefused(f"the {self.name} runtime keeps no sandbox logs for the broker to read")

    def mode(self) -> DaemonMode:
        return DaemonMode.NOT_APPLICABLE

    def describe(self) -> dict[str, Any]:
        """Facts for /readyz and `doctor`: engine, isolation mode, whether limits are enforced."""
        return {"backend": self.name, "mode": self.mode().value}

    async def start(self) -> None:  # noqa: B027 - optional hook
        """Begin background work (a warm pool); called once, after `discover()`."""

    async def close(self) -> None:  # noqa: B027 - optional hook
        """Release engine connections."""
