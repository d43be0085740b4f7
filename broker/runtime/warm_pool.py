"""Started, tenant-less sandboxes, so a tenant's first call skips the ~1 s warm-up; as many as
new tenants arrive for (broker/runtime/warm_pool_sizer.py), between a floor and a cap.

    pool = WarmPool(sizer=PoolSizer(...), start=slots.start, remove=slots.remove)  # docker/warm_slots.py
    pool.fill()                 # background: keep the sizer's target of slots warm
    slot = await pool.take()    # a warm slot, or one started for this caller; None: start cold
    ...                         # bind it to a tenant (server/binding.py); pool refills itself
                                # (once takes pause: the tenants' first calls go first)

The pool knows nothing of containers: its callbacks (the Docker backend's warm slots) start
and remove them. Every new tenant
is an arrival the sizer counts: a burst raises the target, and spares beyond it (the target
falls back once no new tenant came for the idle time) are removed.

A caller that finds no slot ready waits for one already warming (it started earlier than a
cold start would) or starts one of its own and waits for that: a burst of N new tenants costs
N starts, not N cold starts plus the refills racing them for the CPU. Refills wait until no
caller does. A slot that fails to start is retried with a growing pause; after `max_failures`
failures in a row the pool turns itself off (callers then start sandboxes cold, as before)
and says why in `describe()`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from broker.runtime.warm_pool_sizer import PoolSizer

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
        sizer: PoolSizer,
        start: Callable[[], Awaitable[Slot]],
        remove: Callable[[Slot], Awaitable[None]],
        max_failures: int = 3,
        off_reason: str | None = None,
        refills_at_once: int = 2,
        refill_pause: float = 0.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """`off_reason` keeps the pool off from the start (the caller knows it cannot work).
        `refills_at_once`: spares started together, at most (the host's CPUs: a start is
        CPU-bound, so more at once fill the pool no sooner, and slow the tenants' calls).
        `refill_pause`: seconds without a take before refills start: the tenants just given a
        slot are making their first calls, and a spare's start (the interpreter, its imports,
        the runtime's create) would take its CPU from them. Callers that find no slot ready
        still start one at once; only spares wait."""
        self._sizer = sizer
        self._start = start
        self._remove = remove
        self._max_failures = max_failures
        self._refills_at_once = refills_at_once
        self._refill_pause = refill_pause
        self._clock = clock
        self._last_take = float("-inf")
        self._paused: asyncio.Task[None] | None = None  # the fill() due once the pause is over
        self._ready: list[Slot] = []
        self._warming: set[asyncio.Task[Slot | None]] = set()
        # Callers waiting for a slot, first come first served; never more than slots warming.
        self._waiters: deque[asyncio.Future[Slot | None]] = deque()
        self._trimmer: asyncio.Task[None] | None = None
        self._changed = asyncio.Event()  # wakes the trimmer: a new tenant, a slot warm
        self._failures = 0
        self._last_failure = float("-inf")  # when the last counted failure was seen
        self._off_reason = off_reason or (None if sizer.cap > 0 else "disabled")
        self._closed = False

    # -- the surface --------------------------------------------------------------------------

    def fill(self) -> None:
        """Start warming slots towards the target, a few at a time (each one warm calls this
        again); a no-op when off or closed, and while callers wait: the slots warming are
        theirs first, and a refill would only slow them."""
        if self._off_reason is not None or self._closed:
            return
        if self._trimmer is None:
            self._trimmer = asyncio.create_task(self._trim_forever(), name="sandbox-pool-trim")
        if self._waiters:
            return
        pause = self._last_take + self._refill_pause - self._clock()
        if pause > 0:
            if self._paused is None:
                self._paused = asyncio.create_task(self._fill_after(), name="sandbox-pool-pause")
            return
        missing = self._sizer.target() - len(self._ready) - len(self._warming)
        for _ in range(min(missing, self._refills_at_once - len(self._warming))):
            self._start_one()

    async def take(self, *, wait: float = 60.0) -> Slot | None:
        """A warm slot for a tenant, refilling behind it; None when the pool has nothing to give.

        With no slot ready, the caller waits, `wait` seconds at the most, for a slot warming
        that no earlier caller waits for, or else for one started now for it.
        """
        if self._off_reason is not None or self._closed:
            return None
        self._sizer.arrived()
        self._changed.set()
        self._last_take = self._clock()
        if self._ready:
            slot = self._ready.pop(0)
            self.fill()
            return slot
        if len(self._warming) <= len(self._waiters):
            self._start_one()
        waiter: asyncio.Future[Slot | None] = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        try:
            await asyncio.wait({waiter}, timeout=wait)
        except asyncio.CancelledError:
            self._withdraw(waiter)
            raise
        if not waiter.done():  # waited long enough: the slot, when it comes, is a spare
            self._withdraw(waiter)
            return None
        return waiter.result()

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
            "size": self._sizer.target() if state == "on" else 0,
            "floor": self._sizer.floor,
            "cap": self._sizer.cap,
            "peak": self._sizer.peak,
            "state": state,
            "ready": len(self._ready),
            "warming": len(self._warming),
            "waiting": len(self._waiters),
        }
        if self._off_reason:
            facts["reason"] = self._off_reason
        return facts

    async def close(self) -> None:
        self._closed = True
        self._release_waiters(0)
        tasks = [*self._warming, *(t for t in (self._trimmer, self._paused) if t is not None)]
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        while self._ready:
            await self._remove_quietly(self._ready.pop())

    # -- internals ----------------------------------------------------------------------------

    async def _fill_after(self) -> None:
        """Sleep out the refill pause (longer if takes kept coming), then fill."""
        try:
            while (pause := self._last_take + self._refill_pause - self._clock()) > 0:
                await asyncio.sleep(pause)
        finally:
            self._paused = None
        self.fill()

    def _start_one(self) -> None:
        task = asyncio.create_task(self._warm_one(), name="sandbox-pool-warm")
        self._warming.add(task)
        task.add_done_callback(self._warmed)

    async def _warm_one(self) -> Slot | None:
        # A failing start backs off: 0 s, 1 s, 2 s, ... so a broken image does not spin.
        await asyncio.sleep(float(self._failures))
        started = time.monotonic()
        try:
            slot = await self._start()
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            self._failed(f"a warm sandbox did not start ({exc.__class__.__name__})", started)
            return None
        if self._closed:
            await self._remove_quietly(slot)
            return None
        self._failures = 0
        self._sizer.warmed(time.monotonic() - started)
        # Handed over (or ready) and no longer warming in one step: a take() before this task's
        # done-callback must not count it as warming, or it would wait for a slot given away.
        self._warming.discard(asyncio.current_task())
        self._hand_over(slot)
        self.fill()  # the last waiter served: refill to the target
        return slot

    def _hand_over(self, slot: Slot) -> None:
        """To the first caller still waiting, else into the ready list (where the trimmer
        removes it if the target fell meanwhile)."""
        self._changed.set()
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(slot)
                return
        self._ready.append(slot)

    def _withdraw(self, waiter: asyncio.Future[Slot | None]) -> None:
        """A waiter that gave up (cancelled, or out of time): a slot already handed to it goes
        back to the pool; otherwise it leaves the queue."""
        if waiter.done() and not waiter.cancelled() and (slot := waiter.result()) is not None:
            self._hand_over(slot)
        else:
            waiter.cancel()
            with contextlib.suppress(ValueError):
                self._waiters.remove(waiter)
        self.fill()

    def _release_waiters(self, keep: int) -> None:
        """Wake the waiters beyond `keep` (the last come first) with nothing: they start cold."""
        while len(self._waiters) > keep:
            waiter = self._waiters.pop()
            if not waiter.done():
                waiter.set_result(None)

    async def _trim_forever(self) -> None:
        """Trims whenever a slot gets warm or the target may have fallen (the oldest arrival
        forgotten); asleep in between."""
        while True:
            self._changed.clear()
            await self._trim()
            if self._excess() > 0:
                continue  # the target fell again while spares were being removed
            due = self._sizer.seconds_to_change()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(None if due is None else due + 0.01):
                    await self._changed.wait()

    def _excess(self) -> int:
        """Ready spares above the target; none while callers wait (what warms is theirs)."""
        if self._waiters:
            return 0
        return min(len(self._ready), len(self._ready) + len(self._warming) - self._sizer.target())

    async def _trim(self) -> None:
        """Remove ready spares above the target (those warming stay: a caller may want them)."""
        excess = self._excess()
        if excess <= 0:
            return
        extra, self._ready = self._ready[:excess], self._ready[excess:]
        log.info("sandbox pool shrinks", extra={"removed": excess, "target": self._sizer.target()})
        for slot in extra:
            await self._remove_quietly(slot)

    async def _remove_quietly(self, slot: Slot) -> None:
        """Remove a slot; a failure is logged (by class) and does not stop the caller."""
        try:
            await self._remove(slot)
        except Exception as exc:
            log.warning("a warm sandbox could not be removed", extra={"error": type(exc).__name__})

    def _warmed(self, task: asyncio.Task[Slot | None]) -> None:
        self._warming.discard(task)
        if task.cancelled() or task.result() is not None:
            return
        # It failed: callers counting on it start cold; then try again (fill() does nothing once
        # the pool is off).
        self._release_waiters(len(self._warming))
        self.fill()

    def _failed(self, why: str, started: float | None = None) -> None:
        """Count a failure in a row; a start that began before the last counted failure is
        the same round (a burst's starts, all refused by a daemon overloaded for a moment):
        it counts once, or one busy moment would turn the pool off for good."""
        if started is not None and started < self._last_failure:
            return
        self._last_failure = time.monotonic()
        self._failures += 1
        if self._failures >= self._max_failures and self._off_reason is None:
            self._off_reason = why
            self._release_waiters(0)
            log.warning("sandbox pool off: sandboxes start cold", extra={"reason": why})
