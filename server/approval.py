"""Approval tokens v1 (DESIGN §3): the broker mints, the server verifies.

Both sides use this module so the byte format lives in one place. Every verification
failure collapses into one opaque `False`: the caller learns nothing about which check
failed, and neither does a client.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

TOKEN_VERSION = 1
MAX_TOKEN_TTL = 300  # seconds a token may be valid for, counted from verification time
MIN_SECRET_CHARS = 32
_JTI_RE = re.compile(r"[0-9a-f]{32}")
_SHA256_RE = re.compile(r"[0-9a-f]{64}")
_PAYLOAD_KEYS = frozenset({"v", "scope", "tool", "filename", "sha256", "expires", "jti"})


def content_sha256(content: str) -> str:
    return hashlib.sha256(content.encode("utf-8")).hexdigest()


def _mac(secret: str, encoded: str) -> str:
    return hmac.new(secret.encode("ascii"), encoded.encode("ascii"), hashlib.sha256).hexdigest()


def mint_token(
    *, secret: str, tenant: str, tool: str, filename: str, sha256: str, expires: int, jti: str
) -> str:
    payload = {
        "v": TOKEN_VERSION,
        "scope": tenant,  # the token's field is named "scope" (DESIGN §3); it holds the tenant id
        "tool": tool,
        "filename": filename,
        "sha256": sha256,
        "expires": expires,
        "jti": jti,
    }
    encoded = base64.urlsafe_b64encode(
        json.dumps(payload, sort_keys=True, separators=(",", ":")).encode()
    ).decode()
    return f"{encoded}.{_mac(secret, encoded)}"


@dataclass(frozen=True)
class Expected:
    """What this call is: a token must match all of it."""

    tenant: str
    tool: str
    filename: str
    sha256: str


class ApprovalVerifier:
    """Verifies tokens for one tenant and remembers accepted `jti`s until they expire."""

    def __init__(self, secret: str, *, clock: Callable[[], float] = time.time, max_remembered: int = 100_000):
        if len(secret) < MIN_SECRET_CHARS or not secret.isascii():
            raise ValueError(f"approval secret must be at least {MIN_SECRET_CHARS} ASCII characters")
        self._secret = secret
        self._clock = clock
        self._max_remembered = max_remembered
        self._accepted: dict[str, int] = {}  # jti -> expires
        self._lock = threading.Lock()  # tools run in worker threads

    def verify(self, token: str, expected: Expected) -> bool:
        payload = self._unverified_payload_if_mac_matches(token)
        if payload is None or not self._claims_match(payload, expected):
            return False
        return self._accept_once(payload["jti"], payload["expires"])

    def _unverified_payload_if_mac_matches(self, token: str) -> dict[str, Any] | None:
        encoded, sep, mac = token.rpartition(".")
        if not sep or not encoded.isascii() or not mac.isascii():
            return None
        if not hmac.compare_digest(_mac(self._secret, encoded), mac):
            return None
        try:
            payload = json.loads(base64.urlsafe_b64decode(encoded.encode("ascii")))
        except (binascii.Error, ValueError):
            return None
        return payload if isinstance(payload, dict) else None

    def _claims_match(self, payload: dict[str, Any], expected: Expected) -> bool:
        if set(payload) != _PAYLOAD_KEYS:
            return False
        expires, jti, sha = payload["expires"], payload["jti"], payload["sha256"]
        # `type(...) is int`: JSON true must not pass as 1, nor 1.0 as an int.
        if payload["v"] != TOKEN_VERSION or type(payload["v"]) is not int:
            return False
        if type(expires) is not int:
            return False
        now = self._clock()
        if not now < expires <= now + MAX_TOKEN_TTL:
            return False
        if not (isinstance(jti, str) and _JTI_RE.fullmatch(jti)):
            return False
        if not (isinstance(sha, str) and _SHA256_RE.fullmatch(sha)):
            return False
        checks = (
            (payload["scope"], expected.tenant),
            (payload["tool"], expected.tool),
            (payload["filename"], expected.filename),
            (sha, expected.sha256),
        )
        return all(
            isinstance(got, str) and got.isascii() and hmac.compare_digest(got, want) for got, want in checks
        )

    def _accept_once(self, jti: str, expires: int) -> bool:
        with self._lock:
            now = self._clock()
            if jti in self._accepted and self._accepted[jti] > now:
                return False
            if len(self._accepted) >= self._max_remembered:
                self._accepted = {j: e for j, e in self._accepted.items() if e > now}
                if len(self._accepted) >= self._max_remembered:
                    # Full of live tokens: refusing is safe, forgetting one would allow a replay.
                    return False
            self._accepted[jti] = expires
            return True
