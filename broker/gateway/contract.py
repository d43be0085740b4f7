"""Contract pinning: a sandbox's admitted tool descriptors are fixed when it starts.

The broker lists the tools itself as soon as a sandbox is ready and pins the result to that
sandbox instance. A later listing that differs in anything (a name, a schema, a description,
an annotation, a refused tool) means the sandbox is no longer the program that started: its
calls are refused until an operator replaces the sandbox (a new instance is pinned afresh).
"""

from __future__ import annotations

from dataclasses import dataclass

from broker.gateway.admission import Admission


@dataclass
class Pin:
    sandbox_id: str
    admission: Admission
    fingerprint: str
    broken: bool = False


class ContractPins:
    def __init__(self) -> None:
        self._pins: dict[str, Pin] = {}

    def get(self, tenant: str, sandbox_id: str) -> Pin | None:
        pin = self._pins.get(tenant)
        return pin if pin is not None and pin.sandbox_id == sandbox_id else None

    def pin(self, tenant: str, sandbox_id: str, admission: Admission) -> Pin:
        pin = Pin(sandbox_id, admission, admission.fingerprint())
        self._pins[tenant] = pin
        return pin

    def matches(self, pin: Pin, admission: Admission) -> bool:
        """Compare a new listing with the pin; a difference breaks the pin for good."""
        if admission.fingerprint() != pin.fingerprint:
            pin.broken = True
        return not pin.broken
