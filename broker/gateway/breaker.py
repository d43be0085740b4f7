"""A circuit breaker per tenant sandbox.

A sandbox that keeps failing to start or to answer would otherwise make every caller wait
out a start timeout or a call timeout. After `threshold` consecutive failures the breaker
opens: calls are refused at once (503 with Retry-After) for `cooldown` seconds; then one trial
call is let through, and its outcome closes or re-opens the breaker.

`trip` opens it at once, whatever the count: for a sandbox the broker has just replaced
because its contract changed, so that a sandbox that changes again is not restarted on
every call (its successor starts with the trial call after the cool-down).

A trial ends with its outcome (`success`, `failure`) or, when the call ends without one (its
client left, the runtime was at capacity, the audit log failed, the call was refused), with
`release`: the next call is the trial. A trial older than `trial_timeout` (the call timeout)
no longer holds the others back either: a GET stream lives as long as its session, and an
exit this module never hears of must not lock the tenant out until a restart.
"""

from __future__ import annotations

import itertools
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum


class BreakerState(StrEnum):
    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half_open"


@dataclass(frozen=True)
class Ticket:
    """What `admit` says of one call."""

    wait: int  # 0: the call may proceed; else the seconds to wait (for Retry-After)
    trial: int = 0  # the trial's number if this call is the half-open trial, else 0


_GO = Ticket(0)


@dataclass
class _Circuit:
    failures: int = 0
    opened_at: float = 0.0
    state: BreakerState = BreakerState.CLOSED
    trial: int = 0  # the number of the trial running, 0 when none
    trial_began: float = 0.0


class CircuitBreakers:
    def __init__(
        self,
        *,
        threshold: int,
        cooldown: float,
        trial_timeout: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._threshold = threshold
        self._cooldown = cooldown
        self._trial_timeout = trial_timeout
        self._clock = clock
        self._circuits: dict[str, _Circuit] = {}
        # Trial numbers are never reused, not even by a tenant's next circuit: a late release
        # must not end a later trial.
        self._trials = itertools.count(1)

    def admit(self, tenant: str) -> Ticket:
        """Whether a call may proceed now, and whether it is the trial; a ticket with a trial
        must be given back to `release` when the call ends, whatever its end."""
        circuit = self._circuits.get(tenant)
        if circuit is None or circuit.state is BreakerState.CLOSED:
            return _GO
        now = self._clock()
        remaining = circuit.opened_at + self._cooldown - now
        if circuit.state is BreakerState.OPEN and remaining > 0:
            return Ticket(max(1, math.ceil(remaining)))
        if circuit.trial and now - circuit.trial_began < self._trial_timeout:
            return Ticket(1)  # one trial at a time
        circuit.state, circuit.trial, circuit.trial_began = BreakerState.HALF_OPEN, next(self._trials), now
        return Ticket(0, circuit.trial)

    def release(self, tenant: str, ticket: Ticket) -> None:
        """The call of `ticket` ended. If it was the running trial and no outcome was recorded,
        the trial ends without one: the breaker stays half-open and the next call is the trial."""
        circuit = self._circuits.get(tenant)
        if ticket.trial and circuit is not None and circuit.trial == ticket.trial:
            circuit.trial = 0

    def success(self, tenant: str) -> None:
        self._circuits.pop(tenant, None)

    def failure(self, tenant: str) -> None:
        circuit = self._circuits.setdefault(tenant, _Circuit())
        circuit.failures += 1
        circuit.trial = 0
        if circuit.state is BreakerState.HALF_OPEN or circuit.failures >= self._threshold:
            circuit.state, circuit.opened_at = BreakerState.OPEN, self._clock()

    def trip(self, tenant: str) -> None:
        circuit = self._circuits.setdefault(tenant, _Circuit())
        circuit.failures = max(circuit.failures, self._threshold)
        circuit.trial = 0
        circuit.state, circuit.opened_at = BreakerState.OPEN, self._clock()

    def cooldown_left(self, tenant: str) -> int:
        """Whole seconds until an open breaker lets a trial through (0 when it would now)."""
        circuit = self._circuits.get(tenant)
        if circuit is None or circuit.state is not BreakerState.OPEN:
            return 0
        return max(0, math.ceil(circuit.opened_at + self._cooldown - self._clock()))

    def state(self, tenant: str) -> BreakerState:
        circuit = self._circuits.get(tenant)
        return BreakerState.CLOSED if circuit is None else circuit.state
