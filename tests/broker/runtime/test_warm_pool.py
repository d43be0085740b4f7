"""broker/runtime/pool.py: the warm pool's own bookkeeping, with real asyncio tasks.

The pool starts and removes slots through two functions the backend gives it; here they make
plain `Slot` records, so the tests reach the timing the Docker tests can only hit by chance.
"""

from __future__ import annotations

import asyncio
import itertools

from broker.runtime.pool import Slot, WarmPool


def _slot(n: int) -> Slot:
    return Slot(sandbox_id=f"s{n}", run_dir=f"/run/{n}", bind_socket="b", mcp_socket="m")


def test_a_slot_taken_while_its_start_is_finishing_is_replaced() -> None:
    """take() can run after a start put its slot in `_ready` but before the start's task is
    done: the pool must still refill (it once stayed empty for good, every tenant then cold)."""

    async def main() -> tuple[Slot | None, int]:
        numbers = itertools.count()
        handed_over = asyncio.Event()
        removed: list[Slot] = []

        async def start() -> Slot:
            # Wakes the taker now: it runs before the task's done-callbacks, as a request
            # arriving at that moment would.
            handed_over.set()
            return _slot(next(numbers))

        async def remove(slot: Slot) -> None:
            removed.append(slot)

        pool = WarmPool(size=1, start=start, remove=remove)
        pool.fill()
        await handed_over.wait()
        taken = await pool.take(wait=0)
        async with asyncio.timeout(5):
            while not pool.describe()["ready"]:
                await asyncio.sleep(0.01)
        ready = pool.describe()["ready"]
        await pool.close()
        assert len(removed) == 1  # the refill's slot, removed by close()
        return taken, ready

    taken, ready = asyncio.run(main())
    assert taken == _slot(0)
    assert ready == 1


def test_a_failed_start_is_retried_then_the_pool_turns_off() -> None:
    removed: list[Slot] = []

    async def main() -> dict[str, object]:
        attempts = 0

        async def start() -> Slot:
            nonlocal attempts
            attempts += 1
            raise OSError("the daemon said no")

        async def remove(slot: Slot) -> None:
            removed.append(slot)

        pool = WarmPool(size=1, start=start, remove=remove, max_failures=2)
        pool.fill()
        async with asyncio.timeout(5):  # backoff: 0 s, then 1 s
            while pool.describe()["state"] == "on":
                await asyncio.sleep(0.01)
        assert await pool.take(wait=0) is None  # off: callers start cold
        await pool.close()
        return {"attempts": attempts, **pool.describe()}

    facts = asyncio.run(main())
    assert facts["attempts"] == 2
    assert removed == []  # nothing was started, so nothing is removed
    assert facts["state"] == "off" and facts["ready"] == 0
    assert facts["reason"] == "a warm sandbox did not start (OSError)"
