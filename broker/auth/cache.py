"""Bearer tokens that passed the full check, remembered so a reused token skips it.

Clients send the same token with every MCP request; decoding and verifying it again each
time is most of what authentication costs. `VerifiedTokens` maps the SHA-256 digest of a
token that `Authenticator` verified to what the check produced (the Principal) and to what
must still be re-checked on every use, because it can change while the token does not:

    exp, nbf, iat          against the current clock (with the same leeway as the full path)
    kid, algorithm, key    the key source must still return an equal key for (kid, algorithm)
    principal.tenant       must still be known (tenant policies can change)

Decisions:

- Only digests are kept, never the token: a memory dump or a debug repr of the cache hands
  out no usable bearer token. Lookup by digest is safe to do with a dict: finding an entry
  by timing would need a SHA-256 preimage of a token that was already verified.
- Only successes are stored. `Authenticator` answers from an entry only when every re-check
  passes; otherwise it drops the entry and runs the full path, so a refusal always carries
  exactly the reason the full path gives.
- Bounded: at most `max_entries`, least recently used evicted first. Each insert also drops
  up to `_SWEEP` expired entries from the cold end, so tokens nobody sends again do not sit
  in the cache until the bound pushes them out; an expired entry that is still used is
  dropped by its next lookup.
- Tokens that are not ASCII are never cached (a verified token is always base64url).

Everything here is synchronous: between `get` and `put` no other task runs, and `discard`
removes an entry only if it is still the one the caller looked at.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from dataclasses import dataclass

from broker.auth.keys import VerificationKey
from broker.types import Principal

DEFAULT_MAX_ENTRIES = 10_000
_SWEEP = 2  # expired entries dropped from the cold end per insert: amortised O(1)


@dataclass(frozen=True, slots=True, eq=False)
class Verified:
    """What the full check of one token produced, and what every reuse must re-check."""

    principal: Principal
    exp: int | float
    iat: int | float
    nbf: int | float | None
    kid: str | None
    algorithm: str
    key: VerificationKey


def token_digest(token: str) -> bytes | None:
    """The cache key of `token`, or None when it cannot be a verified token (not ASCII)."""
    if not token.isascii():
        return None
    return hashlib.sha256(token.encode("ascii")).digest()


class VerifiedTokens:
    """An LRU map of token digest → `Verified`, at most `max_entries` long (0 disables it)."""

    def __init__(self, max_entries: int = DEFAULT_MAX_ENTRIES, *, leeway: float = 0) -> None:
        if max_entries < 0:
            raise ValueError("max_entries must not be negative")
        self.max_entries = max_entries
        self._leeway = leeway
        self._entries: OrderedDict[bytes, Verified] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def digests(self) -> list[bytes]:
        """The keys held, coldest first (for inspection: they are digests, not tokens)."""
        return list(self._entries)

    def entries(self) -> list[Verified]:
        return list(self._entries.values())

    def get(self, digest: bytes) -> Verified | None:
        entry = self._entries.get(digest)
        if entry is not None:
            self._entries.move_to_end(digest)
        return entry

    def put(self, digest: bytes, entry: Verified, now: float) -> None:
        if self.max_entries == 0:
            return
        self._entries[digest] = entry
        self._entries.move_to_end(digest)
        for _ in range(_SWEEP):
            cold_digest, cold = next(iter(self._entries.items()))
            if cold_digest == digest or not self.expired(cold, now):
                break
            del self._entries[cold_digest]
        while len(self._entries) > self.max_entries:
            self._entries.popitem(last=False)

    def discard(self, digest: bytes, entry: Verified) -> None:
        """Drop `entry`, unless another task has put a newer one under the same digest."""
        if self._entries.get(digest) is entry:
            del self._entries[digest]

    def expired(self, entry: Verified, now: float) -> bool:
        # The full path's own expiry condition (`now >= exp + leeway`), not an approximation.
        return now >= entry.exp + self._leeway

    def clear(self) -> None:
        self._entries.clear()
