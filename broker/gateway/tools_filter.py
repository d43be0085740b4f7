"""What a caller may see: tool visibility by the policy's decisions.

`tools/list` shows only the tools the policy (`broker.policy`: the scopes, the tenant's
policy and any Cedar rule) would let the caller call without naming a document, and the
broker-only `approval_token` field is removed from `save_report`'s input schema: the model
never learns it exists, and a client that sends it anyway is rejected at the gateway.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

from broker.protocol.answers import BROKER_ONLY_ARGUMENT
from server.contracts import TOOL_SAVE


def visible_tools(tools: list[Any], may_call: Callable[[str], bool]) -> list[dict[str, Any]]:
    shown: list[dict[str, Any]] = []
    for tool in tools:
        if not isinstance(tool, dict) or not may_call(str(tool.get("name"))):
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
