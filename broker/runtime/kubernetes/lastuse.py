"""Last use of a tenant's Pod, shared by every replica: an annotation on the Pod itself.

    metadata.annotations["docbroker.io/last-used"] = "2026-12-01T21:04:05.123Z"   (UTC)

Replicas on a cluster share no folder (`FolderUse`), and each one reaping by its own last use
deleted the Pod another replica was using (a save in flight then ended `result_unknown`). So:

- The Pod is created with the annotation (the start is a use), and the replica serving a
  call patches it (a JSON merge patch of that one key) at most once every `every` seconds per
  tenant, in the background: a call never waits on the API for it. Patches of one tenant go
  one at a time and always send this replica's latest use, so a slow one is never overtaken
  by an older one from here.
- A reaper reads it from the API right before it deletes (`idle_for`). A Pod without it (made
  by an older broker) counts from its creation, by the API's clock.

The time is the writing replica's wall clock, compared with the reader's: replicas' clocks
must agree to within a few seconds (NTP), well inside the reaper's margin. Only the broker may
write it: tenant Pods hold no API token (`automountServiceAccountToken: false`), so a sandbox
cannot keep itself alive.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any

from broker.runtime.host_replicas import SharedUse

log = logging.getLogger("docbroker.runtime.kubernetes")

# Send `when` (wall clock) as the tenant's last use: a merge patch of the tenant's Pod.
PatchFn = Callable[[str, float], Awaitable[None]]
# The tenant's Pod (API object) or None when there is none.
ReadFn = Callable[[str], Awaitable[Any]]


def stamp(when: float) -> str:
    """A wall-clock time as the annotation's value (RFC 3339, UTC, milliseconds)."""
    return datetime.fromtimestamp(when, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def parse_stamp(value: object) -> float | None:
    """The annotation's value as a wall-clock time; None when it is not one of ours."""
    if not isinstance(value, str) or len(value) > 40:
        return None
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError:
        return None
    if parsed.tzinfo is None:
        return None
    return parsed.timestamp()


def last_use_of(pod: Any, annotation: str) -> float | None:
    """When the Pod was last used, by its annotation, else its creation (the API's clock)."""
    meta = getattr(pod, "metadata", None)
    if meta is None:
        return None
    used = parse_stamp((meta.annotations or {}).get(annotation))
    if used is not None:
        return used
    created = meta.creation_timestamp
    return created.timestamp() if isinstance(created, datetime) else None


class PodAnnotationUse(SharedUse):
    """`SharedUse` on a cluster: the tenant's Pod's `docbroker.io/last-used` annotation."""

    def __init__(self, every: float, *, patch: PatchFn, read: ReadFn, annotation: str) -> None:
        super().__init__(every)
        self._patch = patch
        self._read = read
        self._annotation = annotation
        self._sent: dict[str, float] = {}  # tenant -> monotonic time of this replica's last patch
        self._latest: dict[str, float] = {}  # tenant -> wall time of this replica's latest use
        self._writers: dict[str, asyncio.Task[None]] = {}
        self._again: set[str] = set()

    def touch(self, tenant: str, *, force: bool = False) -> None:
        now = time.monotonic()
        self._latest[tenant] = time.time()
        last = self._sent.get(tenant)
        if not force and last is not None and now - last < self.every:
            return
        self._sent[tenant] = now
        if tenant in self._writers:
            self._again.add(tenant)  # the running writer sends once more, with this use
            return
        self._writers[tenant] = asyncio.get_running_loop().create_task(
            self._write(tenant), name="sandbox-last-use"
        )

    async def _write(self, tenant: str) -> None:
        try:
            while True:
                self._again.discard(tenant)
                try:
                    await self._patch(tenant, self._latest[tenant])
                except Exception as exc:
                    # No Pod yet (a start's first touch) or the API failing: a reaper then sees
                    # an older use, and the next touch past `every` tries again.
                    log.warning("sandbox last use not recorded (%s)", type(exc).__name__)
                if tenant not in self._again:
                    return
        finally:
            self._writers.pop(tenant, None)

    async def idle_for(self, tenant: str) -> float | None:
        try:
            pod = await self._read(tenant)
        except Exception as exc:
            # Cannot tell: the safe side is "just used" (this pass keeps it; the next one asks).
            log.warning("sandbox last use not readable (%s): kept", type(exc).__name__)
            return 0.0
        if pod is None:
            return None
        used = last_use_of(pod, self._annotation)
        return None if used is None else max(0.0, time.time() - used)

    async def close(self) -> None:
        writers = list(self._writers.values())
        for task in writers:
            with contextlib.suppress(Exception):
                await task
