"""Sealed `requestState` for in-band approvals (DESIGN §4).

The state travels through the client between the question and the answer. Sealed
(broker/sealing.py: AES-GCM) with a key derived from the master key, it is opaque and
tamper-evident, and any broker replica with the same master key can open it. Every failure
is one opaque `None`.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass

from broker.sealing import Sealer

_PREFIX = "dbs1."
_AAD = b"docbroker/request-state/v1"
MAX_STATE_CHARS = 4096


@dataclass(frozen=True)
class SealedApproval:
    approval_id: str
    tenant: str
    subject: str
    filename: str
    sha256: str
    expires: int


class StateSealer:
    def __init__(self, key: bytes, clock: Callable[[], float] = time.time) -> None:
        self._sealer = Sealer(key, _PREFIX, max_chars=MAX_STATE_CHARS)
        self._clock = clock

    def seal(self, state: SealedApproval) -> str:
        plain = json.dumps(asdict(state), separators=(",", ":"), sort_keys=True).encode()
        return self._sealer.seal(plain, _AAD)

    def open(self, token: str) -> SealedApproval | None:
        """The state if it is ours, intact and unexpired; otherwise None."""
        plain = self._sealer.open(token, _AAD)
        if plain is None:
            return None
        try:
            state = SealedApproval(**json.loads(plain))
        except (ValueError, TypeError):
            return None
        if not isinstance(state.expires, int) or state.expires <= self._clock():
            return None
        return state
