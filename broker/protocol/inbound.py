"""The `mcp` SDK's inbound ladder, run by the broker before it routes anything (DESIGN §15).

A client must get from the broker the answer the SDK's own server would give, for methods the
broker forwards and for those it answers itself. So the envelope is checked here with the
SDK's own functions, in the order its HTTP entry runs them (`mcp.server._streamable_http_modern`
for 2026-07-28, `mcp.server.streamable_http` for the handshake era):

1. `Content-Type` of a POST (the SDK's `TransportSecurityMiddleware`: 400, a plain-text body);
2. 2026-07-28: any HTTP method but POST is 405 (`Allow: POST`); `Accept` must take JSON and
   SSE (406, no body);
3. the body is JSON (-32700), one request or notification (-32600 for a batch, a posted
   response, a bad `id` or `params`); a 2026-07-28 notification is acknowledged 202 (the SDK
   drops it) once its version is served (-32022);
4. 2026-07-28: routing headers given once (-32020), `mcp.shared.inbound.classify_inbound_request`
   (`_meta` keys -32602, headers against the body -32020, the version -32022 with
   `data.supported`); then, once the broker's method allow-list has passed it (the SDK's
   dispatch finds the method first), the params against the SDK's own request models
   (`mcp_types.methods.validate_client_request`: -32602, or -32601 for a method the version
   has not).

The SDK functions are called, not copied: the one module-private step is the HTTP entry
itself (it answers on the ASGI `send`), whose order is the list above. Statuses come from the
SDK's own table (`ERROR_CODE_HTTP_STATUS`). What the broker answers before any of this
(authentication, Origin, body size) is listed in docs/architecture.md.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Final

import mcp_types
from mcp.server.streamable_http import check_accept_headers
from mcp.shared.inbound import (
    ERROR_CODE_HTTP_STATUS,
    InboundLadderRejection,
    classify_inbound_request,
    decode_header_value,
    find_duplicated_routing_header,
    unsupported_protocol_version_rejection,
)
from mcp_types import methods as sdk_methods
from mcp_types.jsonrpc import jsonrpc_message_adapter
from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS
from pydantic import ValidationError
from starlette.requests import Request

from broker.protocol import jsonrpc as rpc
from broker.protocol.codec import loads_client

# The audit's fixed code for each refusal, by JSON-RPC code (the SDK's texts go to the client).
REASONS: Final[Mapping[int, str]] = {
    rpc.PARSE_ERROR: "parse_error",
    rpc.INVALID_REQUEST: "invalid_request",
    rpc.METHOD_NOT_FOUND: "method_not_found",
    rpc.INVALID_PARAMS: "invalid_params",
    rpc.HEADER_MISMATCH: "header_mismatch",
    rpc.UNSUPPORTED_VERSION: "unsupported_version",
}

# The SDK's own texts for what its ladder and its dispatch answer: a sandbox's error keeps its
# message only if it is one of these (the sandbox is not trusted with words of its own).
_FIXED_TEXTS: Final[Mapping[int, str]] = {
    rpc.PARSE_ERROR: "Parse error",
    rpc.INVALID_REQUEST: "Invalid request",
    rpc.METHOD_NOT_FOUND: "Method not found",
    rpc.INVALID_PARAMS: "Invalid request parameters",
    rpc.INTERNAL_ERROR: "Internal server error",
    rpc.HEADER_MISMATCH: "Header mismatch",
    rpc.UNSUPPORTED_VERSION: "Unsupported protocol version",
}
_INVALID_BODY = "Body must be a single JSON-RPC request or notification object"
_NOT_ACCEPTABLE = "Not Acceptable: Client must accept both application/json and text/event-stream"
_SDK_TEXTS: Final[Mapping[int, frozenset[str]]] = {
    **{code: frozenset({text}) for code, text in _FIXED_TEXTS.items()},
    rpc.INVALID_REQUEST: frozenset(
        {"Invalid request", _INVALID_BODY, _NOT_ACCEPTABLE, "Bad Request: Missing session ID"}
    ),
}


@dataclass(frozen=True)
class Refusal:
    """The SDK's answer to a request its ladder refuses: a JSON-RPC error, or HTTP alone."""

    status: int
    reason: str  # the audit's fixed code
    body: dict[str, Any] | None = None  # a JSON-RPC error
    text: bytes = b""  # or a plain-text body (the SDK's HTTP-layer refusals), or nothing
    headers: dict[str, str] = field(default_factory=dict)
    msg: rpc.RpcMessage | None = None  # the request refused, when it was read (for the audit)


ACKNOWLEDGED: Final = Refusal(202, "notification_dropped")  # not a refusal: the SDK's 202


def is_modern(headers: Mapping[str, str]) -> bool:
    """The SDK's era routing: a version header that names no handshake version is 2026-07-28."""
    version = headers.get("mcp-protocol-version")
    return version is not None and version not in HANDSHAKE_PROTOCOL_VERSIONS


def http_layer(http_method: str, headers: Mapping[str, str], modern: bool) -> Refusal | None:
    """Content-Type, the HTTP method and `Accept`, before the body is read."""
    if http_method == "POST" and not headers.get("content-type", "").lower().startswith("application/json"):
        return Refusal(400, "unsupported_media_type", text=b"Invalid Content-Type header")
    if modern and http_method != "POST":
        return Refusal(405, "http_method_not_allowed", headers={"allow": "POST"})
    has_json, has_sse = check_accept_headers(_accept_only(headers))
    if http_method != "POST" or (has_json and has_sse):
        return None
    if modern:
        return Refusal(406, "not_acceptable")
    return _refusal(None, rpc.INVALID_REQUEST, _NOT_ACCEPTABLE, None, status=406)


def parse(
    raw: bytes, headers: Mapping[str, str], raw_headers: list[tuple[str, str]]
) -> rpc.RpcMessage | Refusal:
    """The body through the SDK's ladder of its era: the message, or the SDK's refusal."""
    try:
        decoded = loads_client(raw)
    except (ValueError, RecursionError):
        return _refusal(None, rpc.PARSE_ERROR, "Parse error", None)
    if not is_modern(headers):
        try:
            jsonrpc_message_adapter.validate_python(decoded, by_name=False)
        except ValidationError:
            return _refusal(None, rpc.INVALID_PARAMS, "Validation error", None, status=400)
        return rpc.RpcMessage(decoded)
    if isinstance(decoded, dict) and "id" not in decoded:
        return _notification(decoded, headers)
    try:
        mcp_types.JSONRPCRequest.model_validate(decoded)
    except ValidationError:
        refusal = _refusal(None, rpc.INVALID_REQUEST, _INVALID_BODY, None)
        return replace(refusal, reason="batch_rejected") if isinstance(decoded, list) else refusal
    msg = rpc.RpcMessage(decoded)
    duplicated = find_duplicated_routing_header(raw_headers)
    if duplicated is not None:
        refusal = _refusal(msg.id, rpc.HEADER_MISMATCH, f"{duplicated} header appears more than once", None)
        return replace(refusal, msg=msg)
    verdict = classify_inbound_request(decoded, headers=dict(headers))
    if isinstance(verdict, InboundLadderRejection):
        return replace(_refusal(msg.id, verdict.code, verdict.message, verdict.data), msg=msg)
    return msg


def check_params(msg: rpc.RpcMessage) -> Refusal | None:
    """A 2026-07-28 request's params against the SDK's own request model of its method and
    version (what the SDK's dispatch does once it has found the method's handler: the broker's
    method allow-list comes first). -32601 for a method the version has not (`ping`)."""
    if msg.id is None or msg.protocol_version is None:
        return None
    try:
        sdk_methods.validate_client_request(msg.method or "", msg.protocol_version, msg.body.get("params"))
    except KeyError:
        return _refusal(msg.id, rpc.METHOD_NOT_FOUND, "Method not found", None)
    except ValidationError:
        return _refusal(msg.id, rpc.INVALID_PARAMS, "Invalid request parameters", "")
    return None


def name_header(headers: Mapping[str, str]) -> str | None:
    """`Mcp-Name` as the SDK reads it (a `=?base64?...?=` value decoded)."""
    return decode_header_value(headers.get("mcp-name"))


def sandbox_error(request_id: rpc.RequestId | None, error: Any) -> dict[str, Any]:
    """A JSON-RPC error a sandbox answered, as the client gets it: the code kept, the message
    only if it is one of the SDK's fixed texts, else the fixed text of its code."""
    code = error.get("code") if isinstance(error, dict) else None
    if not isinstance(code, int) or isinstance(code, bool) or not -(2**31) <= code < 2**31:
        code = rpc.INTERNAL_ERROR
    message = error.get("message") if isinstance(error, dict) else None
    if message not in _SDK_TEXTS.get(code, ()):
        message = _FIXED_TEXTS.get(code, "Request refused")
    return rpc.error(request_id, code, str(message))


def error_status(code: int) -> int:
    """The HTTP status the SDK's 2026-07-28 entry gives an error of `code` (200 when none)."""
    return ERROR_CODE_HTTP_STATUS.get(code, 200)


def _notification(decoded: dict[str, Any], headers: Mapping[str, str]) -> Refusal:
    try:
        mcp_types.JSONRPCNotification.model_validate(decoded)
    except ValidationError:
        return _refusal(None, rpc.INVALID_REQUEST, _INVALID_BODY, None)
    unsupported = unsupported_protocol_version_rejection(headers.get("mcp-protocol-version", ""))
    if unsupported is not None:
        return _refusal(None, unsupported.code, unsupported.message, unsupported.data)
    return ACKNOWLEDGED


def _refusal(request_id: Any, code: int, message: str, data: Any, status: int | None = None) -> Refusal:
    error: dict[str, Any] = {"code": code, "message": message}
    if data is not None:
        error["data"] = data
    body = {"jsonrpc": "2.0", "id": request_id, "error": error}
    reason = "not_acceptable" if status == 406 else REASONS.get(code, "invalid_request")
    return Refusal(status or error_status(code), reason, body=body)


def _accept_only(headers: Mapping[str, str]) -> Request:
    """The SDK's Accept check reads a Starlette request: one carrying only that header."""
    accept = headers.get("accept", "").encode("latin-1")
    return Request({"type": "http", "headers": [(b"accept", accept)]})
