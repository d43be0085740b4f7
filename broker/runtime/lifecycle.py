"""The sandbox lifecycle shared by every runtime: ensure, reap, adopt, cap, stop; and the
`Lease` a call holds its tenant's sandbox by. What differs between engines is the backend
(base.py); how a sandbox is known to be ready is readiness.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

from broker.audit.schema import AuditEvent
from broker.runtime.base import (
    CapacityError,
    ImageUntrusted,
    RuntimeErrorBase,
    SandboxBackend,
    SandboxStartError,
    SpecRefused,
)
from broker.runtime.readiness import wait_ready
from broker.types import Endpoint, RunningSandbox, SandboxInfo, SandboxSpec, SandboxState, TenantId

log = logging.getLogger("docbroker.runtime")

# event name ("sandbox.started" | "sandbox.stopped" | "sandbox.failed"), tenant, sandbox id, details
SandboxEventSink = Callable[[str, str, str, dict[str, Any]], Awaitable[None]]


async def _all_settled(calls: list[Coroutine[Any, Any, None]]) -> int:
    """Run `calls` at once to their ends; how many raised."""
    results = await asyncio.gather(*calls, return_exceptions=True)
    return sum(1 for r in results if isinstance(r, Exception))


SpecFactory = Callable[[TenantId], SandboxSpec]
# Pauses (seconds) between looks when deciding whether a sandbox that broke a connection died.
_EXIT_GRACE = (0.0, 0.05, 0.1, 0.2)


class Runtime:
    """One sandbox per tenant, shared by the tenant's sessions, started on demand."""

    def __init__(
        self,
        backend: SandboxBackend,
        spec_for: SpecFactory,
        *,
        max_sandboxes: int,
        idle_timeout: float,
        start_timeout: float,
        on_event: SandboxEventSink,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.backend = backend
        self._spec_for = spec_for
        self._max = max_sandboxes
        self._idle_timeout = idle_timeout
        self._start_timeout = start_timeout
        self._on_event = on_event
        self._clock = clock
        self._sandboxes: dict[TenantId, SandboxInfo] = {}
        self._inflight: dict[TenantId, int] = {}
        self._locks: dict[TenantId, asyncio.Lock] = {}
        self._reaper: asyncio.Task[None] | None = None
        self._replicas = backend.replicas
        self._use = backend.shared_use(every=min(5.0, idle_timeout / 4))

    # -- public surface ---------------------------------------------------------------------

    async def start(self) -> None:
        """Join the replicas on this engine, adopt what runs, then start the idle reaper."""
        await self._replicas.join()
        await self._sync_with_engine(startup=True)
        await self.backend.start()
        self._reaper = asyncio.create_task(self._reap_forever(), name="sandbox-reaper")

    async def close(self) -> None:
        """Stop every sandbox, unless another replica still runs: its sandboxes are shared, and
        the replicas left take them on (`_sync_with_engine`) and reap them when idle. The last
        replica out leaves nothing running."""
        if self._reaper is not None:
            self._reaper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reaper
        if self._replicas.peers_alive():
            self._sandboxes.clear()
        else:
            # All at once, each attempted whatever the others do: the shutdown takes the slowest
            # stop, not their sum (one after another, a service manager's stop timeout SIGKILLed
            # the broker with the rest still running), and one failed stop leaves none running.
            stops = [self.stop(tenant, reason="shutdown") for tenant in list(self._sandboxes)]
            failed = await _all_settled(stops)
            try:
                left = await self.backend.discover()  # what crashed peers left
            except Exception:  # the engine away: nothing more can be removed from here
                left, failed = [], failed + 1
            failed += await _all_settled([self.backend.delete(info) for info in left])
            if failed:
                log.warning("sandboxes not removed at shutdown", extra={"count": failed})
        await self._use.close()
        await self.backend.close()
        self._replicas.leave()

    def lease(self, tenant: TenantId) -> Lease:
        """`async with runtime.lease(tenant) as sandbox`: the tenant's running sandbox, kept
        from being reaped while the caller uses it."""
        return Lease(self, tenant)

    async def _acquire(self, tenant: TenantId) -> RunningSandbox:
        endpoint = await self.ensure(tenant)
        info = self._sandboxes[tenant]
        self._inflight[tenant] = self._inflight.get(tenant, 0) + 1
        self._use.touch(tenant)
        return RunningSandbox(tenant, info.backend_id, endpoint)

    def _release(self, tenant: TenantId) -> None:
        self._inflight[tenant] -= 1
        current = self._sandboxes.get(tenant)
        if current is not None:
            current.last_used = self._clock()
        self._use.touch(tenant)

    async def ensure(self, tenant: TenantId) -> Endpoint:
        info = self._sandboxes.get(tenant)
        if info is not None and info.state is SandboxState.RUNNING and info.endpoint is not None:
            info.last_used = self._clock()
            return info.endpoint
        async with self._locks.setdefault(tenant, asyncio.Lock()):
            info = self._sandboxes.get(tenant)
            if info is not None and info.state is SandboxState.RUNNING and info.endpoint is not None:
                return info.endpoint
            if info is not None:  # failed or crashed: replace it
                await self._remove(tenant, reason="replaced")
            return await self._create(tenant)

    async def mark_broken(self, tenant: TenantId) -> None:
        """The gateway saw the sandbox fail: check it, and replace it on the next call if dead."""
        info = self._sandboxes.get(tenant)
        if info is None:
            return
        # A crashing sandbox closes its connections before it is gone (the kernel closes files
        # first; the engine or event loop learns of the exit later): look again for a moment,
        # or the gateway's retry is sent to the same dead sandbox.
        for pause in _EXIT_GRACE:
            await asyncio.sleep(pause)
            if self._sandboxes.get(tenant) is not info or info.state is not SandboxState.RUNNING:
                return  # replaced or marked meanwhile
            try:
                alive = await self.backend.alive(info)
            except RuntimeErrorBase as exc:
                # The engine cannot be asked now (its daemon restarting or hung). The call's own
                # failure must stand — a save already sent is result_unknown, never "retry later"
                # — and the next call meets the sandbox as the engine has it by then.
                log.warning("sandbox check failed: %s", exc.reason, extra={"backend": self.backend.name})
                return
            if not alive:
                info.state = SandboxState.FAILED
                await self._on_event(
                    AuditEvent.SANDBOX_FAILED, tenant, info.backend_id, {"reason": "crashed"}
                )
                return

    async def replace(self, tenant: TenantId, backend_id: str, *, reason: str) -> bool:
        """Remove this sandbox instance, if it is still the tenant's, so that the next call
        starts a new one; False if it was already replaced. Calls still on it fail."""
        async with self._locks.setdefault(tenant, asyncio.Lock()):
            info = self._sandboxes.get(tenant)
            if info is None or info.backend_id != backend_id:
                return False
            await self._remove(tenant, reason=reason)
            return True

    async def stop(self, tenant: TenantId, *, reason: str = "requested") -> None:
        async with self._locks.setdefault(tenant, asyncio.Lock()):
            await self._remove(tenant, reason=reason)

    def list(self) -> list[SandboxInfo]:
        return list(self._sandboxes.values())

    def get(self, tenant: TenantId) -> SandboxInfo | None:
        """The tenant's sandbox, if it has one (any state)."""
        return self._sandboxes.get(tenant)

    def running_count(self) -> int:
        return sum(1 for s in self._sandboxes.values() if s.state is SandboxState.RUNNING)

    # -- internals --------------------------------------------------------------------------

    async def _create(self, tenant: TenantId) -> Endpoint:
        if len(self._sandboxes) >= self._max:
            await self._reap_idle(force_one=True)
            if len(self._sandboxes) >= self._max:
                raise CapacityError("sandbox cap reached")
        started = self._clock()
        # A use before the start: a replica sweeping orphans must not take this one for idle.
        self._use.touch(tenant, force=True)
        try:
            info = await self._create_vouched(self._spec_for(tenant))
        except RuntimeErrorBase as exc:
            # The backend's own fixed phrase (never a value): what an operator needs to act.
            log.warning("sandbox start failed: %s", exc, extra={"backend": self.backend.name})
            if isinstance(exc, (SpecRefused, ImageUntrusted)):
                await self._on_event(AuditEvent.SANDBOX_FAILED, tenant, "", {"reason": exc.reason})
            raise
        except Exception as exc:
            await self._on_event(AuditEvent.SANDBOX_FAILED, tenant, "", {"reason": "create_failed"})
            raise SandboxStartError("sandbox could not be created") from exc
        self._sandboxes[tenant] = info
        assert info.endpoint is not None
        if not await wait_ready(info.endpoint, self._start_timeout, lambda: self.backend.alive(info)):
            await self._remove(tenant, reason="not_ready", event=AuditEvent.SANDBOX_FAILED)
            raise SandboxStartError("sandbox did not become ready")
        info.state = SandboxState.RUNNING
        info.last_used = self._clock()
        if info.details.get("adopted"):
            # Another replica's (it won the race, or started it earlier): its start is in its audit.
            log.info("adopted sandbox", extra={"backend": self.backend.name})
        else:
            details = {**self.backend.describe(), "start_ms": round((self._clock() - started) * 1000, 1)}
            if "image_digest" in info.details:  # what this sandbox was created from, not the last resolved
                details["image_digest"] = info.details["image_digest"]
            await self._on_event(AuditEvent.SANDBOX_STARTED, tenant, info.backend_id, details)
        return info.endpoint

    async def _create_vouched(self, spec: SandboxSpec) -> SandboxInfo:
        """`backend.create`; a peer's running sandbox it hands back instead is taken only if its
        image is vouched for now, else removed and the start made again (once: what is made
        then is this replica's, from the image it has just checked)."""
        for _ in range(2):
            info = await self.backend.create(spec)
            if not info.details.get("adopted") or await self.backend.vouched_for(info):
                return info
            await self._remove_untrusted(info)
        raise ImageUntrusted("the tenant's sandbox kept being started from an image nothing vouches for")

    async def _remove_untrusted(self, info: SandboxInfo) -> None:
        """Stop a running sandbox whose image the keys no longer vouch for (DESIGN §13: after a
        leaked key is withdrawn, nothing made from its images serves on until idle)."""
        await self.backend.delete(info)
        details = {"reason": ImageUntrusted.reason, "image_digest": info.details.get("image_digest", "")}
        await self._on_event(AuditEvent.SANDBOX_STOPPED, info.tenant, info.backend_id, details)

    async def _remove(
        self, tenant: TenantId, *, reason: str, event: str = AuditEvent.SANDBOX_STOPPED
    ) -> None:
        info = self._sandboxes.pop(tenant, None)
        if info is None:
            return
        try:
            await self.backend.delete(info)
        finally:
            await self._on_event(event, tenant, info.backend_id, {"reason": reason})

    async def _idle_everywhere(self, info: SandboxInfo) -> bool:
        """Has no replica used the tenant's sandbox for the idle timeout? Asked of the shared
        record right before a stop. Each replica's record may lag its last use by `every`
        seconds: that is the margin. When another replica used it since, this replica takes
        that use as its own, and asks again only once it too is an idle timeout old."""
        idle = await self._use.idle_for(info.tenant)
        if idle is None or idle >= self._idle_timeout + self._use.every:
            return True
        info.last_used = max(info.last_used, self._clock() - idle)
        log.info("idle sandbox kept: used on a replica since", extra={"backend": self.backend.name})
        return False

    async def _reap_idle(self, *, force_one: bool = False) -> None:
        for tenant, count in self._inflight.items():
            if count:  # a long call (a GET stream) here: the other replicas see it as use
                self._use.touch(tenant, force=True)
        now = self._clock()
        idle = sorted(
            (s for s in self._sandboxes.values() if not self._inflight.get(s.tenant)),
            key=lambda s: s.last_used,
        )
        for info in idle:
            if now - info.last_used >= self._idle_timeout:
                await self._reap(info)
            elif force_one:
                return  # nothing idle enough: the cap holds

    async def _reap(self, info: SandboxInfo) -> None:
        """Stop an idle sandbox, if no replica has used it meanwhile. Under the tenant's create
        lock (after this replica's own, the order `ensure` takes them in): a peer starting or
        adopting it waits, and of peers reaping at once one stops it, the others let it go."""
        tenant = info.tenant
        async with (
            self._locks.setdefault(tenant, asyncio.Lock()),
            self._replicas.creating(tenant, self._start_timeout),
        ):
            if self._sandboxes.get(tenant) is not info or not await self._idle_everywhere(info):
                return
            if not await self.backend.alive(info):
                del self._sandboxes[tenant]  # a peer stopped it: that is in the peer's audit
                return
            await self._remove(tenant, reason="idle")

    async def _sync_with_engine(self, *, startup: bool = False) -> None:
        """Take on the sandboxes the engine runs that this replica does not know yet.

        At start-up every running, ready one is adopted, whichever replica started it. Later
        (each reaper pass) only those of replicas no longer alive, so that a crashed or
        stopped replica's sandboxes are reaped by idleness like any other. A sandbox that is
        not running and ready is removed only if the replica that started it is gone: a live
        peer may be starting it right now.
        """
        for info in await self.backend.discover():
            if not info.tenant or info.tenant in self._sandboxes:
                continue
            lock = self._locks.setdefault(info.tenant, asyncio.Lock())
            if lock.locked():
                # This replica is starting (or replacing) it right now: on Kubernetes a start
                # is still in the backend's create for seconds, and under load for longer
                # than a reaper interval. Seen live: 20 first calls at once, 18 Pods deleted.
                continue
            async with lock:  # free, so taken at once: a start that begins now waits for this one
                await self._sync_one(info, startup=startup)

    async def _sync_one(self, info: SandboxInfo, *, startup: bool) -> None:
        """Adopt one sandbox the engine runs and this replica does not know, or remove it; under
        the tenant's lock."""
        if info.tenant in self._sandboxes:
            return
        creator = str(info.details.get("replica", ""))
        peer = creator != self._replicas.me and self._replicas.alive(creator)
        if peer and not startup:
            return
        if (
            info.endpoint is not None
            and info.state is SandboxState.RUNNING
            and await self.backend.alive(info)
            and await wait_ready(info.endpoint, 0.05 if peer else 2.0)
        ):
            if not await self.backend.vouched_for(info):
                await self._remove_untrusted(info)  # a live peer's too: no replica may serve it
                return
            idle = await self._use.idle_for(info.tenant)
            info.state = SandboxState.RUNNING
            info.last_used = self._clock() - (idle or 0.0)
            self._sandboxes[info.tenant] = info
            log.info("adopted sandbox", extra={"backend": self.backend.name})
        elif not peer:
            await self.backend.delete(info)

    async def _reap_forever(self) -> None:
        interval = max(0.5, min(self._idle_timeout / 4, 30.0))
        while True:
            await asyncio.sleep(interval)
            try:
                await self._sync_with_engine()
                await self._reap_idle()
            except RuntimeErrorBase as exc:
                # The engine away (a daemon restarting, an API server down) is an operating
                # condition, said in one line; the next pass tries again.
                log.warning(
                    "reaper pass skipped: %s (%s)",
                    exc.reason,
                    type(exc).__name__,
                    extra={"backend": self.backend.name},
                )
            except Exception:
                log.exception("reaper pass failed")


class Lease:
    """A tenant's sandbox held for one call (a class, not a generator: every call enters one)."""

    __slots__ = ("_runtime", "_tenant")

    def __init__(self, runtime: Runtime, tenant: TenantId) -> None:
        self._runtime = runtime
        self._tenant = tenant

    async def __aenter__(self) -> RunningSandbox:
        return await self._runtime._acquire(self._tenant)

    async def __aexit__(self, *_: object) -> None:
        self._runtime._release(self._tenant)
