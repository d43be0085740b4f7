"""How the broker refuses: one table from a denial to HTTP status, JSON-RPC code, text, and
the audit outcome and event it is recorded with (nothing else maps a denial).

Callers get an opaque, fixed text; the specific reason goes to the audit log as a code.
Exceptions of the broker:

    BrokerError
     └── Denied(kind, reason)      a request refused before or instead of reaching a sandbox
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from broker.audit.schema import AuditEvent
from broker.protocol import jsonrpc as rpc
from broker.types import Outcome

# A refusal of what the caller may do is `denied`; the broker failing to serve it is `error`.
_DENIED, _ERROR = Outcome.DENIED, Outcome.ERROR
_REQUEST, _POLICY = AuditEvent.MCP_REQUEST, AuditEvent.POLICY_DENIED


@dataclass(frozen=True)
class _Row:
    status: int
    code: int
    message: str
    outcome: Outcome
    event: AuditEvent


class Denial(Enum):
    BAD_REQUEST = _Row(400, rpc.INVALID_REQUEST, "Invalid request", _ERROR, _REQUEST)
    READ_TIMEOUT = _Row(408, rpc.INVALID_REQUEST, "Request not received in time", _ERROR, _REQUEST)
    TOO_LARGE = _Row(413, rpc.INVALID_REQUEST, "Request body too large", _ERROR, _REQUEST)
    METHOD_NOT_ALLOWED = _Row(405, rpc.INVALID_REQUEST, "Method not allowed", _DENIED, _REQUEST)
    SESSION_NOT_FOUND = _Row(404, rpc.INVALID_REQUEST, "Session not found", _DENIED, _REQUEST)
    # The SDK's own text: a handshake-era request the broker answers itself (`tools/list`)
    # without the session its sandbox requires, answered as the sandbox would.
    SESSION_REQUIRED = _Row(400, rpc.INVALID_REQUEST, "Bad Request: Missing session ID", _ERROR, _REQUEST)
    METHOD_NOT_FOUND = _Row(200, rpc.METHOD_NOT_FOUND, "Method not found", _DENIED, _POLICY)
    TOOL_NOT_ALLOWED = _Row(200, rpc.INVALID_PARAMS, "Unknown tool", _DENIED, _POLICY)
    RATE_LIMITED = _Row(429, rpc.RATE_LIMITED, "Too many requests", _DENIED, _REQUEST)
    TOO_MANY_CONCURRENT = _Row(429, rpc.RATE_LIMITED, "Too many requests in flight", _DENIED, _REQUEST)
    TOO_MANY_STREAMS = _Row(429, rpc.RATE_LIMITED, "Too many open streams", _DENIED, _REQUEST)
    SANDBOX_UNAVAILABLE = _Row(
        503, rpc.UNAVAILABLE, "Tool sandbox unavailable, retry later", _ERROR, _REQUEST
    )
    UPSTREAM_TIMEOUT = _Row(200, rpc.INTERNAL_ERROR, "Tool call timed out", _ERROR, _REQUEST)
    UPSTREAM_FAILED = _Row(200, rpc.INTERNAL_ERROR, "Tool call failed", _ERROR, _REQUEST)
    UPSTREAM_INVALID = _Row(
        200, rpc.INTERNAL_ERROR, "Tool sandbox sent an invalid response", _ERROR, _REQUEST
    )
    AUDIT_UNAVAILABLE = _Row(
        503, rpc.AUDIT_UNAVAILABLE, "Audit log unavailable; request refused", _ERROR, _REQUEST
    )
    # The approvals database (PostgreSQL) cannot be reached: no approval is asked, decided or
    # used while it cannot be recorded; reads never touch it and go on.
    APPROVALS_UNAVAILABLE = _Row(503, rpc.UNAVAILABLE, "Approvals unavailable, retry later", _ERROR, _REQUEST)
    CONTRACT_CHANGED = _Row(
        503,
        rpc.UNAVAILABLE,
        "Tool sandbox changed its tools; it is being replaced, retry later",
        _ERROR,
        _REQUEST,
    )

    @property
    def status(self) -> int:
        return self.value.status

    @property
    def code(self) -> int:
        return self.value.code

    @property
    def message(self) -> str:
        return self.value.message

    @property
    def event(self) -> AuditEvent:
        return self.value.event

    @property
    def outcome(self) -> Outcome:
        return self.value.outcome


class BrokerError(Exception):
    pass


class Denied(BrokerError):
    def __init__(self, denial: Denial, reason: str, retry_after: int | None = None) -> None:
        super().__init__(reason)
        self.denial = denial
        self.reason = reason  # fixed code, for the audit log only
        self.retry_after = retry_after
