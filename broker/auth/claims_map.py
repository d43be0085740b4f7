"""The provider's claims → which tenants a person approves for (DESIGN §12).

Organisations say who approves what in their identity provider: a group (`groups`), an app
role (`roles`, Entra ID), an organisation (`org_id`), or a claim of their own, sometimes nested
(`realm_access.roles` in Keycloak). The mapping names the claim and which of its values give
which tenant; a value nobody mapped gives nothing (never "the value is the tenant's name": a
group someone may create must not become a tenant's approver). Optionally an approver role
must be present too, so a member of a tenant's group who is not an approver sees nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

MAX_VALUES = 1000  # a claim with more values than this is refused whole, not cut


def claim_values(claims: Mapping[str, Any], path: str) -> list[str]:
    """The string values at `path`: a claim name (also one with dots, as URL-named claims
    have), else a dotted path into nested objects. A string is one value, a list of strings
    its items; anything else (missing, numbers, objects, oversized lists) is no value."""
    return as_values(claim_at(claims, path))


def claim_at(claims: Mapping[str, Any], path: str) -> Any:
    """The raw value at `path` (a claim name, else a dotted path), or None when absent.

    `email` is absent unless the provider says `email_verified` is true: an address someone
    typed into their profile, unchecked, must not name a person or give them a tenant."""
    if path == "email" and claims.get("email_verified") is not True:
        return None
    return claims[path] if path in claims else _walk(claims, path.split("."))


MAX_PERSON_CHARS = 256
MAX_GROUPS = 64  # groups of one person; more refuse them (each becomes an entity of every decision)
MAX_GROUP_CHARS = 256


def person_id(claims: Mapping[str, Any], path: str) -> str | None:
    """The person's id at their issuer: the claim at `path`, a printable string of at most
    MAX_PERSON_CHARS (it is audited and shown: control and bidi characters would let it pose
    as another); None if it is missing or anything else."""
    value = claim_at(claims, path)
    if not isinstance(value, str) or not 1 <= len(value) <= MAX_PERSON_CHARS or not value.isprintable():
        return None
    return value


def group_names(value: Any) -> frozenset[str] | None:
    """A groups claim's names (absent: none); None when it is malformed, which refuses the
    token or the sign-in rather than reading it as "no groups": a policy that forbids a group
    must not be escaped by a malformed claim."""
    if value is None:
        return frozenset()
    if not isinstance(value, list) or len(value) > MAX_GROUPS:
        return None
    for name in value:
        if not isinstance(name, str) or not 1 <= len(name) <= MAX_GROUP_CHARS or not name.isprintable():
            return None
    return frozenset(value)


def as_values(value: Any) -> list[str]:
    """A claim's value as string values: a string is one, a list of strings its items."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, list) and len(value) <= MAX_VALUES and all(isinstance(v, str) for v in value):
        return list(value)
    return []


def _walk(claims: Mapping[str, Any], parts: list[str]) -> Any:
    value: Any = claims
    for part in parts:
        if not isinstance(value, Mapping) or part not in value:
            return None
        value = value[part]
    return value


@dataclass(frozen=True)
class ClaimMapping:
    tenant_claim: str
    tenant_map: tuple[tuple[str, str], ...]  # (claim value, tenant)
    approver_claim: str | None = None
    approver_value: str = ""

    def approver_tenants(self, claims: Mapping[str, Any], known: Callable[[str], bool]) -> tuple[str, ...]:
        """The tenants this person may approve for, known to the broker, in mapping order;
        empty when the approver role is required and missing."""
        if self.approver_claim is not None and self.approver_value not in claim_values(
            claims, self.approver_claim
        ):
            return ()
        held = set(claim_values(claims, self.tenant_claim))
        tenants = [tenant for value, tenant in self.tenant_map if value in held and known(tenant)]
        return tuple(dict.fromkeys(tenants))
