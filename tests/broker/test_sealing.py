"""The one AES-GCM framing (broker/sealing.py) and the records sealed with it: what opens is
exactly what was sealed, with this key, for this use, until it expires; everything else is None."""

from __future__ import annotations

import os
from dataclasses import dataclass

from broker.sealing import RecordSealer, Sealer

KEY = os.urandom(32)


@dataclass(frozen=True)
class Note:
    text: str
    expires: float


def notes(key: bytes = KEY, *, aad: bytes = b"notes/v1", now: float = 1000.0) -> RecordSealer[Note]:
    return RecordSealer(Note, key, prefix="dbt1.", aad=aad, max_chars=512, clock=lambda: now)


def test_a_record_opens_until_it_expires_and_only_for_its_key_and_use() -> None:
    sealed = notes().seal(Note("hello", 1060.0))
    assert sealed.startswith("dbt1.") and "hello" not in sealed
    assert notes().open(sealed) == Note("hello", 1060.0)
    assert notes(now=1060.0).open(sealed) is None  # expired
    assert notes(os.urandom(32)).open(sealed) is None  # another key
    assert notes(aad=b"other/v1").open(sealed) is None  # another use of the same key


def test_anything_altered_forged_or_too_long_is_none() -> None:
    sealed = notes().seal(Note("hello", 1060.0))
    body = sealed.removeprefix("dbt1.")
    flipped = body[:-2] + ("A" if body[-2] != "A" else "B") + body[-1]
    for token in ("dbt1." + flipped, "dbx1." + body, sealed + "=", "dbt1." + "A" * 600, "", None, 42):
        assert notes().open(token) is None


def test_the_sealer_frames_bytes_under_associated_data() -> None:
    sealer = Sealer(KEY, "p1.", max_chars=100)
    sealed = sealer.seal(b"\x00bytes", b"aad")
    assert sealer.open(sealed, b"aad") == b"\x00bytes" and sealer.open(sealed, b"other") is None
    assert sealer.open(sealed + "=", b"aad") is None  # one spelling (gateway/test_legacy_sessions.py)
