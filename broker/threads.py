"""Blocking work in a worker thread that a cancelled caller still waits out."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from concurrent.futures import Executor
from typing import Any, TypeVar

_T = TypeVar("_T")


async def to_thread_to_the_end(fn: Callable[..., _T], *args: Any) -> _T:
    """`asyncio.to_thread`, but a cancelled caller still waits for the thread to finish.

    A cancelled `to_thread` leaves its thread running, and what it does (a container created,
    a file moved) would happen after the caller's clean-up. Here the cancellation is re-raised
    only once the thread is done, so the caller's clean-up comes after everything it could undo.
    """
    return await _to_the_end(asyncio.ensure_future(asyncio.to_thread(fn, *args)))


async def in_pool_to_the_end(pool: Executor, fn: Callable[..., _T], *args: Any) -> _T:
    """The same, on a pool of the caller's own (a backend whose calls must not wait for the
    default executor's few threads)."""
    return await _to_the_end(asyncio.get_running_loop().run_in_executor(pool, fn, *args))


async def _to_the_end(job: asyncio.Future[_T]) -> _T:
    try:
        return await asyncio.shield(job)
    except asyncio.CancelledError:
        # The job's own result or error no longer matters (the caller undoes what it did);
        # a second cancellation must not cut this wait short either.
        with contextlib.suppress(BaseException):
            await job
        raise
