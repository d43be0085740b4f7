"""A circuit breaker per tenant sandbox.

A sandbox that keeps failing to start or to answer would otherwise make every caller wait
out a start timeout or a call timeout. After `threshold` consecutive failures the breaker
opens: calls are refused at once (503 with Retry-After) for `cooldown` seconds; then one trial
call is let through, and its outcome closes or re-opens the breaker.

`trip` opens it at once, whatever the count: for a sandbox the broker has just replaced
because its contract changed, so that a sandbox that changes again is not restarted on
every call (its successor starts with the trial call after the cool-down).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum


class BreakerState(StrEnum):
    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half_open"


@dataclass
class _Circuit:
    failures: int = 0
    opened_at: float = 0.0
    state: BreakerState = BreakerState.CLOSED
    trial_running: bool = False


class CircuitBreakers:
    def __init__(
        self, *, threshold: int, cooldown: float, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._threshold = threshold
        self._cooldown = cooldown
        self._clock = clock
        self._circuits: dict[str, _Circuit] = {}

    def admit(self, tenant: str) -> int:
        """0 if a call may proceed, else the seconds to wait (for Retry-After)."""
        circuit = self._circuits.get(tenant)
        if circuit is None or circuit.state is BreakerState.CLOSED:
            return 0
        remaining = circuit.opened_at + self._cooldown - self._clock()
        if circuit.state is BreakerState.OPEN and remaining > 0:
            return max(1, math.ceil(remaining))
        if circuit.trial_running:
            return 1  # one trial at a time
        circuit.state, circuit.trial_running = BreakerState.HALF_OPEN, True
        return 0

    def success(self, tenant: str) -> None:
        self._circuits.pop(tenant, None)

    def failure(self, tenant: str) -> None:
        circuit = self._circuits.setdefault(tenant, _Circuit())
        circuit.failures += 1
        circuit.trial_running = False
        if circuit.state is BreakerState.HALF_OPEN or circuit.failures >= self._threshold:
            circuit.state, circuit.opened_at = BreakerState.OPEN, self._clock()

    def trip(self, tenant: str) -> None:
        circuit = self._circuits.setdefault(tenant, _Circuit())
        circuit.failures = max(circuit.failures, self._threshold)
        circuit.trial_running = False
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
