"""Legacy (2025-11-25) session ids, sealed to the principal that created them (DESIGN §9).

The sandbox issues `Mcp-Session-Id`; the client never sees it. It sees a sealed id instead:
the sandbox's id and an expiry, encrypted with AES-GCM under a key derived from the master
key, with the tenant and subject as associated data. Any broker replica holding the master
key opens it, so a session created through one replica continues through another, and the
broker keeps no table that could be filled or lost in a restart. An id presented by another
subject or tenant, altered, forged or expired opens to nothing: 404, exactly as if it did
not exist, so a leaked id is useless to anyone else.
"""

from __future__ import annotations

import base64
import binascii
import os
import re
import struct
import time
from collections.abc import Callable

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from broker.types import Principal

MAX_SESSION_ID_CHARS = 128  # the sandbox's own id: its answer is not trusted to be short
MAX_SEALED_CHARS = 512
DEFAULT_TTL_SECONDS = 86_400
_PREFIX = "dbm1."
_AAD = b"docbroker/mcp-session/v1\0"
# MCP: a session id holds visible ASCII only (0x21-0x7E); it travels in a header both ways.
_VISIBLE = re.compile(rf"[\x21-\x7e]{{1,{MAX_SESSION_ID_CHARS}}}")
# What `seal` writes after the prefix: unpadded URL-safe base64, nothing else.
_SEALED_BODY = re.compile(r"[A-Za-z0-9_-]+")
_EXPIRY = struct.Struct(">Q")


class SessionSealer:
    def __init__(
        self, key: bytes, *, ttl_seconds: float = DEFAULT_TTL_SECONDS, clock: Callable[[], float] = time.time
    ) -> None:
        self._aead = AESGCM(key)
        self._ttl = ttl_seconds
        self._clock = clock

    def seal(self, session_id: str, principal: Principal) -> str | None:
        """The id the client sees for the sandbox's `session_id`; None if that id is unusable."""
        if not _VISIBLE.fullmatch(session_id):
            return None
        nonce = os.urandom(12)
        plain = _EXPIRY.pack(int(self._clock() + self._ttl)) + session_id.encode("ascii")
        sealed = nonce + self._aead.encrypt(nonce, plain, _aad(principal))
        return _PREFIX + base64.urlsafe_b64encode(sealed).decode("ascii").rstrip("=")

    def open(self, sealed: str, principal: Principal) -> str | None:
        """The sandbox's session id, if `sealed` was made for this principal and is unexpired."""
        if len(sealed) > MAX_SEALED_CHARS or not sealed.startswith(_PREFIX):
            return None
        raw = _canonical_bytes(sealed.removeprefix(_PREFIX))
        if raw is None:
            return None
        try:
            plain = self._aead.decrypt(raw[:12], raw[12:], _aad(principal))
        except (ValueError, InvalidTag):
            return None
        (expires,) = _EXPIRY.unpack_from(plain)
        if expires <= self._clock():
            return None
        return plain[_EXPIRY.size :].decode("ascii")


def _canonical_bytes(body: str) -> bytes | None:
    """The bytes `body` spells, only if it is their one spelling `seal` writes.

    Python's decoder is lenient: it skips characters outside the alphabet (`!!!!`, `....`),
    takes `+/` for `-_`, accepts padding and ignores the unused low bits of the last
    character, so one sealed id would open under many strings. The id is the session's name
    to clients, proxies and logs alike; it must have exactly one, as an altered id must be
    nothing (README: "altered ... gets 404")."""
    if not _SEALED_BODY.fullmatch(body):
        return None
    try:
        raw = base64.urlsafe_b64decode(body + "=" * (-len(body) % 4))
    except (binascii.Error, ValueError):
        return None
    if base64.urlsafe_b64encode(raw).rstrip(b"=") != body.encode("ascii"):
        return None  # another last character with the same significant bits
    return raw


def _aad(principal: Principal) -> bytes:
    # A tenant is a DNS label and cannot hold NUL: the two fields cannot be shifted into each other.
    subject = principal.subject.encode("utf-8", "surrogatepass")
    return _AAD + principal.tenant.encode("ascii") + b"\0" + subject
