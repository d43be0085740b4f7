"""Sign-in to /approvals with the organisation's OpenID Provider (broker/web/signin.py)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from broker.settings.reader import PREFIX, Reader, SettingsError, loopback, origin_of


@dataclass(frozen=True)
class OidcSettings:
    """Sign-in to /approvals with the organisation's OpenID Provider (broker/web/signin.py).

    Who may approve for which tenant comes from the id_token's claims: `tenant_claim` (a claim
    name, or a dotted path into nested claims) holds values that `tenant_map` turns into tenants;
    when `approver_claim` is set, one of its values must also be `approver_value`.
    """

    issuer: str
    client_id: str
    client_secret_file: Path | None = None  # None: a public client (PKCE alone)
    scopes: str = "openid profile email"
    session_lifetime_seconds: int = 8 * 3600  # from sign-in, whatever the activity
    session_idle_seconds: int = 1800  # since the session's last request
    tenant_claim: str = "groups"
    tenant_map: tuple[tuple[str, str], ...] = ()  # (claim value, tenant), in the order given
    approver_claim: str | None = None
    approver_value: str = "docbroker-approvers"
    # The claim that names the person (as DOCBROKER_AUTH_PERSON_CLAIM does for tokens), and the
    # groups the policy decides on for a signed-in approver, as it does for a token's.
    person_claim: str = "sub"
    groups_claim: str = "groups"
    fetch_timeout_seconds: float = 5.0


def oidc_settings(r: Reader, public_url: str) -> OidcSettings | None:
    issuer = r.optional(
        "OIDC_ISSUER",
        doc=(
            "the organisation's OpenID Provider: approvers sign in to `/approvals` with it "
            "([docs/approvers.md](docs/approvers.md), [docs/identity.md](docs/identity.md)). "
            "Discovery from `ISSUER/.well-known/openid-configuration`, whose `issuer` must be exactly "
            "this. Needs an `https` `DOCBROKER_PUBLIC_URL` (or a loopback one): the session cookie is "
            "`__Host-` and `Secure`; the provider must allow `PUBLIC_URL/approvals/callback` as "
            "redirect URI and `PUBLIC_URL/approvals` after logout"
        ),
    )
    if issuer is None:
        return None  # no provider: the page takes a pasted bearer token (dev, or behind a proxy)
    # The provider's discovery, keys and token endpoint are fetched from the issuer: over plain
    # http anyone on the path could hand the broker keys of their own and sign in as anyone.
    if origin_of(issuer) is None or not (issuer.startswith("https://") or loopback(issuer)):
        raise SettingsError(f"{PREFIX}OIDC_ISSUER must be an https URL (http only on loopback)")
    # The session cookie is `__Host-` and Secure: it is set only over https (or on loopback).
    if "#" in issuer:  # OpenID issuers have no fragment; a person's Cedar id ends with "#<issuer>"
        raise SettingsError(f"{PREFIX}OIDC_ISSUER must not hold '#'")
    if not public_url.startswith("https://") and not loopback(public_url):
        raise SettingsError(f"{PREFIX}OIDC_ISSUER needs an https {PREFIX}PUBLIC_URL")
    scopes = r.text(
        "OIDC_SCOPES",
        "openid profile email",
        doc=(
            "scopes asked for; must include `openid`, and whatever makes the provider put the mapped "
            "claims in the id_token"
        ),
    )
    if "openid" not in scopes.split():
        raise SettingsError(f"{PREFIX}OIDC_SCOPES must include openid")
    lifetime = r.integer(
        "OIDC_SESSION_LIFETIME",
        8 * 3600,
        low=5,
        high=7 * 86_400,
        doc="seconds a sign-in lasts however busy (5-604800)",
    )
    return OidcSettings(
        issuer=issuer,
        client_id=r.required("OIDC_CLIENT_ID", doc="the broker's client id at the provider"),
        client_secret_file=r.path(
            "OIDC_CLIENT_SECRET_FILE", doc="a file holding the client secret (`client_secret_basic`)"
        ),
        scopes=scopes,
        session_lifetime_seconds=lifetime,
        session_idle_seconds=r.integer(
            "OIDC_SESSION_IDLE",
            min(1800, lifetime),
            low=5,
            high=lifetime,
            doc="seconds without a request after which the session ends",
        ),
        tenant_claim=r.text(
            "OIDC_TENANT_CLAIM",
            "groups",
            doc=(
                "the id_token claim whose values give tenants: a name (also a URL-named claim) or a "
                "dotted path into nested claims (`realm_access.roles`)"
            ),
        ),
        tenant_map=r.tenant_map(
            "OIDC_TENANT_MAP",
            doc=(
                "`claim-value=tenant` pairs, by commas (`acme-approvers=acme,0f3c...=globex`): a value "
                "gives its tenant; an unmapped value, or a tenant the broker does not know, gives nothing"
            ),
        ),
        approver_claim=r.optional(
            "OIDC_APPROVER_CLAIM",
            doc=(
                "a claim (name or dotted path) that must also hold `DOCBROKER_OIDC_APPROVER_VALUE` for "
                "the person to approve at all"
            ),
        ),
        approver_value=r.text(
            "OIDC_APPROVER_VALUE",
            "docbroker-approvers",
            doc="the approver role's value in `DOCBROKER_OIDC_APPROVER_CLAIM`",
        ),
        person_claim=r.text(
            "OIDC_PERSON_CLAIM",
            "sub",
            doc=(
                "the id_token claim naming the person (with the issuer: who they are for self-approval "
                "and the two-person rule); set it as `DOCBROKER_AUTH_PERSON_CLAIM` so a person's token "
                "and sign-in are one (Entra ID: `oid`, its `sub` differs per application). `email` counts "
                "only with `email_verified`"
            ),
        ),
        groups_claim=r.text(
            "OIDC_GROUPS_CLAIM",
            "groups",
            doc=(
                "the id_token claim listing the signed-in approver's groups or roles (a name or dotted "
                "path), kept in the session for policies as a token's groups are; absent: none; "
                "malformed: sign-in refused"
            ),
        ),
    )
