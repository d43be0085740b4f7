"""Contract pinning: a sandbox's admitted tool descriptors are fixed when it starts.

The broker lists the tools itself as soon as a sandbox is ready and pins the result to that
sandbox instance. A later listing that differs in anything (a name, a schema, a description,
an annotation, a refused tool) means the sandbox is no longer the program that started: the
gateway replaces it at once (the call that saw it, and any other on the broken pin, are
refused), and its successor is listed and pinned afresh on its first call. A pin is per
sandbox instance, so a sandbox replaced by anyone else (an operator, a crash) is never
judged by its predecessor's pin.
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

    def forget(self, tenant: str, sandbox_id: str) -> None:
        if self.get(tenant, sandbox_id) is not None:
            del self._pins[tenant]

    def matches(self, pin: Pin, admission: Admission) -> bool:
        """Compare a new listing with the pin; a difference breaks the pin for good."""
        if admission.fingerprint() != pin.fingerprint:
            pin.broken = True
        return not pin.broken
