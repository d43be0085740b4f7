"""Which tenants a person approves for, from the provider's claims (issue 26 item 2)."""

from __future__ import annotations

from typing import Any

import pytest

from broker.auth.claims_map import MAX_VALUES, ClaimMapping, claim_values

KNOWN = {"acme", "globex", "initech"}.__contains__


@pytest.mark.parametrize(
    ("claims", "path", "values"),
    [
        ({"groups": ["a", "b"]}, "groups", ["a", "b"]),
        ({"org_id": "org-1"}, "org_id", ["org-1"]),  # one string is one value
        ({"realm_access": {"roles": ["approver"]}}, "realm_access.roles", ["approver"]),  # Keycloak
        ({"https://example.com/claims/groups": ["a"]}, "https://example.com/claims/groups", ["a"]),
        ({"a": {"b": {"c": "deep"}}}, "a.b.c", ["deep"]),
        ({"groups": ["a", 1]}, "groups", []),  # not all strings: nothing, never a part
        ({"groups": {"a": True}}, "groups", []),
        ({"groups": 7}, "groups", []),
        ({"realm_access": ["roles"]}, "realm_access.roles", []),
        ({}, "groups", []),
        ({"groups": ["x"] * (MAX_VALUES + 1)}, "groups", []),
    ],
)
def test_claim_values(claims: dict[str, Any], path: str, values: list[str]) -> None:
    assert claim_values(claims, path) == values


def test_only_mapped_values_give_tenants_and_only_known_tenants() -> None:
    mapping = ClaimMapping(
        "groups", (("acme-approvers", "acme"), ("all-approvers", "globex"), ("all-approvers", "acme"),
                   ("old", "gone")),
    )  # fmt: skip
    assert mapping.approver_tenants({"groups": ["acme-approvers"]}, KNOWN) == ("acme",)
    assert mapping.approver_tenants({"groups": ["all-approvers", "acme-approvers"]}, KNOWN) == (
        "acme",
        "globex",
    )
    # a group named like a tenant is not that tenant's approver: only the mapping says so
    assert mapping.approver_tenants({"groups": ["acme", "globex", "initech"]}, KNOWN) == ()
    assert mapping.approver_tenants({"groups": ["old"]}, KNOWN) == ()  # a tenant the broker no longer has


def test_the_approver_role_is_required_when_configured() -> None:
    mapping = ClaimMapping("org.id", (("org-7", "acme"),), approver_claim="roles", approver_value="Approver")
    assert mapping.approver_tenants({"org": {"id": "org-7"}, "roles": ["Approver"]}, KNOWN) == ("acme",)
    assert mapping.approver_tenants({"org": {"id": "org-7"}, "roles": ["Reader"]}, KNOWN) == ()
    assert mapping.approver_tenants({"org": {"id": "org-7"}, "roles": "Approver"}, KNOWN) == ("acme",)
    assert mapping.approver_tenants({"org": {"id": "org-7"}}, KNOWN) == ()
