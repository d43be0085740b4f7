"""Which tenants a person approves for, from the provider's claims (issue 26 item 2)."""

from __future__ import annotations

from typing import Any

import pytest

from broker.auth import AuthError
from broker.auth.claims_map import MAX_VALUES, ClaimMapping, claim_values
from broker.types import Person
from tests.broker.auth.jwt_forge import DROP, ISSUER, Forge

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


# -- tenants' access tokens: the same mapping (DOCBROKER_AUTH_TENANT_CLAIM / _TENANT_MAP) ------

MAP = (("acme-team", "acme"), ("globex-team", "globex"), ("/orgs/acme", "acme"))


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("claim", "tenant_map", "claims", "tenant"),
    [
        ("groups", MAP, {"groups": ["staff", "acme-team"]}, "acme"),
        ("groups", MAP, {"groups": ["acme-team", "/orgs/acme"]}, "acme"),  # two values, one tenant
        ("org_id", MAP, {"org_id": "globex-team"}, "globex"),
        ("realm_access.roles", MAP, {"realm_access": {"roles": ["globex-team"]}}, "globex"),
        ("org.tenant", (), {"org": {"tenant": "globex"}}, "globex"),  # nested, no mapping: the name
        ("tenant", (), {"tenant": "acme"}, "acme"),  # as before
    ],
)
async def test_a_tenants_token_maps_to_its_one_tenant(
    make_auth: Any,
    jwks_file: Any,
    forge: Forge,
    claim: str,
    tenant_map: Any,
    claims: dict[str, Any],
    tenant: str,
) -> None:
    auth = make_auth(jwks_file=jwks_file, tenant_claim=claim, tenant_map=tenant_map)
    principal = await auth.authenticate(forge.bearer(claims={"tenant": DROP, **claims}))
    assert principal.tenant == tenant


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("claims", "reason"),
    [
        ({"groups": ["acme-team", "globex-team"]}, "bad_tenant"),  # which one? never a guess
        ({"groups": ["staff"]}, "bad_tenant"),  # nothing mapped
        ({"groups": ["acme"]}, "bad_tenant"),  # a group named like a tenant is not that tenant
        ({"groups": [1, 2]}, "bad_tenant"),
        ({"groups": {"acme-team": True}}, "bad_claim_type"),
        ({}, "missing_claim"),
    ],
)
async def test_a_tenants_token_without_exactly_one_mapped_tenant_is_refused(
    make_auth: Any, jwks_file: Any, forge: Forge, claims: dict[str, Any], reason: str
) -> None:
    auth = make_auth(jwks_file=jwks_file, tenant_claim="groups", tenant_map=MAP)
    with pytest.raises(AuthError) as refused:
        await auth.authenticate(forge.bearer(claims={"tenant": DROP, **claims}))
    assert refused.value.reason.value == reason


# -- who the person is: the person claim, and `email` only when verified (issue 34 items 1, 3) --


@pytest.mark.parametrize(
    ("claims", "tenants"),
    [
        ({"email": "ann@example.com", "email_verified": True}, ("acme",)),
        ({"email": "ann@example.com", "email_verified": False}, ()),
        ({"email": "ann@example.com", "email_verified": "true"}, ()),  # a string is not true
        ({"email": "ann@example.com"}, ()),  # the provider does not say: not verified
    ],
)
def test_an_email_maps_only_when_the_provider_verified_it(
    claims: dict[str, Any], tenants: tuple[str, ...]
) -> None:
    mapping = ClaimMapping("email", (("ann@example.com", "acme"),))
    assert mapping.approver_tenants(claims, KNOWN) == tenants


@pytest.mark.anyio
async def test_a_tokens_person_is_the_configured_claim_at_its_issuer(
    make_auth: Any, jwks_file: Any, forge: Forge
) -> None:
    auth = make_auth(jwks_file=jwks_file, person_claim="oid")
    principal = await auth.authenticate(forge.bearer(claims={"sub": "pairwise-1", "oid": "person-7"}))
    assert principal.person == Person(ISSUER, "person-7")
    assert principal.entity_id == f"acme/person-7#{ISSUER}"
    for claims in ({"oid": DROP}, {"oid": ["person-7"]}, {"oid": "bad\u202eid"}):
        with pytest.raises(AuthError) as refused:
            await auth.authenticate(forge.bearer(claims=claims))
        assert refused.value.reason.value == "bad_subject"


@pytest.mark.anyio
async def test_an_unverified_email_names_no_person(make_auth: Any, jwks_file: Any, forge: Forge) -> None:
    auth = make_auth(jwks_file=jwks_file, person_claim="email")
    verified = await auth.authenticate(
        forge.bearer(claims={"email": "ann@example.com", "email_verified": True})
    )
    assert verified.subject == "ann@example.com"
    with pytest.raises(AuthError):
        await auth.authenticate(forge.bearer(claims={"email": "ann@example.com", "email_verified": False}))
    # nor a tenant, through the mapping
    mapped = make_auth(jwks_file=jwks_file, tenant_claim="email", tenant_map=(("ann@example.com", "acme"),))
    with pytest.raises(AuthError) as refused:
        await mapped.authenticate(forge.bearer(claims={"tenant": DROP, "email": "ann@example.com"}))
    assert refused.value.reason.value == "missing_claim"
