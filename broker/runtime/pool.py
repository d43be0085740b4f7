"""A few started, tenant-less sandboxes, so a tenant's first call skips the ~1 s warm-up.

    pool = WarmPool(size=1, start=start_one, remove=remove_one)   # the backend's two functions
    pool.fill()                 # background: keep `size` slots warm
    slot = await pool.take()    # a warm slot (or the one warming up), or None: start cold
    ...                         # bind it to a tenant (server/binding.py); pool refills itself

The pool knows nothing of containers: the backend starts and removes slots. A slot that fails
to start is retried with a growing pause; after `max_failures` failures in a row the pool turns
itself off (callers then start sandboxes cold, as before) and says why in `describe()`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

log = logging.getLogger("docbroker.runtime.pool")


@dataclass
class Slot:
    """One warm sandbox waiting for a tenant. Paths are on the broker's host."""

    sandbox_id: str
    run_dir: str
    bind_socket: str
    mcp_socket: str
    # The image digest it was started from: a slot warmed before the configured image moved
    # is dropped, never bound (the backend compares it with the digest of the moment).
    image: str = ""


class WarmPool:
    def __init__(
        self,
        *,
        size: int,
        start: Callable[[], Awaitable[Slot]],
        remove: Callable[[Slot], Awaitable[None]],
        max_failures: int = 3,
        off_reason: str | None = None,
    ) -> None:
        """`off_reason` keeps the pool off from the start (the caller knows it cannot work)."""
        self._size = size
        self._start = start
        self._remove = remove
        self._max_failures = max_failures
        self._ready: list[Slot] = []
        self._warming: set[asyncio.Task[Slot | None]] = set()
        self._failures = 0
        self._off_reason = off_reason or (None if size > 0 else "disabled")
        self._closed = False

    # -- the surface --------------------------------------------------------------------------

    def fill(self) -> None:
        """Start warming slots until `size` are ready or warming (no-op when off or closed)."""
        if self._off_reason is not None or self._closed:
            return
        for _ in range(self._size - len(self._ready) - len(self._warming)):
            task = asyncio.create_task(self._warm_one(), name="sandbox-pool-warm")
            self._warming.add(task)
            task.add_done_callback(self._warmed)

    async def take(self, *, wait: float = 10.0) -> Slot | None:
        """A warm slot for a tenant, refilling behind it; None when the pool has nothing to give.

        With no slot ready, the one warming up is awaited (it started earlier than a cold start
        would, so it is usually ready sooner), but for `wait` seconds at the most.
        """
        if not self._ready and self._warming:
            await asyncio.wait(set(self._warming), timeout=wait, return_when=asyncio.FIRST_COMPLETED)
        slot = self._ready.pop(0) if self._ready else None
        self.fill()
        return slot

    async def discard(self, slot: Slot, *, why: str) -> None:
        """A taken slot that could not be bound: remove it, and count it as a failure."""
        await self._remove_quietly(slot)
        self._failed(why)

    async def drop(self, slot: Slot) -> None:
        """A taken slot that is sound but stale (started from an image since replaced): remove
        it without counting a failure; the refill `take()` began starts from the current one."""
        await self._remove_quietly(slot)

    def describe(self) -> dict[str, Any]:
        state = "off" if self._off_reason else "on"
        facts: dict[str, Any] = {
            "size": self._size,
            "state": state,
            "ready": len(self._ready),
            "warming": len(self._warming),
        }
        if self._off_reason:
            facts["reason"] = self._off_reason
        return facts

    async def close(self) -> None:
        self._closed = True
        for task in list(self._warming):
            task.cancel()
        for task in list(self._warming):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        while self._ready:
            await self._remove_quietly(self._ready.pop())

    # -- internals ----------------------------------------------------------------------------

    async def _warm_one(self) -> Slot | None:
        # A failing start backs off: 0 s, 1 s, 2 s, ... so a broken image does not spin.
        await asyncio.sleep(float(self._failures))
        try:
            slot = await self._start()
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            self._failed(f"a warm sandbox did not start ({exc.__class__.__name__})")
            return None
        if self._closed:
            await self._remove_quietly(slot)
            return None
        self._failures = 0
        # Ready and no longer warming in one step: a take() before this task's done-callback
        # must see the slot as ready, not as still warming, or its fill() would not replace it.
        self._warming.discard(asyncio.current_task())
        self._ready.append(slot)
        return slot

    async def _remove_quietly(self, slot: Slot) -> None:
        """Remove a slot; a failure is logged (by class) and does not stop the caller."""
        try:
            await self._remove(slot)
        except Exception as exc:
            log.warning("a warm sandbox could not be removed", extra={"error": type(exc).__name__})

    def _warmed(self, task: asyncio.Task[Slot | None]) -> None:
        self._warming.discard(task)
        if not task.cancelled() and task.result() is None:
            self.fill()  # it failed: try again (fill() does nothing once the pool is off)

    def _failed(self, why: str) -> None:
        self._failures += 1
        if self._failures >= self._max_failures and self._off_reason is None:
            self._off_reason = why
            log.warning("sandbox pool off: sandboxes start cold", extra={"reason": why})
