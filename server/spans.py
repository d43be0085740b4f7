"""The sandbox's side of a trace: plain span records, returned to the broker with the answer.

The sandbox has no network (Docker: `network_mode=none`), so it cannot export spans itself.
When the broker's forwarded request carries a W3C `traceparent` header (tracing is on), the
server times its handling of a `tools/call` and the tool's body, and puts two records in the
result's `_meta` under `SPANS_META`: names from a fixed list, ids, offsets from the request's
arrival in nanoseconds, and ok/error. Never an attribute, a message or a value: the broker
re-emits the records as child spans of its own, after checking every one (broker/tracing.py).

No OpenTelemetry here: the image stays as small as it is, and the records are the whole API.
"""

from __future__ import annotations

import contextvars
import re
import secrets
import time
from dataclasses import dataclass
from typing import Any

from starlette.types import ASGIApp, Receive, Scope, Send

SPANS_META = "io.docbroker/spans"
REQUEST_SPAN = "sandbox.request"
TOOL_SPAN = "sandbox.tool"
_TRACEPARENT = re.compile(rb"00-([0-9a-f]{32})-([0-9a-f]{16})-[0-9a-f]{2}")


@dataclass(frozen=True)
class _Incoming:
    trace_id: str
    parent_id: str
    arrived_ns: int  # time.perf_counter_ns() when the request reached the server


_incoming: contextvars.ContextVar[_Incoming | None] = contextvars.ContextVar("incoming", default=None)


class TraceContext:
    """ASGI middleware: a request with a valid `traceparent` is remembered for its tools."""

    def __init__(self, app: ASGIApp) -> None:
        self._app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        incoming = _parse(scope) if scope["type"] == "http" else None
        if incoming is None:
            await self._app(scope, receive, send)
            return
        token = _incoming.set(incoming)
        try:
            await self._app(scope, receive, send)
        finally:
            _incoming.reset(token)


def records(tool_started_ns: int, tool_ended_ns: int, ok: bool) -> dict[str, Any] | None:
    """The `_meta` entry for one tool call timed by perf_counter_ns, or None when untraced."""
    incoming = _incoming.get()
    if incoming is None:
        return None
    request_id, tool_id = secrets.token_hex(8), secrets.token_hex(8)
    now = time.perf_counter_ns() - incoming.arrived_ns
    status = "ok" if ok else "error"
    return {
        "trace_id": incoming.trace_id,
        "spans": [
            {"name": REQUEST_SPAN, "span_id": request_id, "parent_id": incoming.parent_id,
             "start_ns": 0, "end_ns": now, "status": status},
            {"name": TOOL_SPAN, "span_id": tool_id, "parent_id": request_id,
             "start_ns": max(0, tool_started_ns - incoming.arrived_ns),
             "end_ns": max(0, tool_ended_ns - incoming.arrived_ns), "status": status},
        ],
    }  # fmt: skip


def _parse(scope: Scope) -> _Incoming | None:
    for name, value in scope.get("headers", ()):
        if name == b"traceparent":
            match = _TRACEPARENT.fullmatch(value)
            if match is None or set(match[1]) == {48} or set(match[2]) == {48}:
                return None  # all-zero ids are invalid (W3C trace context)
            return _Incoming(match[1].decode(), match[2].decode(), time.perf_counter_ns())
    return None
