"""The gateway's call deadlines (`broker.upstream.deadlines`): one shared tick instead of a timer per call.

The deadline is wall time, and a CI host may stall this process for a few hundred ms (one run
did, during `sleep(0.05)` inside a 0.2 s deadline, which then rightly expired). So an exchange
meant to finish inside its deadline has seconds of margin or never suspends, and an overrun
is checked to end long before the exchange would have (30 s), not to the tick: how late a
deadline fires is a speed question for bench/, not a unit test."""

from __future__ import annotations

import asyncio
import time

import pytest
import uvloop

from broker.upstream import UpstreamTimeout
from broker.upstream.deadlines import Deadlines

TICK = 0.05
ENDED_EARLY = 5.0  # an overrun of a 30 s exchange ends well before this


async def _overrun(deadlines: Deadlines, seconds: float) -> float:
    started = time.monotonic()
    with pytest.raises(UpstreamTimeout):
        async with deadlines.within(seconds):
            await asyncio.sleep(30)
    return time.monotonic() - started


def test_a_passed_deadline_ends_the_exchange_within_a_tick() -> None:
    async def main() -> None:
        deadlines = Deadlines(TICK)
        waited = await _overrun(deadlines, 0.2)
        # uvloop keeps its clock in whole milliseconds: a timer may fire up to 1 ms before
        # time.monotonic() says it is due.
        assert 0.2 - 0.002 <= waited < ENDED_EARLY
        # Nothing stays cancelled: the task goes on and can wait again.
        await asyncio.sleep(0.01)
        assert asyncio.current_task().cancelling() == 0  # type: ignore[union-attr]

    uvloop.run(main())


def test_an_exchange_inside_its_deadline_is_left_alone() -> None:
    async def main() -> None:
        deadlines = Deadlines(TICK)
        async with deadlines.within(0.2):
            pass  # done without suspending: no tick can run inside, however loaded the host
        assert not deadlines._due
        await asyncio.sleep(0.4)  # well past the deadline: no late cancellation arrives
        async with deadlines.within(5):
            await asyncio.sleep(0.05)  # suspended inside, with seconds to spare
        assert not deadlines._due

    uvloop.run(main())


def test_many_exchanges_expire_on_their_own_deadlines() -> None:
    async def main() -> None:
        deadlines = Deadlines(TICK)
        finished: dict[float, str] = {}

        async def exchange(seconds: float, lasts: float) -> None:
            try:
                async with deadlines.within(seconds):
                    await asyncio.sleep(lasts)
                finished[seconds] = "done"
            except UpstreamTimeout:
                finished[seconds] = "timeout"

        await asyncio.gather(exchange(0.1, 5), exchange(3, 0.05), exchange(0.4, 5), exchange(5, 0.2))
        assert finished == {0.1: "timeout", 3: "done", 0.4: "timeout", 5: "done"}

    uvloop.run(main())


def test_a_cancellation_from_outside_is_not_mistaken_for_a_timeout() -> None:
    async def main() -> None:
        deadlines = Deadlines(TICK)

        async def exchange() -> None:
            async with deadlines.within(10):
                await asyncio.sleep(30)

        task = asyncio.ensure_future(exchange())
        await asyncio.sleep(0.05)
        task.cancel()  # the client went away
        with pytest.raises(asyncio.CancelledError):
            await task
        assert not deadlines._due

    uvloop.run(main())


def test_one_deadlines_object_serves_one_event_loop_after_another() -> None:
    deadlines = Deadlines(TICK)

    async def quick() -> None:
        async with deadlines.within(10):
            pass  # done before the first tick: the loop closes with that tick still scheduled

    uvloop.run(quick())
    assert deadlines._ticking is not None
    assert uvloop.run(_overrun(deadlines, 0.1)) < ENDED_EARLY
