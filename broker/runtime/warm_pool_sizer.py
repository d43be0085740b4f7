"""How many warm sandboxes to keep: enough for the new tenants that arrive while one warms up.

    sizer = PoolSizer(floor=1, cap=10, idle_seconds=600.0, clock=time.monotonic)
    sizer.arrived()              # a new tenant needed a sandbox (warm or cold)
    sizer.warmed(1.3)            # a spare took 1.3 s to become ready
    sizer.target()               # spares to keep now: floor <= target <= cap
    sizer.seconds_to_change()    # when target() may fall with no new arrival; None: it cannot

The rule: keep as many spares as the most new tenants that arrived within one warm-up time of
each other in the last `idle_seconds`. A spare taken is replaced only after a warm-up, so that
is how many a pool needs to hand out before its refills land. With steady arrivals at rate r it
is r x warm-up (Little's law); a burst counts whole, where an average of the rate (an EWMA)
would spread it thin and leave the next burst's tenants to start cold. Arrivals older than
`idle_seconds` are forgotten: with no new tenant for that long the pool is back at its floor
(the same time an idle tenant's sandbox is kept: a spare beyond the floor is an idle sandbox).

Pure bookkeeping with an injected clock: no tasks, no I/O (broker/runtime/warm_pool.py acts on it).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

# Before a spare has been timed: about what one takes on an idle host (bench/cold_start.py).
FIRST_WARM_UP_SECONDS = 1.0
# Bounds of the warm-up time the rule uses: a very fast start must still count arrivals
# a moment apart together; a daemon that hangs must not make every arrival of the last
# minutes one burst.
MIN_WARM_UP_SECONDS = 0.5
MAX_WARM_UP_SECONDS = 30.0
SMOOTHING = 0.3  # weight of the newest warm-up time in the running average
# Arrivals remembered, at most: a flood of new tenants cannot grow this without bound (and
# the target is capped long before this many arrivals matter).
MAX_ARRIVALS = 4096


class PoolSizer:
    def __init__(self, *, floor: int, cap: int, idle_seconds: float, clock: Callable[[], float]) -> None:
        if not 0 <= floor <= cap:
            raise ValueError("the pool's floor must be between 0 and its cap")
        self.floor = floor
        self.cap = cap
        self._idle = idle_seconds
        self._clock = clock
        self._arrivals: deque[float] = deque(maxlen=MAX_ARRIVALS)
        self._warm_up = FIRST_WARM_UP_SECONDS
        self.peak = floor  # the largest target so far (reported: how far the pool has grown)

    def arrived(self) -> None:
        self._arrivals.append(self._clock())
        self.peak = max(self.peak, self.target())

    def warmed(self, seconds: float) -> None:
        self._warm_up += SMOOTHING * (seconds - self._warm_up)

    @property
    def warm_up_seconds(self) -> float:
        return min(MAX_WARM_UP_SECONDS, max(MIN_WARM_UP_SECONDS, self._warm_up))

    def target(self) -> int:
        self._forget()
        return min(self.cap, max(self.floor, self._densest()))

    def seconds_to_change(self) -> float | None:
        """Seconds until the oldest remembered arrival is forgotten (the only thing that lowers
        the target without a new arrival), or None when nothing is remembered."""
        self._forget()
        if not self._arrivals:
            return None
        return max(0.0, self._arrivals[0] + self._idle - self._clock())

    def _forget(self) -> None:
        horizon = self._clock() - self._idle
        while self._arrivals and self._arrivals[0] <= horizon:
            self._arrivals.popleft()

    def _densest(self) -> int:
        """The most arrivals within one warm-up time of each other (a sliding window over the
        arrivals, which the clock only adds to in order)."""
        span = self.warm_up_seconds
        best = 0
        first = 0
        times = self._arrivals
        for last in range(len(times)):
            while times[last] - times[first] > span:
                first += 1
            best = max(best, last - first + 1)
        return best
