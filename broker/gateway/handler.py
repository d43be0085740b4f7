"""The `/mcp` endpoint: gate, then relay; the responder answers and audits once.

A raw ASGI app (it sits on the hot path of every call). For each request:

1. the gate (gate.py) authenticates, parses, applies the allow-lists, limits and session,
   checks the audit log and decides a save's approval; it returns what goes on, or the
   broker's own answer;
2. the relay (relay.py) takes what passed to the tenant's sandbox and back, checking what
   it says (replies.py) before anything reaches the client;
3. the responder (responder.py) sends the one answer, only once its terminal audit event is
   written; a refusal (`AuthError`, `Denied`) is answered here from its table row.

The sandbox is never trusted: nothing it says reaches the client unchecked.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time

from starlette.types import Receive, Scope, Send

from broker.approvals.flow import ApprovalFlow
from broker.audit import AuditEvent, AuditSinkError
from broker.auth import AuthError
from broker.errors import Denial, Denied
from broker.gateway.gate import Answered, Gate
from broker.gateway.record import CallRecord
from broker.gateway.relay import Relay
from broker.gateway.responder import AuditFailed, AuditLike, Responder
from broker.metrics import Metrics
from broker.policy import TenantLimiter
from broker.protocol import jsonrpc as rpc
from broker.tracing import RequestSpan, Tracing
from broker.types import Outcome
from server import contracts as c

log = logging.getLogger("docbroker.gateway")

_KNOWN_METHODS = frozenset(
    {"initialize", "notifications/initialized", "ping", "server/discover", "tools/list", "tools/call",
     "notifications/cancelled", "GET", "DELETE"}
)  # fmt: skip
_AUTH_TEXT = {401: "Unauthorized", 403: "Forbidden", 429: "Too many requests"}
_AUTH_CODE = {403: rpc.FORBIDDEN, 429: rpc.RATE_LIMITED}


async def _answer(out: Responder, answered: Answered) -> None:
    if answered.body is not None:
        await out.json(answered.status, answered.body, answered.headers)
        return
    headers = [(k.encode(), v.encode()) for k, v in answered.headers.items()]
    if answered.text:
        headers.append((b"content-type", b"text/plain; charset=utf-8"))
    await out.raw(answered.status, answered.text, headers)


class McpGateway:
    def __init__(
        self,
        *,
        gate: Gate,
        relay: Relay,
        approvals: ApprovalFlow,
        limiter: TenantLimiter,
        audit: AuditLike,
        metrics: Metrics,
        tracing: Tracing,
    ) -> None:
        self._gate = gate
        self._relay = relay
        self._approvals = approvals
        self._limiter = limiter
        self._audit = audit
        self._metrics = metrics
        self._tracing = tracing

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        record = CallRecord(request_id=secrets.token_hex(16), started=time.perf_counter())
        out = Responder(send, record, self._audit)
        started_ns, span = time.time_ns(), None
        try:
            try:
                passed = await self._gate(scope, receive, record)
                if isinstance(passed, Answered):
                    await _answer(out, passed)
                else:
                    meta = passed.msg.params.get("_meta") if passed.msg is not None else None
                    span = self._tracing.start(started_ns, passed.headers, meta)
                    record.traceparent = span.traceparent if span is not None else None
                    await self._relay(passed, receive, out, record)
            finally:
                await self._keep_unsent_approval(record)
        except AuthError as exc:
            record.event = AuditEvent.AUTH_DENIED
            record.end(Outcome.DENIED, exc.reason.value)
            record.audited = exc.counted  # on the pre-auth limiter's counted line for the interval
            text = _AUTH_TEXT.get(exc.status) or "Service unavailable"
            body = rpc.error(None, _AUTH_CODE.get(exc.status, rpc.INVALID_REQUEST), text)
            await out.json(exc.status, body, self._gate.challenge(exc))
        except Denied as exc:
            record.denied(exc.denial, exc.reason)
            await out.refuse(exc.denial, {"retry-after": str(exc.retry_after)} if exc.retry_after else {})
        except AuditSinkError:
            # An event before the terminal one (approval, sandbox, admission) could not be
            # written: refuse like a known-broken log, never with a bare 500.
            record.end(Outcome.ERROR, "audit_unavailable")
            await out.refuse(Denial.AUDIT_UNAVAILABLE)
        except AuditFailed:
            pass  # the response was held back; the client sees the connection end
        except asyncio.CancelledError:
            # The server's graceful shutdown ran out and uvicorn cancels what still runs (a call
            # waiting on a slow sandbox start): the request still ends audited, and answered
            # "retry later" unless a save may have reached the sandbox (its client, seeing the
            # connection end, takes it as result_unknown). Never uvicorn's 500 and traceback.
            await self._stopped(record, out)
        finally:
            if record.limited is not None:
                self._limiter.leave(*record.limited)
            self._metrics.observe(
                record.method if record.method in _KNOWN_METHODS else "other",
                record.tool if record.tool in c.TOOL_NAMES else "-",
                record.outcome.value,
                time.perf_counter() - record.started,
            )
            if self._tracing.enabled:
                self._trace(scope, started_ns, span, record)
            out.close()

    async def _stopped(self, record: CallRecord, out: Responder) -> None:
        written = record.save is not None and record.forwarded
        record.end(Outcome.RESULT_UNKNOWN if written else Outcome.ERROR, "shutting_down")
        try:
            if written or out.started:
                await out.audit()
            else:
                await out.refuse(Denial.SANDBOX_UNAVAILABLE, {"retry-after": "1"})
        except (AuditFailed, OSError):
            pass  # the audit log is closing with the server: the connection simply ends

    def _trace(self, scope: Scope, started_ns: int, span: RequestSpan | None, record: CallRecord) -> None:
        """End the request's span; one the gate answered or refused starts here, under the
        caller's `traceparent` header (its body may never have been read)."""
        if span is None:
            given = [v.decode("latin-1") for k, v in scope["headers"] if k == b"traceparent"]
            headers = {"traceparent": given[0]} if len(given) == 1 else {}
            span = self._tracing.start(started_ns, headers, None)
        self._tracing.end(span, record)

    async def _keep_unsent_approval(self, record: CallRecord) -> None:
        """A save refused or failed before its bytes reached the sandbox gives its approval
        back, before the client is answered (so its retry finds it approved)."""
        if record.save is None or record.forwarded or record.principal is None:
            return
        save, record.save = record.save, None
        ids = {"request_id": record.request_id, "tenant": record.principal.tenant,
               "subject": record.principal.subject}  # fmt: skip
        try:
            await self._approvals.release(save, ids)
        except AuditSinkError:
            log.error("audit write failed while keeping an unsent approval")
