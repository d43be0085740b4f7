"""The answers the broker writes itself, in the tools' one result shape (server/contracts.py).

A client cannot tell a result the broker wrote from one a sandbox produced and the broker
checked: both are a `CallToolResult` whose single text block is the compact JSON of its
`structuredContent`.
"""

from __future__ import annotations

from typing import Any, Final

from broker.protocol.codec import encode
from broker.protocol.jsonrpc import RpcMessage
from server import contracts as c

# The one argument of `save_report` only the broker sets (the approval token): hidden from
# `tools/list`, refused from a client. Named by the tools' contract, checked here against it.
BROKER_ONLY_ARGUMENT: Final = "approval_token"
if BROKER_ONLY_ARGUMENT not in c.SaveInput.model_fields:
    raise ImportError("server.contracts.SaveInput no longer has the broker-only argument")


def broker_result(status: c.Status, message: str, data: dict[str, Any] | None = None) -> dict[str, Any]:
    """A CallToolResult in the tools' one result shape, written by the broker."""
    structured = {"status": status.value, "message": message, "data": data}
    return {"content": [text_block(structured)], "structuredContent": structured, "isError": False}


def write_unknown() -> dict[str, Any]:
    """A save that may or may not have happened: never retried, never reported as done."""
    return broker_result(c.Status.RESULT_UNKNOWN, c.Message.WRITE_UNKNOWN.value)


def write_failed() -> dict[str, Any]:
    return broker_result(c.Status.FAILED, c.Message.WRITE_FAILED.value)


def text_block(structured: dict[str, Any]) -> dict[str, Any]:
    return {"type": "text", "text": compact_text(structured)}


def compact_text(structured: dict[str, Any]) -> str:
    """The one text block's text: the compact JSON of the structured result."""
    return encode(structured).decode()


def typed(msg: RpcMessage, result: dict[str, Any]) -> dict[str, Any]:
    """2026-07-28 results carry their type; handshake-era results do not."""
    if msg.protocol_version is None:
        return {k: v for k, v in result.items() if k != "resultType"}
    return {"resultType": "complete", **result}
