"""Strict decoders for untrusted JOSE segments and JWKS documents.

Both return None instead of raising: the caller turns None into one fixed reason code. An
exception here would travel as `__context__` of the caller's error, and the standard ones
carry the input (`JSONDecodeError.doc` is the whole document, `UnicodeDecodeError.object`
the raw bytes) into any traceback that gets logged.
"""

from __future__ import annotations

import base64
import binascii
import re
from typing import Any

from broker.protocol.codec import loads_strict

_B64URL = re.compile(r"[A-Za-z0-9_-]*")


def b64url_decode(segment: str) -> bytes | None:
    """Unpadded base64url (RFC 7515 §2) in its one canonical spelling, else None.

    Canonical only: a second spelling of the same bytes would let a signed token be altered
    without breaking its signature, and padding or foreign characters mean a sloppy or
    hostile producer.
    """
    if len(segment) % 4 == 1 or not _B64URL.fullmatch(segment):
        return None
    try:
        raw = base64.urlsafe_b64decode(segment + "=" * (-len(segment) % 4))
    except binascii.Error:
        return None
    if base64.urlsafe_b64encode(raw).rstrip(b"=").decode("ascii") != segment:
        return None
    return raw


def json_object(raw: bytes) -> dict[str, Any] | None:
    """A strict UTF-8 JSON object (no duplicate members, no NaN/Infinity), else None."""
    try:
        text = raw.decode("utf-8")
        value = loads_strict(text, finite=True)
    # RecursionError: "[[[[…" a few thousand deep exhausts the parser's stack; ValueError
    # covers bad JSON, our rejections and integers longer than Python will convert.
    except (UnicodeDecodeError, ValueError, RecursionError):
        return None
    return value if isinstance(value, dict) else None
