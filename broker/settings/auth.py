"""How bearer tokens are verified and what their claims name (broker/auth/)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from broker.settings.reader import PREFIX, Reader, SettingsError

ALLOWED_ALGORITHMS = ("RS256", "ES256", "EdDSA")
MAX_LEEWAY_SECONDS = 30


@dataclass(frozen=True)
class AuthSettings:
    issuer: str
    audience: str
    tenant_claim: str = "tenant"  # a claim name, or a dotted path into nested claims
    # (claim value, tenant) pairs: the tenant is the one the claim's values map to (exactly
    # one); empty: the claim's value is the tenant's name itself
    tenant_map: tuple[tuple[str, str], ...] = ()
    groups_claim: str = "groups"  # a list of group or role names the policy decides on (docs/policy.md)
    # The claim that names a person, as the page's sign-in names them too (DESIGN §12): `sub`
    # unless the provider's `sub` differs per application (Entra ID: `oid`).
    person_claim: str = "sub"
    jwks_url: str | None = None
    jwks_file: Path | None = None  # a JWKS document or a PEM public key
    algorithms: tuple[str, ...] = ALLOWED_ALGORITHMS
    dev_hs256_secret_file: Path | None = None  # HS256 dev mode: never together with public keys
    max_lifetime_seconds: int = 3600
    leeway_seconds: int = 10
    max_header_bytes: int = 8192
    jwks_cache_seconds: int = 300
    jwks_refresh_cooldown_seconds: int = 30
    jwks_fetch_timeout_seconds: float = 3.0

    @property
    def dev_mode(self) -> bool:
        return self.dev_hs256_secret_file is not None


def auth_settings(r: Reader) -> AuthSettings:
    auth = AuthSettings(
        issuer=r.required("AUTH_ISSUER", doc="exact `iss`"),
        audience=r.required("AUTH_AUDIENCE", doc="must be in `aud`"),
        tenant_claim=r.text(
            "AUTH_TENANT_CLAIM",
            "tenant",
            doc=(
                "claim naming the tenant: a name (also a URL-named claim) or a dotted path into nested "
                "claims (`org.tenant`)"
            ),
        ),
        groups_claim=r.text(
            "AUTH_GROUPS_CLAIM",
            "groups",
            doc=(
                "claim listing the caller's groups or roles (strings), for policies (docs/policy.md); "
                "absent: none; malformed: the token is refused"
            ),
        ),
        person_claim=r.text(
            "AUTH_PERSON_CLAIM",
            "sub",
            doc=(
                "claim naming the person (a name or dotted path; a printable string of at most 256 "
                "characters, else the token is refused): with the issuer, who the caller is for approvals "
                "and policies. `email` counts only with `email_verified` true"
            ),
        ),
        tenant_map=r.tenant_map(
            "AUTH_TENANT_MAP",
            doc=(
                "`claim-value=tenant` pairs, by commas: the claim's values (a group list, roles, an org "
                "id) give the token's tenant through this mapping; none or two different tenants -> 401 "
                "`bad_tenant` (see [docs/identity.md](docs/identity.md))"
            ),
        ),
        jwks_url=r.optional(
            "AUTH_JWKS_URL",
            doc=("key source: the identity provider's JWKS URL (set exactly one of the three key sources)"),
        ),
        jwks_file=r.path(
            "AUTH_JWKS_FILE", doc="key source: a JWKS file (set exactly one of the three key sources)"
        ),
        algorithms=r.listed(
            "AUTH_ALGORITHMS", ALLOWED_ALGORITHMS, ALLOWED_ALGORITHMS, what="algorithms", doc="allow-list"
        ),
        dev_hs256_secret_file=r.path(
            "AUTH_DEV_HS256_SECRET_FILE",
            doc=(
                "key source: an HS256 secret file, dev mode only (`docbroker token`); never mixed with "
                "public keys"
            ),
        ),
        max_lifetime_seconds=r.integer("AUTH_MAX_LIFETIME", 3600, low=60, high=86_400, doc="max `exp - iat`"),
        leeway_seconds=r.integer(
            "AUTH_LEEWAY", 10, low=0, high=MAX_LEEWAY_SECONDS, doc="clock leeway, at most 30 s"
        ),
        max_header_bytes=r.integer(
            "AUTH_MAX_HEADER_BYTES",
            8192,
            low=1024,
            high=65_536,
            doc=(
                "bytes a token's JOSE header segment (before its first `.`) may have, checked before "
                "anything is decoded (1024-65536); the whole token may have 16384 or this plus 8192, "
                "whichever is more. `DOCBROKER_MAX_HEAD_BYTES` must exceed it by 4096"
            ),
        ),
    )
    if "#" in auth.issuer:  # a person's Cedar id ends with "#<issuer>" (broker.types.Principal)
        raise SettingsError(f"{PREFIX}AUTH_ISSUER must not hold '#'")
    sources = sum(x is not None for x in (auth.jwks_url, auth.jwks_file, auth.dev_hs256_secret_file))
    if sources != 1:
        raise SettingsError(
            f"{PREFIX}AUTH_JWKS_URL, {PREFIX}AUTH_JWKS_FILE and {PREFIX}AUTH_DEV_HS256_SECRET_FILE: "
            "set exactly one (HS256 dev mode is never mixed with public keys)"
        )
    return auth
