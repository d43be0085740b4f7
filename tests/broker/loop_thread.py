"""An asyncio server on an event loop of its own, in a thread: for the proxies a synchronous test
puts on a path (tests/broker/forwarding_proxy.py, tests/broker/pg_lost_answer.py).

    with Proxy(...) as proxy:    # a subclass: `_start` opens its server on the loop
        ...                      # the test drives real clients through it meanwhile
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine
from types import TracebackType
from typing import Any, Self


class LoopThread:
    def __init__(self) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._server: asyncio.Server | None = None

    async def _start(self) -> asyncio.Server:
        raise NotImplementedError

    def __enter__(self) -> Self:
        self._thread.start()
        self._server = asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(10)
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        asyncio.run_coroutine_threadsafe(self._stop(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()

    async def _stop(self) -> None:
        assert self._server is not None
        self._server.close()
        await self._server.wait_closed()


async def first(*steps: Coroutine[Any, Any, object]) -> None:
    """Run `steps` (a proxy's directions of one connection) until one ends; cancel the others."""
    tasks = [asyncio.ensure_future(step) for step in steps]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
