"""Wires the document tools into an `MCPServer` from the `mcp` SDK.

The SDK would normally derive each tool's argument model from the function signature. That
model is lax (it coerces `"3"` and `true` to integers, ignores unknown fields) and its
validation errors echo the caller's values into the result. The contract needs strict,
value-free validation, so the arguments reach our own models untouched: `_RawArguments`
hands them over as one dict, and the published input schema is the strict model's.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.tools.base import Tool
from mcp.server.mcpserver.utilities.func_metadata import ArgModelBase, FuncMetadata
from mcp.server.transport_security import TransportSecuritySettings
from mcp_types import CallToolResult, TextContent, ToolAnnotations
from starlette.types import ASGIApp

from server import contracts as c
from server import spans
from server.approval import ApprovalVerifier
from server.bearer import BearerRequired
from server.contracts import ToolResult
from server.tools import DocumentTools
from server.workspace import Workspace

SERVER_NAME = "docbroker-document-tools"

# The descriptions and annotations are the contract's: the broker admits only these (DESIGN §11).
_ANNOTATIONS = {name: ToolAnnotations.model_validate(c.TOOL_ANNOTATIONS[name]) for name in c.TOOL_NAMES}


class _RawArguments(FuncMetadata):
    """Passes the raw `arguments` object through as one keyword: the tool body validates it."""

    def validate_arguments(self, arguments_to_validate: dict[str, Any]) -> dict[str, Any]:
        return {"arguments": arguments_to_validate}


def _as_call_result(result: ToolResult[Any], trace: dict[str, Any] | None = None) -> CallToolResult:
    structured = result.model_dump(mode="json")
    # The data travels once, in `structuredContent`; the text block is a short summary. A
    # full JSON copy would double every read (a 24,000-byte document would exceed the
    # broker's 32,000-byte response cap), and the broker rebuilds the text for its clients.
    return CallToolResult(
        content=[TextContent(type="text", text=f"{result.status}: {result.message}")],
        structured_content=structured,
        is_error=False,
        # the span records (server/spans.py) when the broker traces this call: names and timings only
        _meta={spans.SPANS_META: trace} if trace is not None else None,
    )


def _tool(name: str, body: Callable[[Mapping[str, Any]], ToolResult[Any]]) -> Tool:
    def run(arguments: dict[str, Any]) -> CallToolResult:
        started = time.perf_counter_ns()
        result = body(arguments)
        trace = spans.records(started, time.perf_counter_ns(), result.status == c.Status.OK.value)
        return _as_call_result(result, trace)

    return Tool(
        fn=run,
        name=name,
        title=None,
        description=c.TOOL_DESCRIPTIONS[name],
        parameters=c.input_schema(name),
        fn_metadata=_RawArguments(arg_model=ArgModelBase, output_schema=c.output_schema(name)),
        is_async=False,  # file I/O: the SDK runs sync tools in a worker thread
        context_kwarg=None,
        annotations=_ANNOTATIONS[name],
    )


def build_server(tenant: str, secret: str, workspace: Workspace) -> MCPServer[Any]:
    tools = DocumentTools(workspace, ApprovalVerifier(secret), tenant)
    server: MCPServer[Any] = MCPServer(
        SERVER_NAME,
        instructions="Document tools over one tenant's files. Reports need a human's approval.",
        tools=[_tool(name, body) for name, body in tools.handlers().items()],
        log_level="WARNING",
    )
    return server


def http_app(
    server: MCPServer[Any],
    *,
    unix_socket: bool,
    sandbox_key: str | None = None,
    allowed_hosts: tuple[str, ...] | None = None,
) -> ASGIApp:
    """The Streamable HTTP app. Over a unix socket the Host header is `localhost` without a port.

    `allowed_hosts` replaces the default Host allow-list (on the pod network the broker may
    name the Pod by its IP); with `sandbox_key` the bearer check runs before anything else.
    """
    if allowed_hosts:
        hosts = list(allowed_hosts)
    elif unix_socket:
        hosts = ["localhost", "localhost:*", "127.0.0.1:*", "[::1]:*"]
    else:
        hosts = ["127.0.0.1:*", "localhost:*", "[::1]:*"]
    security = TransportSecuritySettings(
        enable_dns_rebinding_protection=True,
        allowed_hosts=hosts,
        allowed_origins=["http://127.0.0.1:*", "http://localhost:*", "http://[::1]:*"],
    )
    app: ASGIApp = server.streamable_http_app(transport_security=security, max_request_body_size=256 * 1024)
    app = spans.TraceContext(app)
    return BearerRequired(app, key=sandbox_key) if sandbox_key is not None else app
