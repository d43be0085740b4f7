"""uvicorn's server, awake only when there is something to do.

uvicorn's main loop wakes ten times a second to see whether it should stop. An idle sandbox
spent ~2 ms of CPU a second on that alone (bench/scale.py: 300 idle tenants, 0.6 of a core of
a 2-core host before any call). This one looks once a second, and at once when a signal asks
it to stop: the handler wakes the loop. (The sandboxes send no Date header, the one thing the
tick also refreshed; `on_tick` is still called with the counter it expects, a second's ten
ticks at a time.)
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
from types import FrameType

import uvicorn

TICK_SECONDS = 1.0


class QuietServer(uvicorn.Server):
    def __init__(self, config: uvicorn.Config) -> None:
        super().__init__(config)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._wake: asyncio.Event | None = None

    async def main_loop(self) -> None:
        # Serving now: the SDK, the app and the tenant's tools live as long as the sandbox, and
        # each full collection would walk them all (~115k objects, ~35 ms): frozen, it skips
        # them. Only freeze (it moves lists: no time) and no collection first: this runs as a
        # pooled sandbox's first call waits (its warm-up collected before the binding).
        gc.freeze()
        self._loop, self._wake = asyncio.get_running_loop(), asyncio.Event()
        counter = 0
        while not await self.on_tick(counter):
            counter = (counter + 10) % 864_000  # uvicorn counts tenths of a second
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), TICK_SECONDS)

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        super().handle_exit(sig, frame)
        # A signal handler runs between the loop's steps, not in one: wake it through its pipe.
        if self._loop is not None and self._wake is not None and not self._loop.is_closed():
            self._loop.call_soon_threadsafe(self._wake.set)
