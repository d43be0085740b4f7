"""JSON-RPC: what a request asks for, in names only; the error codes; answers' envelopes.

The broker reads a request just far enough to route, authorise and audit it; the body is
forwarded as received unless the broker must change it (an approval token injected).
"""

from __future__ import annotations

from typing import Any

from broker.protocol.codec import encode as encode
from broker.protocol.codec import loads_client
from broker.protocol.versions import META_CAPABILITIES, META_PROTOCOL

# JSON-RPC 2.0 codes, plus MCP's: routing headers that disagree with the body, a version not served.
PARSE_ERROR = -32700
INVALID_REQUEST = -32600
METHOD_NOT_FOUND = -32601
INVALID_PARAMS = -32602
INTERNAL_ERROR = -32603
HEADER_MISMATCH = -32020
UNSUPPORTED_VERSION = -32022
# Implementation-defined server errors (-32000..-32099).
UNAVAILABLE = -32001
RATE_LIMITED = -32002
FORBIDDEN = -32003
AUDIT_UNAVAILABLE = -32004

RequestId = str | int


class RpcParseError(Exception):
    def __init__(self, code: int, reason: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.reason = reason  # fixed code for the audit log
        self.message = message  # fixed text for the client


class RpcMessage:
    """One JSON-RPC message from the client, in the parts the hot path reads.

    The parts are read from the body once, here: every request reads most of them, and
    `functools.cached_property` takes a lock on each first read (Python 3.11). The body is
    never changed (forwarding with other arguments builds a new body)."""

    __slots__ = ("body", "id", "meta", "method", "params", "protocol_version", "tool")

    def __init__(self, body: dict[str, Any]) -> None:
        self.body = body
        rpc_id = body.get("id")
        self.id: RequestId | None = (
            rpc_id if isinstance(rpc_id, str | int) and not isinstance(rpc_id, bool) else None
        )
        method = body.get("method")
        self.method: str | None = method if isinstance(method, str) else None
        params = body.get("params")
        self.params: dict[str, Any] = params if isinstance(params, dict) else {}
        meta = self.params.get("_meta")
        self.meta: dict[str, Any] = meta if isinstance(meta, dict) else {}
        name = self.params.get("name") if self.method == "tools/call" else None
        self.tool: str | None = name if isinstance(name, str) else None
        version = self.meta.get(META_PROTOCOL)
        self.protocol_version: str | None = version if isinstance(version, str) else None

    @property
    def is_response(self) -> bool:
        """A client's answer to a server request (legacy sessions)."""
        return "method" not in self.body and ("result" in self.body or "error" in self.body)

    @property
    def arguments(self) -> dict[str, Any]:
        value = self.params.get("arguments")
        return value if isinstance(value, dict) else {}

    @property
    def arg_names(self) -> list[str]:
        return sorted(str(k) for k in self.arguments)

    def client_capabilities(self) -> dict[str, Any]:
        value = self.meta.get(META_CAPABILITIES)
        return value if isinstance(value, dict) else {}


def parse(raw: bytes) -> RpcMessage:
    try:
        body = loads_client(raw)
    except (ValueError, RecursionError):
        raise RpcParseError(PARSE_ERROR, "parse_error", "Parse error: body is not JSON") from None
    if isinstance(body, list):
        raise RpcParseError(INVALID_REQUEST, "batch_rejected", "JSON-RPC batches are not supported")
    if not isinstance(body, dict) or body.get("jsonrpc") != "2.0":
        raise RpcParseError(INVALID_REQUEST, "invalid_request", "Invalid Request: not a JSON-RPC 2.0 object")
    message = RpcMessage(body)
    if not message.is_response and message.method is None:
        raise RpcParseError(INVALID_REQUEST, "invalid_request", "Invalid Request: method missing")
    return message


def error(request_id: RequestId | None, code: int, message: str) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": request_id, "error": {"code": code, "message": message}}


def result(request_id: RequestId | None, value: dict[str, Any]) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": request_id, "result": value}
