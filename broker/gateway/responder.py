"""Sending one HTTP response from raw ASGI: whole, or streamed chunk by chunk, and the
per-request record (`CallRecord`) that becomes the request's terminal audit event."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from starlette.types import Send

from broker.approvals.flow import Forward
from broker.audit.schema import AuditEvent
from broker.protocol import jsonrpc as rpc
from broker.protocol.methods import audit_method
from broker.types import Outcome, Principal
from server import contracts as c


@dataclass
class CallRecord:
    """Everything known about one request, in names and numbers only."""

    request_id: str
    started: float
    method: str = "-"
    tool: str | None = None
    arg_names: list[str] = field(default_factory=list)
    header_names: list[str] = field(default_factory=list)
    protocol: str | None = None
    principal: Principal | None = None
    outcome: Outcome = Outcome.ERROR
    reason: str = "unhandled"
    status: int = 500
    bytes_in: int = 0
    bytes_out: int = 0
    approval_id: str | None = None
    sandbox: str | None = None
    event: str = AuditEvent.MCP_REQUEST
    save: Forward | None = None
    rpc_id: rpc.RequestId | None = None
    audited: bool = False
    limited_tenant: str | None = None  # set when a concurrency slot was taken
    request_fields: dict[str, Any] | None = None  # describe_request(), once forwarded
    forwarded: bool = False  # the request's bytes went to the sandbox: a write may have happened

    def audit_fields(self) -> dict[str, Any]:
        fields = self.request_fields if self.request_fields is not None else self.describe_request()
        ending = {
            "outcome": self.outcome.value,
            "reason": self.reason,
            "status": self.status,
            "duration_ms": round((time.perf_counter() - self.started) * 1000, 3),
            "bytes_out": self.bytes_out,
        }
        if self.sandbox is not None:  # may change on a retry, after the request is fixed
            ending["sandbox"] = self.sandbox
        return {**fields, **ending}

    def fix_request(self) -> None:
        """Describe the request now, once it is forwarded and nothing about it changes any more:
        the gateway calls this while the sandbox works, so the answer's path is shorter."""
        self.forwarded = True
        self.request_fields = self.describe_request()

    def describe_request(self) -> dict[str, Any]:
        # Names the client chose freely (unknown methods, tools, argument keys) are recorded as
        # "other": a name must not become a channel for values into the audit log.
        fields: dict[str, Any] = {
            "request_id": self.request_id,
            "method": audit_method(self.method),
            "bytes_in": self.bytes_in,
            "tool": _known(self.tool, c.TOOL_NAMES),
            "protocol": self.protocol,
            "approval_id": self.approval_id,
            "arg_names": _declared_args(self.tool, self.arg_names),
            "header_names": self.header_names or None,
        }
        if self.principal is not None:
            fields["tenant"] = self.principal.tenant
            fields["subject"] = self.principal.subject
        return {k: v for k, v in fields.items() if v is not None}


def _known(name: str | None, allowed: tuple[str, ...]) -> str | None:
    if name is None:
        return None
    return name if name in allowed else "other"


_DECLARED_ARGS = {tool: frozenset(model.model_fields) for tool, model in c.INPUT_MODELS.items()}


def _declared_args(tool: str | None, names: list[str]) -> list[str] | None:
    declared = _DECLARED_ARGS.get(tool or "", frozenset())
    return sorted({n if n in declared else "other" for n in names}) or None


class Responder:
    """Sends one HTTP response: whole, or as a stream of chunks."""

    def __init__(self, send: Send, call: CallRecord) -> None:
        self._send = send
        self._call = call
        self.started = False

    async def whole(self, status: int, payload: bytes, headers: list[tuple[bytes, bytes]]) -> None:
        if self.started:
            return
        self.started = True
        headers = [*headers, (b"content-length", str(len(payload)).encode())]
        await self._send({"type": "http.response.start", "status": status, "headers": headers})
        await self._send({"type": "http.response.body", "body": payload})

    async def start(self, status: int, headers: list[tuple[bytes, bytes]]) -> None:
        self.started = True
        self._call.status = status
        await self._send({"type": "http.response.start", "status": status, "headers": headers})

    async def chunk(self, data: bytes, *, counted: bool = False) -> None:
        if not counted:
            self._call.bytes_out += len(data)
        await self._send({"type": "http.response.body", "body": data, "more_body": True})

    async def end(self) -> None:
        await self._send({"type": "http.response.body", "body": b""})
