"""Policy (DESIGN §14): tenant limits from TOML, and the decisions about a request in Cedar.

- tenants.py: the TOML files (`Policies`, `TenantPolicy`), rate and concurrency limits
- compile.py: the TOML tool lists and the scopes, as Cedar policies
- cedar.py: the policy set (schema, validation, hash) and its decisions (`PolicyEngine`)
- table.py: tables of requests and expected decisions (`docbroker policy test`)
- tool.py: `docbroker policy validate|test|explain`
"""

from broker.policy.cedar import Call, Decision, PolicyEngine
from broker.policy.compile import APPROVE
from broker.policy.tenants import (
    REQUIRED_SCOPE,
    Policies,
    PolicyError,
    Share,
    TenantLimiter,
    TenantPolicy,
    toml_permits,
)

__all__ = [
    "APPROVE",
    "REQUIRED_SCOPE",
    "Call",
    "Decision",
    "Policies",
    "PolicyEngine",
    "PolicyError",
    "Share",
    "TenantLimiter",
    "TenantPolicy",
    "toml_permits",
]
