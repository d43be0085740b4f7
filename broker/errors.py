"""How the broker refuses: one table from a denial to HTTP status, JSON-RPC code and text.

Callers get an opaque, fixed text; the specific reason goes to the audit log as a code.
Exceptions of the broker:

    BrokerError
     └── Denied(kind, reason)      a request refused before or instead of reaching a sandbox
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from broker.protocol import jsonrpc as rpc


@dataclass(frozen=True)
class _Row:
    status: int
    code: int
    message: str


class Denial(Enum):
    BAD_REQUEST = _Row(400, rpc.INVALID_REQUEST, "Invalid request")
    READ_TIMEOUT = _Row(408, rpc.INVALID_REQUEST, "Request not received in time")
    TOO_LARGE = _Row(413, rpc.INVALID_REQUEST, "Request body too large")
    UNSUPPORTED_MEDIA = _Row(415, rpc.INVALID_REQUEST, "Content-Type must be application/json")
    METHOD_NOT_ALLOWED = _Row(405, rpc.INVALID_REQUEST, "Method not allowed")
    SESSION_NOT_FOUND = _Row(404, rpc.INVALID_REQUEST, "Session not found")
    METHOD_NOT_FOUND = _Row(200, rpc.METHOD_NOT_FOUND, "Method not found")
    TOOL_NOT_ALLOWED = _Row(200, rpc.INVALID_PARAMS, "Unknown tool")
    RATE_LIMITED = _Row(429, rpc.RATE_LIMITED, "Too many requests")
    TOO_MANY_CONCURRENT = _Row(429, rpc.RATE_LIMITED, "Too many requests in flight")
    SANDBOX_UNAVAILABLE = _Row(503, rpc.UNAVAILABLE, "Tool sandbox unavailable, retry later")
    UPSTREAM_TIMEOUT = _Row(200, rpc.INTERNAL_ERROR, "Tool call timed out")
    UPSTREAM_FAILED = _Row(200, rpc.INTERNAL_ERROR, "Tool call failed")
    UPSTREAM_INVALID = _Row(200, rpc.INTERNAL_ERROR, "Tool sandbox sent an invalid response")
    AUDIT_UNAVAILABLE = _Row(503, rpc.AUDIT_UNAVAILABLE, "Audit log unavailable; request refused")
    # The approvals database (PostgreSQL) cannot be reached: no approval is asked, decided or
    # used while it cannot be recorded; reads never touch it and go on.
    APPROVALS_UNAVAILABLE = _Row(503, rpc.UNAVAILABLE, "Approvals unavailable, retry later")
    CONTRACT_CHANGED = _Row(
        503, rpc.UNAVAILABLE, "Tool sandbox changed its tools; it is being replaced, retry later"
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


class BrokerError(Exception):
    pass


class Denied(BrokerError):
    def __init__(self, denial: Denial, reason: str, retry_after: int | None = None) -> None:
        super().__init__(reason)
        self.denial = denial
        self.reason = reason  # fixed code, for the audit log only
        self.retry_after = retry_after
