"""Policy (DESIGN §14): tenant limits from TOML, and the decisions about a request in Cedar.

- tenants.py: the TOML files (`Policies`, `TenantPolicy`), rate and concurrency limits
- compile.py: the TOML tool lists and the scopes, as Cedar policies
- cedar.py: the policy set (schema, validation, hash) and its decisions (`PolicyEngine`)
- live.py: the set in force, reloaded when its files change or on SIGHUP (`LivePolicy`)
- table.py: tables of requests and expected decisions (`docbroker policy test`)
- checks.py: `docbroker policy validate|test|explain`: the set loaded as `serve` loads it, then checked
"""

from broker.policy.cedar import Call, Decider, Decision, PolicyEngine
from broker.policy.compile import APPROVE, VIEW_APPROVALS
from broker.policy.live import LivePolicy
from broker.policy.tenants import (
    POLICY_SCHEMA,
    REQUIRED_SCOPE,
    Policies,
    PolicyError,
    Share,
    Slot,
    TenantLimiter,
    TenantPolicy,
    toml_may_approve,
    toml_permits,
)

__all__ = [
    "APPROVE",
    "POLICY_SCHEMA",
    "REQUIRED_SCOPE",
    "VIEW_APPROVALS",
    "Call",
    "Decider",
    "Decision",
    "LivePolicy",
    "Policies",
    "PolicyEngine",
    "PolicyError",
    "Share",
    "Slot",
    "TenantLimiter",
    "TenantPolicy",
    "toml_may_approve",
    "toml_permits",
]
