"""Sealed `requestState` for in-band approvals (DESIGN §4).

The state travels through the client between the question and the answer. AES-GCM with a key
derived from the master key makes it opaque and tamper-evident, and any broker replica with
the same master key can open it. Every failure is one opaque `None`.
"""

from __future__ import annotations

import base64
import binascii
import json
import os
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

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
        self._aead = AESGCM(key)
        self._clock = clock

    def seal(self, state: SealedApproval) -> str:
        nonce = os.urandom(12)
        plain = json.dumps(asdict(state), separators=(",", ":"), sort_keys=True).encode()
        sealed = nonce + self._aead.encrypt(nonce, plain, _AAD)
        return _PREFIX + base64.urlsafe_b64encode(sealed).decode().rstrip("=")

    def open(self, token: str) -> SealedApproval | None:
        """The state if it is ours, intact and unexpired; otherwise None."""
        if not isinstance(token, str) or len(token) > MAX_STATE_CHARS or not token.startswith(_PREFIX):
            return None
        body = token.removeprefix(_PREFIX)
        try:
            raw = base64.urlsafe_b64decode(body + "=" * (-len(body) % 4))
            plain = self._aead.decrypt(raw[:12], raw[12:], _AAD)
            state = SealedApproval(**json.loads(plain))
        except (binascii.Error, ValueError, InvalidTag, TypeError):
            return None
        if not isinstance(state.expires, int) or state.expires <= self._clock():
            return None
        return state
