"""Legacy (2025-11-25) session ids, sealed to the principal that created them (DESIGN §9).

The sandbox issues `Mcp-Session-Id`; the client never sees it. It sees a sealed id instead:
the sandbox's id and an expiry, sealed (broker/sealing.py: AES-GCM) under a key derived
from the master key, with the tenant and subject as associated data. Any broker replica
holding the master key opens it, so a session created through one replica continues through another, and the
broker keeps no table that could be filled or lost in a restart. An id presented by another
subject or tenant, altered, forged or expired opens to nothing: 404, exactly as if it did
not exist, so a leaked id is useless to anyone else.
"""

from __future__ import annotations

import re
import struct
import time
from collections.abc import Callable

from broker.sealing import Sealer
from broker.types import Principal

MAX_SESSION_ID_CHARS = 128  # the sandbox's own id: its answer is not trusted to be short
MAX_SEALED_CHARS = 512
DEFAULT_TTL_SECONDS = 86_400
_PREFIX = "dbm1."
_AAD = b"docbroker/mcp-session/v1\0"
# MCP: a session id holds visible ASCII only (0x21-0x7E); it travels in a header both ways.
_VISIBLE = re.compile(rf"[\x21-\x7e]{{1,{MAX_SESSION_ID_CHARS}}}")
_EXPIRY = struct.Struct(">Q")


class SessionSealer:
    def __init__(
        self, key: bytes, *, ttl_seconds: float = DEFAULT_TTL_SECONDS, clock: Callable[[], float] = time.time
    ) -> None:
        self._sealer = Sealer(key, _PREFIX, max_chars=MAX_SEALED_CHARS)
        self._ttl = ttl_seconds
        self._clock = clock

    def seal(self, session_id: str, principal: Principal) -> str | None:
        """The id the client sees for the sandbox's `session_id`; None if that id is unusable."""
        if not _VISIBLE.fullmatch(session_id):
            return None
        plain = _EXPIRY.pack(int(self._clock() + self._ttl)) + session_id.encode("ascii")
        return self._sealer.seal(plain, _aad(principal))

    def open(self, sealed: str, principal: Principal) -> str | None:
        """The sandbox's session id, if `sealed` was made for this principal and is unexpired."""
        plain = self._sealer.open(sealed, _aad(principal))
        if plain is None:
            return None
        (expires,) = _EXPIRY.unpack_from(plain)
        if expires <= self._clock():
            return None
        return plain[_EXPIRY.size :].decode("ascii")


def _aad(principal: Principal) -> bytes:
    # A tenant is a DNS label and cannot hold NUL: the two fields cannot be shifted into each other.
    subject = principal.subject.encode("utf-8", "surrogatepass")
    return _AAD + principal.tenant.encode("ascii") + b"\0" + subject
