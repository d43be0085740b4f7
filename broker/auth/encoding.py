"""Strict decoding of untrusted JSON in JOSE segments and JWKS documents (their base64url is
broker/base64url.py).

It returns None instead of raising: the caller turns None into one fixed reason code. An
exception here would travel as `__context__` of the caller's error, and the standard ones
carry the input (`JSONDecodeError.doc` is the whole document, `UnicodeDecodeError.object`
the raw bytes) into any traceback that gets logged.
"""

from __future__ import annotations

from typing import Any

from broker.protocol.codec import loads_strict


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
