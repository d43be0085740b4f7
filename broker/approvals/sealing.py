"""Sealed `requestState` for in-band approvals (DESIGN §4).

The state travels through the client between the question and the answer. Sealed
(broker/sealing.py: AES-GCM) with a key derived from the master key, it is opaque and
tamper-evident, and any broker replica with the same master key can open it. Every failure
is one opaque `None`.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from broker.sealing import RecordSealer

MAX_STATE_CHARS = 4096


@dataclass(frozen=True)
class SealedApproval:
    approval_id: str
    tenant: str
    subject: str
    filename: str
    sha256: str
    expires: int


class StateSealer(RecordSealer[SealedApproval]):
    def __init__(self, key: bytes, clock: Callable[[], float] = time.time) -> None:
        super().__init__(
            SealedApproval,
            key,
            prefix="dbs1.",
            aad=b"docbroker/request-state/v1",
            max_chars=MAX_STATE_CHARS,
            clock=clock,
        )
