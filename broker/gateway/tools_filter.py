"""What a caller may see and call: tool visibility by scope and tenant policy.

`tools/list` shows only what the caller's scopes and the tenant's policy allow, and the
broker-only `approval_token` field is removed from `save_report`'s input schema: the model
never learns it exists, and a client that sends it anyway is rejected at the gateway.
"""

from __future__ import annotations

import copy
from typing import Any

from broker.policy import TenantPolicy
from broker.protocol.answers import BROKER_ONLY_ARGUMENT
from broker.types import OAuthScope, Principal
from server.contracts import TOOL_READ, TOOL_SAVE, TOOL_SEARCH

_REQUIRED_SCOPE = {
    TOOL_SEARCH: OAuthScope.DOCS_READ,
    TOOL_READ: OAuthScope.DOCS_READ,
    TOOL_SAVE: OAuthScope.DOCS_WRITE,
}


def may_call(principal: Principal, policy: TenantPolicy, tool: str) -> bool:
    scope = _REQUIRED_SCOPE.get(tool)
    return scope is not None and principal.has(scope) and tool in policy.allowed_tools


def visible_tools(tools: list[Any], principal: Principal, policy: TenantPolicy) -> list[dict[str, Any]]:
    shown: list[dict[str, Any]] = []
    for tool in tools:
        if not isinstance(tool, dict) or not may_call(principal, policy, str(tool.get("name"))):
            continue
        if tool["name"] == TOOL_SAVE:
            tool = _without_broker_argument(tool)
        shown.append(tool)
    return shown


def _without_broker_argument(tool: dict[str, Any]) -> dict[str, Any]:
    tool = copy.deepcopy(tool)
    schema = tool.get("inputSchema")
    if isinstance(schema, dict):
        props = schema.get("properties")
        if isinstance(props, dict):
            props.pop(BROKER_ONLY_ARGUMENT, None)
        required = schema.get("required")
        if isinstance(required, list):
            schema["required"] = [r for r in required if r != BROKER_ONLY_ARGUMENT]
    return tool
