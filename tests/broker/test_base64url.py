"""broker/base64url.py: the one base64url decoder (tokens, sealed values, cursors) reads only the
spelling the encoder writes."""

from __future__ import annotations

import base64
import os

import pytest

from broker.base64url import b64url_decode, b64url_encode

ALPHABET = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"


@pytest.mark.parametrize("size", range(0, 13))
def test_what_is_written_is_read_back(size: int) -> None:
    raw = os.urandom(size)
    text = b64url_encode(raw)
    assert "=" not in text and b64url_decode(text) == raw
    assert text == base64.urlsafe_b64encode(raw).decode().rstrip("=")


def test_every_other_spelling_of_the_same_bytes_is_nothing() -> None:
    text = b64url_encode(b"\xfb\xff\xfe\x01")  # 6 characters: the last one carries 4 unused bits
    last = ALPHABET.index(text[-1])
    spellings = {
        "unused bits set": text[:-1] + ALPHABET[last | 1],
        "padded": text + "==",
        "standard alphabet": base64.b64encode(b"\xfb\xff\xfe\x01").decode().rstrip("="),
        "a character skipped by the lenient decoder": text[:2] + "!" + text[2:],
        "a dot inside": text[:4] + "." + text[4:],
        "whitespace": text + "\n",
        "one character too many": text + "A" * 3,  # 9 characters: no whole number of bytes
        "not ascii": text[:-1] + "é",
    }
    for what, other in spellings.items():
        assert other != text
        assert b64url_decode(other) is None, what
