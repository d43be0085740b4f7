"""Today's TOML, as Cedar: the broker's built-in rules and one permit per tenant file.

- `builtin.scope.*` (forbid): a tool needs its scope (DESIGN §5). Always loaded: a Cedar
  policy may narrow what a token grants, never widen it.
- `builtin.own_tenant` (forbid): a principal acts only on its own tenant's tools.
- `builtin.scope.reports_approve` (forbid): deciding or viewing approvals needs `reports:approve`.
- `toml.tenants.<tenant>` (permit): the tools `tools.allowed` of the tenant's file (after
  default.toml) names, and `approve` and `view_approvals` (the TOML never limited which of
  the tenant's approvers decides or looks).
- `toml.tenants.<tenant>.distinct_approver` (forbid), for a file with
  `approvals.require_distinct_approver = true`: the requester does not approve their own report.

Nothing else of the TOML (limits, approvals) is a decision about a request's right to call: it
stays in `TenantPolicy`. Together these give exactly the TOML path's decisions
(`toml_permits`); tests/broker/policy/test_policy_migration.py checks it over a generated table.
"""

from __future__ import annotations

from broker.policy.tenants import REQUIRED_SCOPE, Policies
from broker.types import OAuthScope
from server.contracts import TOOL_NAMES

RESERVED_PREFIXES = ("builtin.", "toml.")
APPROVE = "approve"  # the action of an approver's decision
VIEW_APPROVALS = "view_approvals"  # listing the tenant's approvals, reading one
APPROVAL_ACTIONS = (APPROVE, VIEW_APPROVALS)
ACTIONS = (*TOOL_NAMES, *APPROVAL_ACTIONS)
ACTION_SCOPE = {  # the scope each action's `builtin.scope.*` forbid demands
    **REQUIRED_SCOPE,
    APPROVE: OAuthScope.REPORTS_APPROVE,
    VIEW_APPROVALS: OAuthScope.REPORTS_APPROVE,
}


def _action(tool: str) -> str:
    return f'Docbroker::Action::"{tool}"'


def builtin_policies() -> str:
    rules: list[str] = []
    for scope in OAuthScope:
        tools = [t for t in ACTIONS if ACTION_SCOPE.get(t) == scope]
        if not tools:
            continue
        actions = ", ".join(_action(t) for t in tools)
        rules.append(
            f'@id("builtin.scope.{scope.value.replace(":", "_")}")\n'
            f"forbid (principal, action in [{actions}], resource)\n"
            f'unless {{ context.scopes.contains("{scope.value}") }};'
        )
    rules.append(
        '@id("builtin.own_tenant")\n'
        "forbid (principal, action, resource)\n"
        "unless { resource.tenant == principal.tenant };"
    )
    return "\n\n".join(rules) + "\n"


def tenant_policies(policies: Policies) -> str:
    """One permit per tenant file. Tenant ids are DNS labels and tool names come from
    `TOOL_NAMES` (both checked at load), so nothing here needs quoting."""
    rules: list[str] = []
    for tenant, policy in sorted(policies.by_tenant.items()):
        tools = [t for t in TOOL_NAMES if t in policy.allowed_tools] + list(APPROVAL_ACTIONS)
        actions = ", ".join(_action(t) for t in tools)
        rules.append(
            f'@id("toml.tenants.{tenant}")\n'
            f'permit (principal in Docbroker::Tenant::"{tenant}", action in [{actions}], '
            f'resource in Docbroker::Tenant::"{tenant}");'
        )
        if policy.require_distinct_approver:
            rules.append(
                f'@id("toml.tenants.{tenant}.distinct_approver")\n'
                f'forbid (principal in Docbroker::Tenant::"{tenant}", action == {_action(APPROVE)}, '
                f'resource in Docbroker::Tenant::"{tenant}")\nwhen {{ context.self_approval }};'
            )
    return "\n\n".join(rules) + "\n"
