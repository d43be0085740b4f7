"""Which JSON-RPC methods may cross the gateway, in each direction.

The document tools need very little of MCP. Everything else — completion, resources,
prompts, logging control, sampling, elicitation and roots requests from the sandbox — is
refused: a feature nobody uses is only attack surface, and a hostile sandbox must not be able
to ask the client's model or user anything.
"""

from __future__ import annotations

from typing import Any

# Client → sandbox.
CLIENT_REQUESTS = frozenset({"server/discover", "initialize", "ping", "tools/list", "tools/call"})
CLIENT_NOTIFICATIONS = frozenset({"notifications/initialized", "notifications/cancelled"})
# Sandbox → client, inside a response stream: notifications only, and only these.
SERVER_NOTIFICATIONS = frozenset(
    {"notifications/progress", "notifications/cancelled", "notifications/message"}
)


# Every method name MCP defines: the audit log records a method by name only when it is one
# of these; anything else a client or sandbox invents is recorded as "other", so a made-up
# method name cannot carry data into the log.
MCP_METHODS = CLIENT_REQUESTS | CLIENT_NOTIFICATIONS | SERVER_NOTIFICATIONS | frozenset(
    {"completion/complete", "logging/setLevel", "prompts/get", "prompts/list", "resources/list",
     "resources/read", "resources/subscribe", "resources/unsubscribe", "resources/templates/list",
     "sampling/createMessage", "elicitation/create", "roots/list", "subscriptions/listen",
     "notifications/roots/list_changed", "notifications/resources/updated",
     "notifications/resources/list_changed", "notifications/tools/list_changed",
     "notifications/prompts/list_changed", "notifications/elicitation/complete", "tasks/get",
     "tasks/list", "tasks/cancel", "tasks/result", "GET", "POST", "DELETE", "response"}
)  # fmt: skip


def audit_method(method: object) -> str:
    return method if isinstance(method, str) and method in MCP_METHODS else "other"


def client_may_send(method: str | None, is_notification: bool) -> bool:
    if method is None:
        return False  # a client's response to a server request: the sandbox may not ask any
    return method in (CLIENT_NOTIFICATIONS if is_notification else CLIENT_REQUESTS)


def sandbox_may_send(message: dict[str, Any]) -> bool:
    """May this message from the sandbox, other than the response itself, reach the client?"""
    return "id" not in message and message.get("method") in SERVER_NOTIFICATIONS
