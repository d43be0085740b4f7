"""Unpadded base64url (RFC 4648 §5, RFC 7515 §2), written and read in its one canonical spelling.

Python's decoder is lenient: it skips characters outside the alphabet (`!!!!`, `....`), takes
`+/` for `-_`, accepts padding and ignores the unused low bits of the last character, so one
value would be read from many strings. What the broker reads this way — a token's segments, a
sealed value, a listing's cursor — is a name to clients, proxies and logs alike: a second
spelling would let a signed token be altered without breaking its signature, and an altered
sealed id must be nothing. `b64url_decode` returns None instead of raising: an exception would carry
the input into any traceback that gets logged.
"""

from __future__ import annotations

import base64
import binascii
import re

_ALPHABET = re.compile(r"[A-Za-z0-9_-]*")


def b64url_encode(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).decode("ascii").rstrip("=")


def b64url_decode(text: str) -> bytes | None:
    """The bytes `text` spells, only if `text` is their one spelling `b64url_encode` writes; else None."""
    if len(text) % 4 == 1 or not _ALPHABET.fullmatch(text):
        return None
    try:
        raw = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    except (binascii.Error, ValueError):
        return None
    if b64url_encode(raw) != text:
        return None  # another last character with the same significant bits
    return raw
