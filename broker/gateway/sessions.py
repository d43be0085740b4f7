"""Legacy (2025-11-25) session ids, bound to the principal that created them.

The sandbox issues `Mcp-Session-Id`; the broker remembers which tenant and subject it was
issued to. Anyone else presenting it gets 404, exactly as if it did not exist, so a leaked
id is useless to another subject or tenant.

Bounded per tenant: a tenant's oldest bindings are forgotten first, and only its own, so a
tenant that opens sessions without end never pushes another tenant's out. (The tenants are
the policies' known ones, so the number of tables is bounded too.) Each tenant's sandbox
issues its own ids, so the same id from two sandboxes stays bound to each.
"""

from __future__ import annotations

from collections import OrderedDict

from broker.types import Principal

MAX_SESSIONS_PER_TENANT = 1_000
MAX_SESSION_ID_CHARS = 128


class SessionBindings:
    def __init__(self, max_per_tenant: int = MAX_SESSIONS_PER_TENANT) -> None:
        self._subjects: dict[str, OrderedDict[str, str]] = {}  # tenant → session id → subject
        self._max = max_per_tenant

    def bind(self, session_id: str, principal: Principal) -> None:
        subjects = self._subjects.setdefault(principal.tenant, OrderedDict())
        subjects[session_id] = principal.subject
        subjects.move_to_end(session_id)
        while len(subjects) > self._max:
            subjects.popitem(last=False)

    def owned_by(self, session_id: str, principal: Principal) -> bool:
        if len(session_id) > MAX_SESSION_ID_CHARS:
            return False
        subjects = self._subjects.get(principal.tenant)
        return subjects is not None and subjects.get(session_id) == principal.subject

    def forget(self, session_id: str, principal: Principal) -> None:
        subjects = self._subjects.get(principal.tenant)
        if subjects is not None:
            subjects.pop(session_id, None)
            if not subjects:
                del self._subjects[principal.tenant]

    def __len__(self) -> int:
        return sum(len(subjects) for subjects in self._subjects.values())
