"""Legacy (2025-11-25) session ids, bound to the principal that created them.

The sandbox issues `Mcp-Session-Id`; the broker remembers which tenant and subject it was
issued to. Anyone else presenting it gets 404, exactly as if it did not exist, so a leaked
id is useless to another subject or tenant. Bounded: the oldest bindings are forgotten first.
"""

from __future__ import annotations

from collections import OrderedDict

from broker.types import Principal

MAX_SESSIONS = 10_000
MAX_SESSION_ID_CHARS = 128


class SessionBindings:
    def __init__(self, max_sessions: int = MAX_SESSIONS) -> None:
        self._owners: OrderedDict[str, tuple[str, str]] = OrderedDict()
        self._max = max_sessions

    def bind(self, session_id: str, principal: Principal) -> None:
        self._owners[session_id] = (principal.tenant, principal.subject)
        self._owners.move_to_end(session_id)
        while len(self._owners) > self._max:
            self._owners.popitem(last=False)

    def owned_by(self, session_id: str, principal: Principal) -> bool:
        if len(session_id) > MAX_SESSION_ID_CHARS:
            return False
        return self._owners.get(session_id) == (principal.tenant, principal.subject)

    def forget(self, session_id: str) -> None:
        self._owners.pop(session_id, None)

    def __len__(self) -> int:
        return len(self._owners)
