"""The keeper's turns (`broker/keeper/turns.py`) on real files: what runs in a turn finishes
before the next turn begins, however the turn ends, and a waiter that gives up holds nothing.

The accept in flight is the real `ReportFiles.accept`, held at its start by an event the test
lets go: a thread cannot be stopped, so a turn that ended under it must wait for it."""

from __future__ import annotations

import asyncio
import hashlib
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import pytest

from broker.approvals.reports import Accepted, ReportFiles, Swept
from broker.keeper.turns import Busy, TurnOver, Turns

pytestmark = pytest.mark.anyio
_T = TypeVar("_T")

APPROVED = b"# Q3\napproved\n"
SHA = hashlib.sha256(APPROVED).hexdigest()
# How long a turn that must wait is given to get in anyway. Only a negative's window: a slower
# machine makes the check less sensitive, never wrong (on the code before, it got in at once).
WINDOW = 0.5


class Hold:
    """Work that says it started, then waits to be let go."""

    def __init__(self) -> None:
        self._started = threading.Event()
        self._go = threading.Event()

    def then(self, fn: Callable[..., _T], *args: Any) -> Callable[[], _T]:
        def held() -> _T:
            self._started.set()
            self._go.wait(timeout=60)
            return fn(*args)

        return held

    async def started(self) -> None:
        assert await asyncio.to_thread(self._started.wait, 30), "the held work never started"

    def release(self) -> None:
        self._go.set()


def dropped(tmp_path: Path) -> ReportFiles:
    """A drop-box holding the approved file, as the sandbox leaves it (mode 0o040)."""
    for folder in ("dropbox", "reports"):
        (tmp_path / folder).mkdir()
    (tmp_path / "dropbox").chmod(0o1733)
    report = tmp_path / "dropbox" / "q3.md"
    report.write_bytes(APPROVED)
    report.chmod(0o040)
    return ReportFiles(tmp_path / "dropbox", tmp_path / "reports", tmp_path / "quarantine")


async def test_a_lease_that_runs_out_mid_accept_hands_the_turn_on_only_after_it(tmp_path: Path) -> None:
    files, hold = dropped(tmp_path), Hold()
    turns = Turns()
    held = await turns.lease(0.2)
    accepting = asyncio.create_task(turns.within(held, hold.then(files.accept, "q3.md", SHA)))
    await hold.started()
    async with asyncio.timeout(30):
        while turns.is_held(held):  # until the lease's own timer has ended the turn
            await asyncio.sleep(0.01)
    with pytest.raises(TurnOver):  # nothing new enters the ended turn
        await turns.within(held, files.sweep)
    another = asyncio.create_task(turns.run(files.sweep))  # e.g. another replica's sweep
    done, _ = await asyncio.wait({another}, timeout=WINDOW)
    assert not done, "a turn began while the ended turn's accept still ran"
    hold.release()
    assert await accepting is Accepted.OK
    assert await another == Swept()  # nothing left to sweep: the report landed first
    assert (tmp_path / "reports" / "q3.md").read_bytes() == APPROVED


async def test_the_saves_sweep_waits_for_its_own_accept_still_running(tmp_path: Path) -> None:
    """The broker gave up on its accept (its timeout) and goes on to the sweep that ends the
    save; the keeper's accept still runs, and the sweep must not take the file from under it."""
    files, hold = dropped(tmp_path), Hold()
    turns = Turns()
    held = await turns.lease(60)
    accepting = asyncio.create_task(turns.within(held, hold.then(files.accept, "q3.md", SHA)))
    await hold.started()

    async def sweep_after() -> Swept:  # as the keeper's /v1/sweep with the turn
        try:
            return await turns.within(held, files.sweep)
        finally:
            turns.end(held)

    sweeping = asyncio.create_task(sweep_after())
    done, _ = await asyncio.wait({sweeping}, timeout=WINDOW)
    assert not done, "the sweep ran while the accept of its turn still ran"
    hold.release()
    assert await accepting is Accepted.OK
    assert await sweeping == Swept()
    assert (tmp_path / "reports" / "q3.md").read_bytes() == APPROVED
    turns.end(await turns.lease(60))  # and the turn is free again


@pytest.mark.parametrize("steps", range(5))
async def test_a_waiter_cancelled_as_the_turn_reaches_it_holds_nothing(steps: int) -> None:
    """Cancelled in the same step the turn is handed over, or a few loop steps later: either
    the cancellation wins and the turn is free, or the waiter had it before (cancel() says so)."""
    turns = Turns(wait_seconds=2)
    held = await turns.lease(60)
    waiter = asyncio.create_task(turns.lease(60))
    for _ in range(3):  # its first steps: it is waiting for the turn now
        await asyncio.sleep(0)
    assert not waiter.done()
    turns.end(held)  # the turn goes to the waiter...
    for _ in range(steps):
        await asyncio.sleep(0)
    requested = waiter.cancel()  # ...as its caller is cancelled
    assert requested or steps > 0  # with no step between, the race is entered for sure
    (outcome,) = await asyncio.gather(waiter, return_exceptions=True)
    if requested:
        assert isinstance(outcome, asyncio.CancelledError), "a cancelled waiter was given the turn"
    else:
        assert isinstance(outcome, str)
        turns.end(outcome)  # it got the turn before the cancel: it ends it, as its caller would
    turns.end(await turns.lease(60))  # free: Busy here would be a turn held by no one


async def test_a_waiter_that_times_out_leaves_the_turn_to_its_holder() -> None:
    turns = Turns(wait_seconds=0.05)
    held = await turns.lease(60)
    with pytest.raises(Busy):
        await turns.lease(60)
    with pytest.raises(Busy):
        await turns.run(int)
    assert turns.is_held(held) and await turns.within(held, int) == 0
    turns.end(held)
    turns.end(await turns.lease(60))
