"""The gate: everything decided about a request before any sandbox is involved.

In order: authentication, the HTTP method, the body and its JSON-RPC parse, the method
allow-list and routing headers, the tenant's rate and concurrency limits, the session, the
audit log's health, the policy's decision on the tool (Cedar, `broker.policy`) and the pinned
contract, and the approval decision for a save. It returns a value — `Passed` (what goes on
to the sandbox) or `Answered` (the broker's own answer) — and raises `AuthError` / `Denied`
for a refusal; it never calls on. One question goes to the sandbox: whether a save's legacy
session still exists, before its approval.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from starlette.types import Receive, Scope

from broker.approvals.flow import Answer, ApprovalFlow
from broker.auth import AuthError
from broker.auth.preauth import client_address
from broker.auth.service import AuthService
from broker.errors import Denial, Denied
from broker.gateway import forwarding
from broker.gateway.legacy_sessions import SessionSealer
from broker.gateway.record import CallRecord
from broker.gateway.responder import AuditLike
from broker.http_edge import READ_DEADLINE
from broker.policy import Call, Decider, Policies, Slot, TenantLimiter
from broker.protocol import answers, inbound
from broker.protocol import jsonrpc as rpc
from broker.protocol.methods import client_may_send
from broker.types import Outcome, Principal, TenantId
from server import contracts as c


@dataclass(frozen=True)
class Passed:
    """A request the gate lets through to the sandbox."""

    http_method: str
    headers: dict[str, str]  # `mcp-session-id` is the sandbox's own, unsealed
    body: bytes
    msg: rpc.RpcMessage | None  # None for GET and DELETE
    principal: Principal
    sealed_session: str | None  # the session id as the client holds it


@dataclass(frozen=True)
class Answered:
    """The broker's own answer (a parse error, an approval's result): no sandbox is asked.
    `body` is a JSON-RPC message; without one, `text` is the whole body (plain text, or none)."""

    status: int
    body: dict[str, Any] | None
    text: bytes = b""
    headers: dict[str, str] = field(default_factory=dict)


def _answered(refusal: inbound.Refusal, record: CallRecord) -> Answered:
    if refusal is inbound.ACKNOWLEDGED:
        record.end(Outcome.OK, refusal.reason)
    else:
        record.end(Outcome.ERROR, refusal.reason)
    return Answered(refusal.status, refusal.body, refusal.text, refusal.headers)


class Gate:
    def __init__(
        self,
        *,
        auth: AuthService,
        policies: Policies,
        engine: Decider,
        limiter: TenantLimiter,
        sessions: SessionSealer,
        approvals: ApprovalFlow,
        audit: AuditLike,
        pinned_without: Callable[[TenantId, str], bool],
        session_alive: Callable[[TenantId, dict[str, str]], Awaitable[bool]],
        max_body_bytes: int,
    ) -> None:
        self._auth = auth
        self._policies = policies
        self._engine = engine
        self._limiter = limiter
        self._sessions = sessions
        self._approvals = approvals
        self._audit = audit
        self._pinned_without = pinned_without  # was the tenant's sandbox pinned without this tool?
        self._session_alive = session_alive  # does its sandbox still hold this legacy session?
        self._max_body = max_body_bytes

    async def __call__(self, scope: Scope, receive: Receive, record: CallRecord) -> Passed | Answered:
        http_method = scope["method"]
        headers = _headers_of(scope)
        record.method = http_method
        # Authentication first: a refusal before it would be one audit line per request that
        # no pre-auth limit counts (an unauthenticated flood of PUTs would fill the disk).
        record.principal = principal = await self._auth.authenticate(
            _all_values(scope, b"authorization"), client_address(scope)
        )
        record.header_names = forwarding.param_header_names(headers)
        # The SDK's own ladder (broker.protocol.inbound), in its order, for every method: the
        # client gets the answer the server alone would give (DESIGN §15).
        modern = inbound.is_modern(headers)
        refusal = inbound.http_layer(http_method, headers, modern)
        if refusal is not None:
            return _answered(refusal, record)
        if http_method not in ("POST", "GET", "DELETE"):
            raise Denied(Denial.METHOD_NOT_ALLOWED, "http_method_not_allowed")
        if modern:
            headers.pop("mcp-session-id", None)  # the 2026-07-28 entry has no sessions

        msg: rpc.RpcMessage | None = None
        body = b""
        if http_method == "POST":
            body = await _read_body(scope, receive, self._max_body, headers)
            record.bytes_in = len(body)
            parsed = inbound.parse(body, headers, _raw_headers(scope))
            if isinstance(parsed, inbound.Refusal):
                if parsed.msg is not None:  # audited by its method and tool, by name
                    record.read(parsed.msg, headers.get("mcp-protocol-version"))
                return _answered(parsed, record)
            msg = parsed
            record.read(msg, msg.protocol_version or headers.get("mcp-protocol-version"))
            if not client_may_send(msg.method, is_notification=msg.id is None):
                raise Denied(Denial.METHOD_NOT_FOUND, "method_not_allowed")
            refusal = inbound.check_params(msg)
            if refusal is not None:
                return _answered(refusal, record)
            forwarding.check_routing_headers(msg, headers)

        self._limit(principal.tenant, record, Slot.STREAM if http_method == "GET" else Slot.REQUEST)
        sealed_session = headers.get("mcp-session-id")
        if sealed_session is not None:
            session_id = self._sessions.open(sealed_session, principal)
            if session_id is None:
                raise Denied(Denial.SESSION_NOT_FOUND, "session_not_owned")
            headers["mcp-session-id"] = session_id  # forwarded as the sandbox issued it
        elif http_method in ("GET", "DELETE"):
            raise Denied(Denial.BAD_REQUEST, "session_required")
        # Before the approval gate too: a broken audit log must not consume or open approvals.
        self._audit_ready()

        if msg is not None and msg.method == "tools/call":
            session = headers if sealed_session is not None else None
            answered = await self._tool_call(principal, msg, record, session)
            if answered is not None:
                return answered
            if record.save is not None:
                body = forwarding.forward_body(msg, record.save.arguments)
        return Passed(http_method, headers, body, msg, principal, sealed_session)

    def challenge(self, exc: AuthError) -> dict[str, str]:
        """The `WWW-Authenticate` header of an authentication refusal."""
        return self._auth.challenge(exc)

    def _limit(self, tenant: TenantId, record: CallRecord, slot: Slot) -> None:
        retry_after = self._limiter.take(tenant)
        if retry_after:
            raise Denied(Denial.RATE_LIMITED, "rate_limited", retry_after=int(retry_after))
        if not self._limiter.enter(tenant, slot):
            if slot is Slot.STREAM:
                raise Denied(Denial.TOO_MANY_STREAMS, "streams_limited", retry_after=1)
            raise Denied(Denial.TOO_MANY_CONCURRENT, "concurrency_limited", retry_after=1)
        record.limited = (tenant, slot)  # the slot is given back when the request ends

    async def _tool_call(
        self, principal: Principal, msg: rpc.RpcMessage, record: CallRecord, session: dict[str, str] | None
    ) -> Answered | None:
        """`session`: the request's headers, unsealed, when it belongs to a legacy session."""
        if record.tool is None:
            raise Denied(Denial.TOOL_NOT_ALLOWED, "tool_not_allowed")
        decision = self._engine.decide(_call_of(principal, msg, record))
        record.decided(decision)
        if not decision.allowed:
            raise Denied(Denial.TOOL_NOT_ALLOWED, "tool_not_allowed")
        policy = self._policies.get(principal.tenant)
        if self._pinned_without(principal.tenant, record.tool):
            # Before the approval gate: no human is asked to approve a call bound to be refused.
            raise Denied(Denial.TOOL_NOT_ALLOWED, "tool_not_admitted")
        if record.tool != c.TOOL_SAVE:
            return None
        if session is not None and not await self._session_alive(principal.tenant, session):
            raise Denied(Denial.SESSION_NOT_FOUND, "session_ended")
        gated = await self._approvals.gate(principal, policy, msg, record.request_id)
        if isinstance(gated, Answer):
            record.end(gated.outcome, gated.reason)
            if gated.policy is not None:  # the approver's decision refused it: its ids, not the save's
                record.decided(gated.policy)
            record.approval_id = gated.approval_id
            return Answered(200, rpc.result(msg.id, answers.typed(msg, gated.result)))
        record.save, record.approval_id = gated, gated.approval_id
        return None

    def _audit_ready(self) -> None:
        try:
            self._audit.check()
        except Exception:
            raise Denied(Denial.AUDIT_UNAVAILABLE, "audit_unavailable") from None


def _call_of(principal: Principal, msg: rpc.RpcMessage, record: CallRecord) -> Call:
    """What the policy is asked about a tools/call: names, sizes and the document it names."""
    arguments = msg.arguments
    filename = arguments.get("filename")
    content = arguments.get("content")
    return Call(
        principal=principal,
        tool=record.tool or "",
        protocol=record.protocol,
        request_bytes=record.bytes_in,
        document=filename if isinstance(filename, str) else None,
        content_bytes=len(content.encode("utf-8", "surrogatepass")) if isinstance(content, str) else None,
    )


def _headers_of(scope: Scope) -> dict[str, str]:
    return {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}


def _raw_headers(scope: Scope) -> list[tuple[str, str]]:
    """Every header line as sent (a folded mapping hides a routing header given twice)."""
    return [(k.decode("latin-1"), v.decode("latin-1")) for k, v in scope["headers"]]


def _all_values(scope: Scope, name: bytes) -> list[str]:
    """Every value of a header: two Authorization headers must be refused, not merged."""
    return [v.decode("latin-1") for k, v in scope["headers"] if k == name]


async def _read_body(scope: Scope, receive: Receive, limit: int, headers: dict[str, str]) -> bytes:
    declared = headers.get("content-length")
    if declared is not None and (not declared.isdigit() or int(declared) > limit):
        raise Denied(Denial.TOO_LARGE, "body_too_large")
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            if READ_DEADLINE in (scope.get("extensions") or {}):  # the edge closed a too-slow client
                raise Denied(Denial.READ_TIMEOUT, "read_timeout")
            raise Denied(Denial.BAD_REQUEST, "client_disconnected")
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise Denied(Denial.TOO_LARGE, "body_too_large")
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)
