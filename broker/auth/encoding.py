"""Strict decoders for untrusted JOSE segments and JWKS documents.

Both return None instead of raising: the caller turns None into one fixed reason code. An
exception here would travel as `__context__` of the caller's error, and the standard ones
carry the input (`JSONDecodeError.doc` is the whole document, `UnicodeDecodeError.object`
the raw bytes) into any traceback that gets logged.
"""

from __future__ import annotations

import base64
import binascii
import json
import math
import re
from typing import Any

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


class _Rejected(ValueError):
    pass


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    # Two "alg" or two "aud" members: parsers disagree on which one wins, so refuse both.
    obj = dict(pairs)
    if len(obj) != len(pairs):
        raise _Rejected("duplicate member")
    return obj


def _no_constants(name: str) -> Any:
    raise _Rejected("NaN and Infinity are not JSON")


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):  # 1e400 parses to inf: not a number a claim can hold
        raise _Rejected("number out of range")
    return value


def json_object(raw: bytes) -> dict[str, Any] | None:
    """A strict UTF-8 JSON object (no duplicate members, no NaN/Infinity), else None."""
    try:
        text = raw.decode("utf-8")
        value = json.loads(
            text,
            object_pairs_hook=_no_duplicates,
            parse_constant=_no_constants,
            parse_float=_finite,
        )
    # RecursionError: "[[[[…" a few thousand deep exhausts the parser's stack; ValueError
    # covers bad JSON, our rejections and integers longer than Python will convert.
    except (UnicodeDecodeError, ValueError, RecursionError):
        return None
    return value if isinstance(value, dict) else None
