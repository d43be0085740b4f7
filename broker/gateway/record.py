"""The record of one request, in names and numbers only: it becomes the request's terminal
audit event. Each stage writes its part through one method (`read`, `admitted`, `forwarded`,
`end`); only the responder turns it into the audit line."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from broker.approvals.flow import Forward
from broker.audit.schema import AuditEvent
from broker.errors import Denial
from broker.policy import Decision, Slot
from broker.protocol import jsonrpc as rpc
from broker.protocol.methods import audit_method
from broker.types import Outcome, Principal, TenantId
from server import contracts as c

if TYPE_CHECKING:
    from broker.tracing import SandboxSpans


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
    typed_results: bool = False  # a 2026-07-28 request: its results carry `resultType`
    principal: Principal | None = None
    outcome: Outcome = Outcome.ERROR
    reason: str = "unhandled"
    status: int = 500
    bytes_in: int = 0
    bytes_out: int = 0
    approval_id: str | None = None
    sandbox: str | None = None
    event: AuditEvent = AuditEvent.MCP_REQUEST
    save: Forward | None = None
    rpc_id: rpc.RequestId | None = None
    audited: bool = False
    limited: tuple[TenantId, Slot] | None = None  # the limiter's slot the request holds
    request_fields: dict[str, Any] | None = None  # describe_request(), once forwarded
    forwarded: bool = False  # the request's bytes went to the sandbox: a write may have happened
    decision: Decision | None = None  # the policy's, for a tools/call: its ids and set's hash
    # Tracing (broker/tracing.py), when on: the request span's traceparent for the sandbox,
    # when the request was sent (time.time_ns()), and the sandbox's span records as checked.
    traceparent: str | None = None
    sent_ns: int | None = None
    sandbox_spans: SandboxSpans | None = None

    def decided(self, decision: Decision) -> None:
        """The gate's policy stage: the determining policy ids and the set's hash go on the line."""
        self.decision = decision

    def read(self, msg: rpc.RpcMessage, protocol: str | None) -> None:
        """The gate's parse stage: what the request asks for, by name."""
        self.method, self.rpc_id = msg.method or "response", msg.id
        self.tool, self.arg_names = msg.tool, msg.arg_names
        self.protocol = protocol
        self.typed_results = msg.protocol_version is not None

    def end(self, outcome: Outcome, reason: str) -> None:
        self.outcome, self.reason = outcome, reason

    def denied(self, denial: Denial, reason: str) -> None:
        self.event, self.outcome, self.reason = denial.event, denial.outcome, reason

    def sent(self) -> None:
        """The request is on its way to the sandbox and nothing about it changes any more:
        it is described now, while the sandbox works, so the answer's path is shorter."""
        self.forwarded = True
        self.request_fields = self.describe_request()

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
        if self.decision is not None:
            fields["policy_ids"] = list(self.decision.policy_ids) or None
            fields["policy_hash"] = self.decision.policy_hash
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
