"""What crosses the gateway besides the JSON-RPC message: header allow-lists both ways, the
routing headers' agreement with the body, and the body forwarded to the sandbox.

Only protocol headers cross to the sandbox. The caller's `Authorization` header never does:
the sandbox is not trusted with anyone's credentials.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

from broker.errors import Denial, Denied
from broker.protocol import inbound
from broker.protocol import jsonrpc as rpc
from broker.protocol.codec import loads_client
from server import contracts as c

# Request headers forwarded to the sandbox (lower-case); `mcp-param-*` is matched by prefix.
FORWARD_REQUEST = frozenset(
    {
        "content-type",
        "accept",
        "mcp-protocol-version",
        "mcp-method",
        "mcp-name",
        "mcp-session-id",
        "last-event-id",
    }
)
PARAM_PREFIX = "mcp-param-"
# Response headers passed back to the client, each rebuilt or checked (the values are the
# sandbox's words): the media type as one of the two the protocol uses, a session id only in
# the protocol's form, and the broker's own `cache-control` (a sandbox must not be able to make
# a shared cache keep a tenant's documents).
_MEDIA_TYPES = ((b"text/event-stream", "text/event-stream"), (b"application/json", "application/json"))
_SESSION_ID = re.compile(r"[\x21-\x7e]{1,128}")  # visible ASCII (MCP transport spec)
_NO_STORE = (b"cache-control", b"no-store")
# The `Mcp-Param-*` names the tools' contract declares (`x-mcp-header`): any other such name is
# the client's own invention, a value (`Mcp-Param-Secret-Q3-Layoffs-Plan.Md`), audited as "other".
_KNOWN_PARAM_HEADERS = {
    f"{PARAM_PREFIX}{header}".lower(): f"{PARAM_PREFIX}{header}".title()
    for tool in c.TOOL_NAMES
    for prop in c.input_schema(tool).get("properties", {}).values()
    if isinstance(header := prop.get("x-mcp-header"), str)
}


def request_headers(headers: Iterable[tuple[str, str]]) -> dict[str, str]:
    out = {name: value for name, value in headers if name in FORWARD_REQUEST or name.startswith(PARAM_PREFIX)}
    out["host"] = "localhost"
    return out


def response_headers(headers: Mapping[str, str]) -> list[tuple[bytes, bytes]]:
    """What the client gets of a sandbox's response headers (names lower-cased, as parsed)."""
    out = [_NO_STORE]
    ctype = headers.get("content-type", "")
    for media, prefix in _MEDIA_TYPES:
        if ctype.startswith(prefix):
            out.append((b"content-type", media))
            break
    session = session_id(headers)
    if session is not None:
        out.append((b"mcp-session-id", session.encode("ascii")))
    return out


def session_id(headers: Mapping[str, str]) -> str | None:
    """The sandbox's `mcp-session-id`, if it has the protocol's form (else there is none)."""
    value = headers.get("mcp-session-id")
    return value if value is not None and _SESSION_ID.fullmatch(value) else None


def param_header_names(headers: Iterable[str]) -> list[str]:
    """The `Mcp-Param-*` header names of a request, as the audit may record them."""
    return sorted({_KNOWN_PARAM_HEADERS.get(n, "other") for n in headers if n.startswith(PARAM_PREFIX)})


def check_routing_headers(msg: rpc.RpcMessage, headers: dict[str, str]) -> None:
    """2026-07-28 routing headers must agree with the body, or policy could judge one thing
    while the sandbox routes another."""
    method_header = headers.get("mcp-method")
    if method_header is not None and method_header != msg.method:
        raise Denied(Denial.BAD_REQUEST, "routing_header_mismatch")
    name_header = inbound.name_header(headers)  # a `=?base64?...?=` value decoded, as the SDK does
    if "mcp-name" in headers and msg.method == "tools/call" and name_header != msg.tool:
        raise Denied(Denial.BAD_REQUEST, "routing_header_mismatch")


def forward_body(msg: rpc.RpcMessage, arguments: dict[str, Any]) -> bytes:
    # The in-band answer is the broker's business: the sandbox gets a plain call with the token.
    params = {k: v for k, v in msg.params.items() if k not in ("requestState", "inputResponses")}
    params["arguments"] = arguments
    return rpc.encode({**msg.body, "params": params})


def traced_body(msg: rpc.RpcMessage, body: bytes, traceparent: str) -> bytes:
    """A 2026-07-28 request's body as forwarded while the broker traces it: its
    `_meta.traceparent` (SEP-414) is the broker's span, the parent the SDK in the sandbox gives
    its own spans, as the `traceparent` header is for the sandbox's span records. The caller's
    `tracestate` is not followed (docs/tracing.md), so it is not passed on either."""
    if msg.protocol_version is None:
        return body  # the handshake era: the header alone carries it
    message = loads_client(body)
    params = message["params"]
    meta = {k: v for k, v in params["_meta"].items() if k not in ("traceparent", "tracestate")}
    return rpc.encode({**message, "params": {**params, "_meta": {**meta, "traceparent": traceparent}}})
