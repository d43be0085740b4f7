"""Deadlines for whole exchanges with the sandbox, checked on one shared tick (one per gateway)."""

from __future__ import annotations

import asyncio
from types import TracebackType

from broker.upstream.errors import UpstreamTimeout


class Deadlines:
    """Deadlines for whole exchanges, checked on one shared tick rather than a timer per call.

    The HTTP client's timeout bounds each read only, so a sandbox that keeps sending bytes (SSE
    comments, a trickle) would otherwise hold a call forever; expiry is reported like any other
    upstream timeout. A timer per call (`asyncio.timeout`) costs several times what an entry
    here costs; a deadline may pass up to one tick late, which a deadline of seconds does not
    mind. The tick runs only while a deadline is pending.

        async with deadlines.within(30.0):
            ...   # cancelled when 30 s have passed; raises UpstreamTimeout
    """

    def __init__(self, tick_seconds: float = 0.1) -> None:
        self._tick = tick_seconds
        self._due: dict[Deadline, float] = {}
        self._ticking: asyncio.TimerHandle | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def within(self, seconds: float) -> Deadline:
        return Deadline(self, seconds)

    def _add(self, deadline: Deadline, seconds: float) -> None:
        loop = asyncio.get_running_loop()
        self._due[deadline] = loop.time() + seconds
        if self._ticking is None or self._loop is not loop:  # (tests run one loop after another)
            self._loop = loop
            self._ticking = loop.call_later(self._tick, self._check)

    def _remove(self, deadline: Deadline) -> None:
        self._due.pop(deadline, None)

    def _check(self) -> None:
        self._ticking = None
        if self._loop is None:
            return
        now = self._loop.time()
        for deadline, when in list(self._due.items()):
            if when <= now:
                del self._due[deadline]
                deadline.expire()
        if self._due:
            self._ticking = self._loop.call_later(self._tick, self._check)


class Deadline:
    """One exchange's deadline (see `Deadlines`); cancels its task, as `asyncio.timeout` does."""

    __slots__ = ("_cancelling", "_expired", "_owner", "_seconds", "_task")

    def __init__(self, owner: Deadlines, seconds: float) -> None:
        self._owner = owner
        self._seconds = seconds
        self._expired = False

    async def __aenter__(self) -> None:
        task = asyncio.current_task()
        if task is None:
            raise RuntimeError("a deadline needs a task")
        self._task = task
        self._cancelling = task.cancelling()
        self._owner._add(self, self._seconds)

    def expire(self) -> None:
        self._expired = True
        self._task.cancel()

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if not self._expired:
            self._owner._remove(self)
            return
        # Our own cancellation: take it back, and say what happened (as asyncio.timeout does).
        if self._task.uncancel() <= self._cancelling and exc_type is asyncio.CancelledError:
            raise UpstreamTimeout("call deadline passed") from None
