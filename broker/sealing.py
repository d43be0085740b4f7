"""Small values sealed for a trip through a client: one AES-GCM framing for every use.

    sealer = Sealer(key, prefix="dbm1.", max_chars=512)
    token = sealer.seal(plain, aad)    # prefix + unpadded base64url(nonce ‖ ciphertext ‖ tag)
    sealer.open(token, aad)            # the plain bytes, or None

    records = RecordSealer(Pending, key, prefix="dbl1.", aad=b"...", max_chars=1024)
    records.open(records.seal(Pending(..., expires=t)))   # the record until `expires`, or None

What the broker would otherwise keep in a table — in-band approval state (approvals/sealing.py),
legacy session ids (gateway/legacy_sessions.py), a sign-in under way (web/signin.py) — travels with
the client instead, opaque and tamper-evident: there is no table to fill or to lose in a
restart, and any replica holding the master key opens it. Each use has a key of its own
derived from the master key (master_key.py), its own prefix, and associated data binding the
token to what it was made for. Every failure (another key or `aad`, altered, truncated,
forged, too long) is one opaque None, as itsdangerous collapses every bad signature into one.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from dataclasses import asdict
from typing import TYPE_CHECKING, Generic, TypeVar

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from broker.base64url import b64url_decode, b64url_encode

NONCE_BYTES = 12


class Sealer:
    def __init__(self, key: bytes, prefix: str, *, max_chars: int) -> None:
        self._aead = AESGCM(key)
        self._prefix = prefix
        self._max_chars = max_chars  # what `open` looks at, at most: a bound on a client's input

    def seal(self, plain: bytes, aad: bytes) -> str:
        nonce = os.urandom(NONCE_BYTES)
        sealed = nonce + self._aead.encrypt(nonce, plain, aad)
        return self._prefix + b64url_encode(sealed)

    def open(self, sealed: object, aad: bytes) -> bytes | None:
        """The bytes `seal` was given with this `aad` under this key; None for anything else."""
        if not isinstance(sealed, str) or len(sealed) > self._max_chars:
            return None
        if not sealed.startswith(self._prefix):
            return None
        raw = b64url_decode(sealed.removeprefix(self._prefix))  # one spelling only
        if raw is None:
            return None
        try:
            return self._aead.decrypt(raw[:NONCE_BYTES], raw[NONCE_BYTES:], aad)
        except (ValueError, InvalidTag):
            return None


if TYPE_CHECKING:
    from _typeshed import DataclassInstance

R = TypeVar("R", bound="DataclassInstance")


class RecordSealer(Generic[R]):
    """Records of one dataclass, sealed as JSON, each good until its own `expires` field
    (Unix seconds)."""

    def __init__(
        self,
        kind: type[R],
        key: bytes,
        *,
        prefix: str,
        aad: bytes,
        max_chars: int,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._kind = kind
        self._sealer = Sealer(key, prefix, max_chars=max_chars)
        self._aad = aad
        self._clock = clock

    def seal(self, record: R) -> str:
        plain = json.dumps(asdict(record), separators=(",", ":"), sort_keys=True).encode()
        return self._sealer.seal(plain, self._aad)

    def open(self, token: object) -> R | None:
        """The record if `token` is one of ours, intact and unexpired; otherwise None."""
        plain = self._sealer.open(token, self._aad)
        if plain is None:
            return None
        try:
            record = self._kind(**json.loads(plain))
        except (ValueError, TypeError):
            return None
        expires = getattr(record, "expires", None)
        if isinstance(expires, bool) or not isinstance(expires, (int, float)) or expires <= self._clock():
            return None
        return record
