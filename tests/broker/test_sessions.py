"""Legacy session bindings (`broker/gateway/sessions.py`): owner-only, and bounded per tenant.

The HTTP side (another subject or tenant presenting an id gets 404) is in test_cross_tenant.py;
these check the table itself, which the gateway consults on every legacy request.
"""

from __future__ import annotations

from broker.gateway.sessions import MAX_SESSION_ID_CHARS, SessionBindings
from broker.types import Principal


def who(tenant: str, subject: str = "alice") -> Principal:
    return Principal(tenant=tenant, subject=subject, scopes=frozenset())


def test_only_the_principal_that_opened_a_session_owns_it() -> None:
    table = SessionBindings()
    table.bind("s1", who("acme"))
    assert table.owned_by("s1", who("acme"))
    assert not table.owned_by("s1", who("acme", "mallory"))  # same tenant, another subject
    assert not table.owned_by("s1", who("globex"))  # same subject name, another tenant
    assert not table.owned_by("s2", who("acme"))


def test_a_tenant_opening_sessions_without_end_evicts_only_its_own_oldest() -> None:
    table = SessionBindings(max_per_tenant=3)
    table.bind("victim-session", who("globex", "bob"))
    for i in range(50):
        table.bind(f"flood-{i}", who("acme", "mallory"))
    assert table.owned_by("victim-session", who("globex", "bob"))
    assert [table.owned_by(f"flood-{i}", who("acme", "mallory")) for i in (46, 47, 48, 49)] == [
        False,
        True,
        True,
        True,
    ]
    assert len(table) == 4


def test_a_session_used_again_is_kept_over_older_ones() -> None:
    table = SessionBindings(max_per_tenant=2)
    table.bind("a", who("acme"))
    table.bind("b", who("acme"))
    table.bind("a", who("acme"))  # re-bound (a new initialize answered with the same id)
    table.bind("c", who("acme"))
    assert table.owned_by("a", who("acme")) and table.owned_by("c", who("acme"))
    assert not table.owned_by("b", who("acme"))


def test_the_same_id_from_two_tenants_sandboxes_stays_bound_to_each() -> None:
    table = SessionBindings()
    table.bind("same-id", who("acme", "alice"))
    table.bind("same-id", who("globex", "bob"))
    assert table.owned_by("same-id", who("acme", "alice"))
    assert table.owned_by("same-id", who("globex", "bob"))
    table.forget("same-id", who("acme", "alice"))
    assert not table.owned_by("same-id", who("acme", "alice"))
    assert table.owned_by("same-id", who("globex", "bob"))
    table.forget("same-id", who("globex", "bob"))
    assert len(table) == 0


def test_an_over_long_id_is_never_owned() -> None:
    table = SessionBindings()
    long_id = "x" * (MAX_SESSION_ID_CHARS + 1)
    table.bind(long_id, who("acme"))  # a sandbox's answer is not trusted to be short
    assert not table.owned_by(long_id, who("acme"))
