"""Tenant policy files: which tools a tenant may use, how fast, how many at once.

Policies are TOML files in the policies folder, read once at start-up:

    policies/default.toml          defaults for every tenant
    policies/tenants/<tenant>.toml one per tenant; its existence is what makes a tenant known

A tenant file overrides the defaults key by key. Unknown keys are errors: a typo in a
security policy must not silently fall back to a default.

Which tools a caller may use is decided by Cedar (`broker.policy.cedar`): the tool lists here
are compiled to Cedar (`broker.policy.compile`). `toml_permits` is the decision as these files
alone gave it, kept as the reference the compiled Cedar is tested and benchmarked against.
"""

from __future__ import annotations

import math
import time
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any

from broker.types import OAuthScope
from server.contracts import TENANT_RE, TOOL_NAMES, TOOL_READ, TOOL_SAVE, TOOL_SEARCH

# The scope a token needs for each tool (DESIGN §5): Cedar's built-in forbids say the same.
REQUIRED_SCOPE: dict[str, OAuthScope] = {
    TOOL_SEARCH: OAuthScope.DOCS_READ,
    TOOL_READ: OAuthScope.DOCS_READ,
    TOOL_SAVE: OAuthScope.DOCS_WRITE,
}


class PolicyError(ValueError):
    """A policy file is invalid; raised at start-up, names the file and key."""


@dataclass(frozen=True)
class TenantPolicy:
    tenant: str
    allowed_tools: frozenset[str] = frozenset(TOOL_NAMES)
    rate_per_minute: int = 600
    burst: int = 60
    max_concurrent: int = 8
    # A standing GET stream (a 2025-era session's server-to-client channel) is held for as long
    # as the client stays: it has a cap of its own, so idle clients never take `max_concurrent`.
    max_streams: int = 8
    require_distinct_approver: bool = False
    max_pending_approvals: int = 50


POLICY_SCHEMA: dict[str, dict[str, type]] = {
    "tools": {"allowed": list},
    "limits": {"rate_per_minute": int, "burst": int, "max_concurrent": int, "max_streams": int},
    "approvals": {"require_distinct_approver": bool, "max_pending": int},
}


def _merge(base: dict[str, Any], override: Mapping[str, Any], source: str) -> dict[str, Any]:
    merged = {section: dict(values) for section, values in base.items()}
    for section, values in override.items():
        if section not in POLICY_SCHEMA or not isinstance(values, dict):
            raise PolicyError(f"{source}: unknown section [{section}]")
        for key, value in values.items():
            expected = POLICY_SCHEMA[section].get(key)
            if expected is None:
                raise PolicyError(f"{source}: unknown key {section}.{key}")
            # bool is an int in Python: check it explicitly so `burst = true` is an error.
            if not isinstance(value, expected) or (expected is int and isinstance(value, bool)):
                raise PolicyError(f"{source}: {section}.{key} must be {expected.__name__}")
            merged.setdefault(section, {})[key] = value
    return merged


def _build(tenant: str, doc: Mapping[str, Any], source: str) -> TenantPolicy:
    tools = doc.get("tools", {}).get("allowed", list(TOOL_NAMES))
    unknown = [t for t in tools if t not in TOOL_NAMES]
    if unknown:
        raise PolicyError(f"{source}: tools.allowed names unknown tools")
    limits = doc.get("limits", {})
    approvals = doc.get("approvals", {})
    policy = TenantPolicy(
        tenant=tenant,
        allowed_tools=frozenset(tools),
        rate_per_minute=limits.get("rate_per_minute", 600),
        burst=limits.get("burst", 60),
        max_concurrent=limits.get("max_concurrent", 8),
        max_streams=limits.get("max_streams", 8),
        require_distinct_approver=approvals.get("require_distinct_approver", False),
        max_pending_approvals=approvals.get("max_pending", 50),
    )
    for name in ("rate_per_minute", "burst", "max_concurrent", "max_streams", "max_pending_approvals"):
        if not 1 <= getattr(policy, name) <= 1_000_000:
            raise PolicyError(f"{source}: {name} must be between 1 and 1000000")
    return policy


def _read_toml(path: Path) -> dict[str, Any]:
    try:
        with path.open("rb") as f:
            return tomllib.load(f)
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise PolicyError(f"{path.name}: cannot be read as TOML ({type(exc).__name__})") from None


@dataclass
class Policies:
    """All tenant policies, loaded once."""

    by_tenant: dict[str, TenantPolicy] = field(default_factory=dict)

    @classmethod
    def load(cls, folder: Path) -> Policies:
        default_file = folder / "default.toml"
        base = _merge({}, _read_toml(default_file), default_file.name) if default_file.exists() else {}
        policies: dict[str, TenantPolicy] = {}
        tenants_dir = folder / "tenants"
        for path in sorted(tenants_dir.glob("*.toml")) if tenants_dir.is_dir() else []:
            tenant = path.stem
            if not TENANT_RE.fullmatch(tenant):
                raise PolicyError(f"{path.name}: file name must be a tenant id (DNS label)")
            doc = _merge(base, _read_toml(path), f"tenants/{path.name}")
            policies[tenant] = _build(tenant, doc, f"tenants/{path.name}")
        return cls(policies)

    def known(self, tenant: str) -> bool:
        return tenant in self.by_tenant

    def get(self, tenant: str) -> TenantPolicy:
        return self.by_tenant[tenant]


def toml_permits(scopes: frozenset[OAuthScope], policy: TenantPolicy, tool: str) -> bool:
    """The TOML path's decision: the token holds the tool's scope and the tenant's file allows it."""
    scope = REQUIRED_SCOPE.get(tool)
    return scope is not None and scope in scopes and tool in policy.allowed_tools


def toml_may_approve(scopes: frozenset[OAuthScope], policy: TenantPolicy, self_approval: bool) -> bool:
    """The TOML path's decision on an approver: the scope, and not their own report where the
    tenant's file demands a second person."""
    return OAuthScope.REPORTS_APPROVE in scopes and not (self_approval and policy.require_distinct_approver)


@dataclass(frozen=True)
class Share:
    """One replica's part of a tenant's limits: each of `replicas` enforces ceil(limit / replicas).

    With requests spread evenly the tenant gets at most its limit (plus at most replicas - 1 of
    rounding); with all of them on one replica, 1/replicas of it. No state is shared: a replica
    that dies takes its part with it, and nothing on the request path waits for a peer.
    """

    rate_per_minute: int
    burst: int
    max_concurrent: int
    max_streams: int

    @classmethod
    def of(cls, policy: TenantPolicy, replicas: int) -> Share:
        def part(limit: int) -> int:
            return max(1, math.ceil(limit / replicas))

        return cls(
            part(policy.rate_per_minute),
            part(policy.burst),
            part(policy.max_concurrent),
            part(policy.max_streams),
        )


class Slot(StrEnum):
    """What a tenant's request holds while it runs, each kind with its own cap."""

    REQUEST = "request"  # a request in flight: `max_concurrent`
    STREAM = "stream"  # a standing GET stream, held while its client stays: `max_streams`


class TenantLimiter:
    """Per-tenant token bucket and caps on what is held at once, this replica's share of them
    (`Share`). Single event loop: no locks needed."""

    def __init__(
        self, policies: Policies, clock: Callable[[], float] = time.monotonic, *, replicas: int = 1
    ) -> None:
        if replicas < 1:
            raise ValueError("replicas must be at least 1")
        self._policies = policies
        self._clock = clock
        self._replicas = replicas
        self._shares: dict[str, Share] = {}
        self._tokens: dict[str, float] = {}
        self._stamp: dict[str, float] = {}
        self._held: dict[tuple[str, Slot], int] = {}

    def share(self, tenant: str) -> Share:
        found = self._shares.get(tenant)
        if found is None:
            found = self._shares[tenant] = Share.of(self._policies.get(tenant), self._replicas)
        return found

    def take(self, tenant: str) -> float:
        """Take one request token. Returns 0 when allowed, else seconds until one is free."""
        share = self.share(tenant)
        now = self._clock()
        rate = share.rate_per_minute / 60.0
        tokens = min(
            float(share.burst),
            self._tokens.get(tenant, float(share.burst)) + (now - self._stamp.get(tenant, now)) * rate,
        )
        self._stamp[tenant] = now
        if tokens >= 1.0:
            self._tokens[tenant] = tokens - 1.0
            return 0.0
        self._tokens[tenant] = tokens
        return max(math.ceil((1.0 - tokens) / rate), 1)

    def enter(self, tenant: str, slot: Slot = Slot.REQUEST) -> bool:
        """Take one of the tenant's slots of this kind; False when all of them are held."""
        share = self.share(tenant)
        cap = share.max_streams if slot is Slot.STREAM else share.max_concurrent
        held = self._held.get((tenant, slot), 0)
        if held >= cap:
            return False
        self._held[(tenant, slot)] = held + 1
        return True

    def leave(self, tenant: str, slot: Slot = Slot.REQUEST) -> None:
        self._held[(tenant, slot)] -= 1
