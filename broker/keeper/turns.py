"""The keeper's one turn on the files: held for a single request, or leased to a save.

A save spans several requests (`/v1/turn`, `/v1/accept`, `/v1/sweep`), so its turn is leased
under an id and ends with the save's last sweep, or when the lease runs out (a broker that
died mid-save). Two rules keep a file in flight safe:

- Work within a turn is counted, and the turn passes on only after the last of it is done.
  Ending a turn (the save's sweep, or the lease's timer) refuses new work under its id at once,
  but a sweep of the next turn must never move the file an accept of this one is still
  checking: its thread cannot be stopped, only waited for.
- Work within one turn takes turns too: a broker whose accept timed out on its side goes on to
  its sweep while the keeper's accept may still run.

Waiting for the turn awaits the lock directly, under `asyncio.timeout`, never
`wait_for(lock.acquire())`: that runs the acquire as a task of its own, and a caller cancelled
just as the lock was handed to that task got the turn anyway on Python 3.11 (the cancellation
swallowed: a lease granted to a caller that is gone; tests/broker/keeper/test_turns.py shows
it), and from 3.12, where wait_for awaits that task under a timeout, the acquired lock can be
dropped with the task's result (held by no one, for good). Awaited directly, a cancellation
lands in `Lock.acquire` itself, which passes the lock on.
"""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import Callable
from typing import Any, TypeVar

from broker.threads import to_thread_to_the_end

_T = TypeVar("_T")
TURN_WAIT_SECONDS = 30.0  # a turn waited for longer: Busy (503), the save goes on as "result unknown"


class Busy(Exception):
    """No turn came within the wait."""


class TurnOver(Exception):
    """The id names no turn that is held: it ended, its lease ran out, or it never was."""


class Turns:
    def __init__(self, *, wait_seconds: float = TURN_WAIT_SECONDS) -> None:
        self._wait = wait_seconds
        self._lock = asyncio.Lock()  # the turn
        self._files = asyncio.Lock()  # within a leased turn, one piece of work at a time
        self._holder: str | None = None  # the leased turn's id, while it lasts
        self._lease: asyncio.TimerHandle | None = None
        self._within = 0  # work of the leased turn not finished (running or waiting its go)
        self._handing_over = False  # ended with work still running: the last of it passes on

    async def run(self, fn: Callable[..., _T], *args: Any) -> _T:
        """`fn` in a turn of its own, once no save holds one."""
        await self._take()
        try:
            return await to_thread_to_the_end(fn, *args)
        finally:
            self._lock.release()

    async def lease(self, seconds: float) -> str:
        """A turn for a save, under a new id, until `end(id)` or for `seconds` at most."""
        await self._take()
        turn = secrets.token_hex(16)
        self._holder = turn
        self._lease = asyncio.get_running_loop().call_later(seconds, self.end, turn)
        return turn

    async def within(self, turn: str, fn: Callable[..., _T], *args: Any) -> _T:
        """`fn` within the leased `turn`; TurnOver once that turn has ended."""
        self._held(turn)
        self._within += 1
        try:
            async with self._files:
                self._held(turn)  # it may have ended while this waited for the work before it
                return await to_thread_to_the_end(fn, *args)
        finally:
            self._within -= 1
            if self._within == 0 and self._handing_over:
                self._handing_over = False
                self._lock.release()

    def end(self, turn: str) -> None:
        """End the leased `turn` (its id only: a stale timer or a replayed id ends nothing).
        No new work enters it from here; the next turn begins when its running work is done."""
        if not self.is_held(turn):
            return
        self._holder = None
        if self._lease is not None:
            self._lease.cancel()
            self._lease = None
        if self._within:
            self._handing_over = True
        else:
            self._lock.release()

    def _held(self, turn: str) -> None:
        if not self.is_held(turn):
            raise TurnOver

    def is_held(self, turn: str) -> bool:
        """Is `turn` the leased turn, still on? (False once it ended, by its save or its lease.)"""
        # compare_digest raises TypeError on a str with non-ASCII characters (a 500): no id has them.
        held = self._holder
        return held is not None and turn.isascii() and secrets.compare_digest(turn, held)

    async def _take(self) -> None:
        try:
            async with asyncio.timeout(self._wait):
                await self._lock.acquire()
        except TimeoutError:
            raise Busy from None
