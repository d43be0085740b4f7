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


def client_may_send(method: str | None, is_notification: bool) -> bool:
    if method is None:
        return False  # a client's response to a server request: the sandbox may not ask any
    return method in (CLIENT_NOTIFICATIONS if is_notification else CLIENT_REQUESTS)


def sandbox_may_send(message: dict[str, Any]) -> bool:
    """May this message from the sandbox, other than the response itself, reach the client?"""
    return "id" not in message and message.get("method") in SERVER_NOTIFICATIONS
