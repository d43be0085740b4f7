"""The `/mcp` endpoint: request → auth → policy → runtime → gateway → audit.

A raw ASGI app (it sits on the hot path of every call). For each request it:

1. authenticates the bearer JWT, applies the tenant's policy and limits, and lets through
   only the JSON-RPC methods the document tools need;
2. gates `save_report` behind a human's approval (broker.approvals.flow);
3. leases the tenant's sandbox, checks its circuit breaker and its pinned contract (tool
   descriptors admitted and pinned when the sandbox started), and forwards the request over
   the sandbox's socket, streaming SSE event by event;
4. consumes what comes back: `tools/list` is answered from the pinned, admitted descriptors
   (after a fresh listing proves they are unchanged; a changed sandbox is replaced),
   `tools/call` results are validated against the broker's own contract (never the
   sandbox's), and approved reports leave the drop-box;
5. writes exactly one terminal audit event. If the audit log cannot be written, the request
   is refused before anything reaches a sandbox, and no result is released unaudited.

The sandbox is never trusted: nothing it says reaches the client unchecked.
"""

from __future__ import annotations

import logging
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NoReturn, Protocol

from starlette.types import Receive, Scope, Send

from broker.approvals.flow import Answer, ApprovalFlow
from broker.approvals.reports import Accepted, Reports, audit_sweep
from broker.audit import AuditSinkError
from broker.auth import AuthError
from broker.auth.preauth import client_address
from broker.auth.service import AuthService
from broker.errors import Denial, Denied
from broker.gateway import jsonrpc as rpc
from broker.gateway import listing, results, sse, wire
from broker.gateway.admission import Admission, admit
from broker.gateway.breaker import CircuitBreakers
from broker.gateway.contract import ContractPins, Pin
from broker.gateway.deadlines import Deadlines
from broker.gateway.methods import audit_method, client_may_send, sandbox_may_send
from broker.gateway.responder import CallRecord, Responder
from broker.gateway.sessions import SessionSealer
from broker.gateway.tools_filter import may_call, visible_tools
from broker.gateway.upstream import (
    PARAM_PREFIX,
    BodyTooLarge,
    Upstream,
    UpstreamError,
    UpstreamResponse,
    Upstreams,
    UpstreamTimeout,
    UpstreamUnreachable,
    request_headers,
    response_headers,
)
from broker.gateway.upstream import session_id as upstream_session_id
from broker.metrics import Metrics
from broker.policy import Policies, TenantLimiter
from broker.runtime.base import CapacityError, Runtime, RuntimeErrorBase
from broker.types import Outcome, Principal, RunningSandbox
from server import contracts as c

log = logging.getLogger("docbroker.gateway")

MAX_UPSTREAM_EVENT_BYTES = 1024 * 1024
LEGACY_PROTOCOL = "2025-11-25"
_RETRYABLE_METHODS = frozenset({"server/discover", "ping", "tools/list"})
_OUTCOMES = {outcome.value: outcome for outcome in Outcome}  # a dict: Outcome(x) is ~10x slower
# The `Mcp-Param-*` names the tools' contract declares (`x-mcp-header`): any other such name is
# the client's own invention, a value (`Mcp-Param-Secret-Q3-Layoffs-Plan.Md`), audited as "other".
_KNOWN_PARAM_HEADERS = {
    f"{PARAM_PREFIX}{header}".lower(): f"{PARAM_PREFIX}{header}".title()
    for tool in c.TOOL_NAMES
    for prop in c.input_schema(tool).get("properties", {}).values()
    if isinstance(header := prop.get("x-mcp-header"), str)
}
_KNOWN_METHODS = frozenset(
    {"initialize", "notifications/initialized", "ping", "server/discover", "tools/list", "tools/call",
     "notifications/cancelled", "GET", "DELETE"}
)  # fmt: skip


class AuditLike(Protocol):
    """What the gateway needs of the audit log (see broker.audit)."""

    def check(self) -> None: ...

    async def emit(self, event: str, /, **fields: Any) -> None: ...

    def settle(self) -> None: ...


class _TransportFailed(Exception):
    """The sandbox could not be reached or dropped the connection before answering."""

    def __init__(self, *, unsent: bool) -> None:
        super().__init__()
        self.unsent = unsent  # no connection was made: the request never left the broker


class _AuditFailed(Exception):
    pass


@dataclass(frozen=True)
class _Turn:
    """One request on its way to the sandbox: what every step after the gate needs."""

    http_method: str
    headers: dict[str, str]
    body: bytes
    msg: rpc.RpcMessage | None
    principal: Principal
    out: Responder
    call: CallRecord
    sealed_session: str | None  # the session id as the client holds it


class McpGateway:
    def __init__(
        self,
        *,
        auth: AuthService,
        policies: Policies,
        limiter: TenantLimiter,
        runtime: Runtime,
        upstreams: Upstreams,
        sessions: SessionSealer,
        approvals: ApprovalFlow,
        reports_for: Callable[[str], Reports],
        audit: AuditLike,
        metrics: Metrics,
        breakers: CircuitBreakers,
        pins: ContractPins,
        max_body_bytes: int,
        max_response_bytes: int,
    ) -> None:
        self._auth = auth
        self._policies = policies
        self._limiter = limiter
        self._runtime = runtime
        self._upstreams = upstreams
        self._sessions = sessions
        self._approvals = approvals
        self._reports_for = reports_for
        self._audit = audit
        self._metrics = metrics
        self._breakers = breakers
        self._pins = pins
        self._max_body = max_body_bytes
        self._max_response = max_response_bytes
        self._deadlines = Deadlines()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        call = CallRecord(request_id=secrets.token_hex(16), started=time.perf_counter())
        out = Responder(send, call)
        try:
            try:
                await self._serve(scope, receive, out, call)
            finally:
                await self._keep_unsent_approval(call)
        except AuthError as exc:
            call.event, call.outcome, call.reason = "auth.denied", Outcome.DENIED, exc.reason.value
            call.audited = exc.counted  # on the pre-auth limiter's counted line for the interval
            await self._finish_json(
                out, call, exc.status, wire.auth_error_body(exc), self._auth.challenge(exc)
            )
        except Denied as exc:
            call.outcome = Outcome.DENIED if exc.denial.status in (403, 404, 405, 429) else Outcome.ERROR
            if exc.denial in (Denial.TOOL_NOT_ALLOWED, Denial.METHOD_NOT_FOUND):
                call.event, call.outcome = "policy.denied", Outcome.DENIED
            call.reason = exc.reason
            headers = {"retry-after": str(exc.retry_after)} if exc.retry_after else {}
            body = rpc.error(call.rpc_id, exc.denial.code, exc.denial.message)
            await self._finish_json(out, call, exc.denial.status, body, headers)
        except AuditSinkError:
            # An event before the terminal one (approval, sandbox, admission) could not be
            # written: refuse like a known-broken log, never with a bare 500.
            call.outcome, call.reason = Outcome.ERROR, "audit_unavailable"
            denial = Denial.AUDIT_UNAVAILABLE
            await self._finish_json(
                out, call, denial.status, rpc.error(call.rpc_id, denial.code, denial.message)
            )
        except _AuditFailed:
            pass  # the response was held back; the client sees the connection end
        finally:
            if call.limited_tenant is not None:
                self._limiter.leave(call.limited_tenant)
            self._metrics.observe(
                call.method if call.method in _KNOWN_METHODS else "other",
                call.tool if call.tool in c.TOOL_NAMES else "-",
                call.outcome.value,
                time.perf_counter() - call.started,
            )
            self._audit.settle()  # the answer has left: finish the audit line's bookkeeping now

    # -- before the sandbox -----------------------------------------------------------------

    async def _serve(self, scope: Scope, receive: Receive, out: Responder, call: CallRecord) -> None:
        http_method = scope["method"]
        headers = wire.headers_of(scope)
        call.method = http_method
        # Authentication first: a refusal before it would be one audit line per request that
        # no pre-auth limit counts (an unauthenticated flood of PUTs would fill the disk).
        call.principal = principal = await self._auth.authenticate(
            wire.all_values(scope, b"authorization"), client_address(scope)
        )
        if http_method not in ("POST", "GET", "DELETE"):
            raise Denied(Denial.METHOD_NOT_ALLOWED, "http_method_not_allowed")
        policy = self._policies.get(principal.tenant)
        call.header_names = sorted(
            {_KNOWN_PARAM_HEADERS.get(n, "other") for n in headers if n.startswith(PARAM_PREFIX)}
        )

        msg: rpc.RpcMessage | None = None
        body = b""
        if http_method == "POST":
            body = await wire.read_body(scope, receive, self._max_body, headers)
            call.bytes_in = len(body)
            try:
                msg = rpc.parse(body)
            except rpc.RpcParseError as exc:
                # JSON-RPC's own code and a fixed text that says what was wrong (-32700 for
                # non-JSON, "batches are not supported"), not a bare "Invalid request".
                call.reason = exc.reason
                await self._finish_json(out, call, 400, rpc.error(None, exc.code, exc.message))
                return
            call.method, call.rpc_id = msg.method or "response", msg.id
            call.tool, call.arg_names = msg.tool, msg.arg_names
            call.protocol = msg.protocol_version or headers.get("mcp-protocol-version")
            if not client_may_send(msg.method, is_notification=msg.id is None):
                raise Denied(Denial.METHOD_NOT_FOUND, "method_not_allowed")
            wire.check_routing_headers(msg, headers)

        retry_after = self._limiter.take(principal.tenant)
        if retry_after:
            raise Denied(Denial.RATE_LIMITED, "rate_limited", retry_after=int(retry_after))
        if not self._limiter.enter(principal.tenant):
            raise Denied(Denial.TOO_MANY_CONCURRENT, "concurrency_limited", retry_after=1)
        call.limited_tenant = principal.tenant

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
            if call.tool is None or not may_call(principal, policy, call.tool):
                raise Denied(Denial.TOOL_NOT_ALLOWED, "tool_not_allowed")
            if self._pinned_without(principal.tenant, call.tool):
                # Before the approval gate: no human is asked to approve a call bound to be refused.
                raise Denied(Denial.TOOL_NOT_ALLOWED, "tool_not_admitted")
            if call.tool == c.TOOL_SAVE:
                decision = await self._approvals.gate(principal, policy, msg, call.request_id)
                if isinstance(decision, Answer):
                    call.outcome, call.reason, call.approval_id = (
                        decision.outcome,
                        decision.reason,
                        decision.approval_id,
                    )
                    await self._finish_json(
                        out, call, 200, rpc.result(msg.id, wire.typed(msg, decision.result))
                    )
                    return
                call.save, call.approval_id = decision, decision.approval_id
                body = wire.forward_body(msg, decision.arguments)

        turn = _Turn(http_method, headers, body, msg, principal, out, call, sealed_session)
        if call.save is not None:
            # The drop-box is emptied before and after the approved write, whatever its outcome.
            ids = {"tenant": principal.tenant, "subject": principal.subject, "request_id": call.request_id}
            async with self._reports_for(principal.tenant).saving(audit_sweep(self._audit.emit, **ids)):
                await self._to_sandbox(turn)
            return
        work = self._to_sandbox(turn)
        if http_method != "GET":
            await work
        elif await wire.until_client_leaves(receive, work) and not call.audited:
            call.outcome, call.reason = Outcome.OK, "client_disconnected"
            await self._emit_terminal(call)

    # -- the sandbox ------------------------------------------------------------------------

    async def _to_sandbox(self, turn: _Turn) -> None:
        msg, call, out = turn.msg, turn.call, turn.out
        tenant = turn.principal.tenant
        wait = self._breakers.admit(tenant)
        if wait:
            raise Denied(Denial.SANDBOX_UNAVAILABLE, "circuit_open", retry_after=wait)
        # Reads may be retried once on a transport failure; writes only if nothing was sent
        # (DESIGN §2: a write that may have happened is result_unknown, not something to do twice).
        retryable = msg is not None and (
            msg.method in _RETRYABLE_METHODS or (msg.method == "tools/call" and call.tool != c.TOOL_SAVE)
        )
        for attempt in (1, 2):
            try:
                async with self._runtime.lease(tenant) as sandbox:
                    call.sandbox = sandbox.backend_id[:64]
                    client = self._upstreams.client(sandbox.endpoint)
                    try:
                        # One deadline for a POST's whole exchange, pinning included. A GET
                        # stream lives as long as its session: only its pinning has one.
                        async with self._deadlines.within(self._upstreams.call_timeout):
                            pin = await self._pinned(turn.principal, sandbox, client)
                            if msg is not None and msg.method == "tools/list":
                                await self._answer_tools_list(turn, msg, sandbox, client, pin)
                            elif msg is not None:
                                await self._exchange(turn, sandbox, client, pin)
                        if msg is None:
                            await self._exchange(turn, sandbox, client, pin)
                    except (UpstreamError, sse.EventTooLarge, listing.ListingError) as exc:
                        # The pool stays: other calls of this tenant may be in flight on it, and a
                        # replaced sandbox listens on the same socket path.
                        await self._runtime.mark_broken(tenant)
                        if isinstance(exc, UpstreamTimeout):
                            raise
                        raise _TransportFailed(unsent=isinstance(exc, UpstreamUnreachable)) from exc
                self._breakers.success(tenant)
                return
            except UpstreamTimeout:
                self._breakers.failure(tenant)
                await self._upstream_failed(turn, Denial.UPSTREAM_TIMEOUT, "upstream_timeout")
                return
            except _TransportFailed as exc:
                self._breakers.failure(tenant)
                # A request that never left (the sandbox was gone: crashed, or replaced by an
                # operator) is sent once to its successor, a save included: it cannot have run.
                if attempt == 1 and (retryable or exc.unsent) and not out.started:
                    continue
                await self._upstream_failed(turn, Denial.UPSTREAM_FAILED, "upstream_failed")
                return
            except CapacityError:
                raise Denied(Denial.SANDBOX_UNAVAILABLE, CapacityError.reason, retry_after=30) from None
            except RuntimeErrorBase as exc:
                self._breakers.failure(tenant)
                raise Denied(Denial.SANDBOX_UNAVAILABLE, exc.reason, retry_after=5) from None

    async def _upstream_failed(self, turn: _Turn, denial: Denial, reason: str) -> None:
        msg, out, call = turn.msg, turn.out, turn.call
        if out.started:
            # Mid-stream: the client still gets exactly one answer, then the stream ends.
            if msg is not None and msg.id is not None and not call.audited:
                if call.save is not None:
                    call.outcome, call.reason = Outcome.RESULT_UNKNOWN, reason
                    unknown = results.broker_result(c.Status.RESULT_UNKNOWN, c.Message.WRITE_UNKNOWN.value)
                    body = rpc.result(msg.id, wire.typed(msg, unknown))
                else:
                    call.outcome, call.reason = Outcome.ERROR, reason
                    body = rpc.error(msg.id, denial.code, denial.message)
                await self._answer_in_stream(out, call, wire.sse_event(body))
            else:
                call.outcome, call.reason = Outcome.ERROR, reason
                await self._emit_terminal(call)
            await out.end()
            return
        if call.save is not None and msg is not None and call.forwarded:
            # The approved write was sent: it may or may not have happened.
            call.outcome, call.reason = Outcome.RESULT_UNKNOWN, reason
            unknown = results.broker_result(c.Status.RESULT_UNKNOWN, c.Message.WRITE_UNKNOWN.value)
            await self._finish_json(out, call, 200, rpc.result(msg.id, wire.typed(msg, unknown)))
            return
        raise Denied(denial, reason)

    async def _pinned(self, principal: Principal, sandbox: RunningSandbox, client: Upstream) -> Pin:
        """The contract pinned for this sandbox instance, listing and pinning it on first use."""
        pin = self._pins.get(principal.tenant, sandbox.backend_id)
        if pin is None:
            admission = await self._list_and_admit(client, sandbox)
            pin = self._pins.pin(principal.tenant, sandbox.backend_id, admission)
            for tool, reason in admission.rejected:
                await self._audit.emit(
                    "tools.rejected", tenant=principal.tenant, sandbox=sandbox.backend_id[:64],
                    tool=tool if tool in c.TOOL_NAMES else None, reason=reason, outcome="rejected",
                )  # fmt: skip
        if pin.broken:
            await self._replace_changed(principal.tenant, sandbox)
        return pin

    async def _replace_changed(self, tenant: str, sandbox: RunningSandbox) -> NoReturn:
        """A sandbox whose contract changed is no longer the program that was admitted: it is
        replaced at once, and the breaker held open for its cool-down, so the successor starts
        (and is pinned afresh) with the first call after it, and a sandbox that keeps
        changing is not restarted on every call. This call is refused."""
        self._pins.forget(tenant, sandbox.backend_id)
        self._breakers.trip(tenant)
        try:
            await self._runtime.replace(tenant, sandbox.backend_id, reason="contract_changed")
        except Exception as exc:  # the engine refused: the successor is pinned afresh all the same
            log.warning("a changed sandbox could not be removed", extra={"error": type(exc).__name__})
        wait = max(1, self._breakers.cooldown_left(tenant))
        raise Denied(Denial.CONTRACT_CHANGED, "contract_changed", retry_after=wait)

    def _pinned_without(self, tenant: str, tool: str) -> bool:
        """Was the tenant's running sandbox pinned without this tool?"""
        sandbox = self._runtime.get(tenant)
        if sandbox is None:
            return False
        pin = self._pins.get(tenant, sandbox.backend_id)
        return pin is not None and tool not in pin.admission.tools

    async def _list_and_admit(self, client: Upstream, sandbox: RunningSandbox) -> Admission:
        tools, problems = await listing.list_all_tools(client)
        admission = admit(tools)
        admission.rejected.extend(("-", problem) for problem in problems)
        return admission

    async def _answer_tools_list(
        self, turn: _Turn, msg: rpc.RpcMessage, sandbox: RunningSandbox, client: Upstream, pin: Pin
    ) -> None:
        """Answer from the pin, after a fresh listing shows the sandbox still offers the same."""
        principal, call = turn.principal, turn.call
        if turn.sealed_session is not None:
            protocol = turn.headers.get("mcp-protocol-version", LEGACY_PROTOCOL)
            if not await listing.session_alive(client, turn.headers["mcp-session-id"], protocol):
                raise Denied(Denial.SESSION_NOT_FOUND, "session_ended")
        fresh = await self._list_and_admit(client, sandbox)
        if not self._pins.matches(pin, fresh):
            await self._audit.emit(
                "contract.changed", tenant=principal.tenant, subject=principal.subject,
                sandbox=sandbox.backend_id[:64], request_id=call.request_id, outcome="denied",
                reason="descriptors_changed",
            )  # fmt: skip
            await self._replace_changed(principal.tenant, sandbox)
        policy = self._policies.get(principal.tenant)
        tools = visible_tools(list(pin.admission.tools.values()), principal, policy)
        result: dict[str, Any] = {"tools": tools}
        if msg.protocol_version is not None:
            result.update(resultType="complete", ttlMs=0, cacheScope="private")
        call.outcome, call.reason = Outcome.OK, "ok"
        await self._finish_json(turn.out, call, 200, rpc.result(msg.id, result))

    async def _exchange(self, turn: _Turn, sandbox: RunningSandbox, client: Upstream, pin: Pin) -> None:
        descriptor: dict[str, Any] | None = None
        if turn.msg is not None and turn.msg.method == "tools/call":
            descriptor = pin.admission.tools.get(turn.call.tool or "")
            if descriptor is None:
                raise Denied(Denial.TOOL_NOT_ALLOWED, "tool_not_admitted")
        headers = request_headers(turn.headers.items())
        response = await client.send(
            turn.http_method, headers, turn.body or None, meanwhile=turn.call.fix_request
        )
        try:
            await self._relay(turn, response, descriptor)
        finally:
            await response.aclose()

    async def _relay(
        self, turn: _Turn, response: UpstreamResponse, descriptor: dict[str, Any] | None
    ) -> None:
        msg, out, call = turn.msg, turn.out, turn.call
        status = results.relay_status(response.status_code)
        passed = response_headers(response.headers)
        session_id = upstream_session_id(response.headers)
        if session_id is not None:
            passed = self._client_session(turn, session_id, status, passed)
        ours = msg if msg is not None and msg.id is not None else None  # a request: it needs an answer

        if response.headers.get("content-type", "").startswith("text/event-stream"):
            await out.start(200 if descriptor is not None else status, passed)
            try:
                async for event in sse.events(response.aiter_raw(), MAX_UPSTREAM_EVENT_BYTES):
                    data = event.data
                    parsed = wire.parse_json(data)
                    if (
                        ours is not None
                        and isinstance(parsed, dict)
                        and parsed.get("id") == ours.id
                        and "method" not in parsed
                    ):
                        reply = await self._consume(turn, parsed, len(data or b""), ours, descriptor)
                        await self._answer_in_stream(out, call, event.with_data(rpc.encode(reply)))
                        break  # one answer per request: anything the sandbox sends after it is dropped
                    elif isinstance(parsed, dict) and sandbox_may_send(parsed):
                        clean = results.notification(parsed, ours)
                        if clean is None:
                            await self._refused_from_sandbox(turn, parsed)
                        else:
                            await out.chunk(event.with_data(rpc.encode(clean)))
                    elif parsed is not None:
                        await self._refused_from_sandbox(turn, parsed)
            except sse.EventTooLarge:
                if ours is None or descriptor is None or call.audited:
                    raise
                # Too large to read is too large to pass: the call's own failure (below)
                await self._too_large(turn, ours, descriptor, MAX_UPSTREAM_EVENT_BYTES, stream=True)
                return
            if ours is not None and not call.audited:
                reply = await self._consume(turn, {}, 0, ours, descriptor)
                call.reason = "upstream_no_answer"
                await self._answer_in_stream(out, call, wire.sse_event(reply))
            elif not call.audited:
                call.outcome, call.reason = wire.plain_outcome(status)
                await self._emit_terminal(call)
            await out.end()
            return

        # A tool's answer is read no further than the client could be given of it.
        limit = self._max_response if descriptor is not None else MAX_UPSTREAM_EVENT_BYTES
        try:
            raw = await response.read(limit)
        except BodyTooLarge:
            if ours is None or descriptor is None:
                raise
            await self._too_large(turn, ours, descriptor, limit, stream=False)
            return
        if ours is None:
            # Notifications, responses, GET and DELETE: the status is the answer; a body the
            # sandbox attaches has no reader and is not passed on.
            call.outcome, call.reason = wire.plain_outcome(status)
            await self._finish_raw(out, call, status, b"", passed)
            return
        parsed = wire.parse_json(raw)
        if descriptor is not None:
            status = 200  # a tool's answer is the broker's checked (or own) result, whatever the sandbox said
        if not (isinstance(parsed, dict) and parsed.get("id") == ours.id and "method" not in parsed):
            # Not an answer to this request (another id, HTML, nothing): none of it is passed
            # on; the client gets the broker's own answer (for save_report: result_unknown).
            parsed, status = {}, (200 if descriptor is not None or status < 400 else status)
            reply = await self._consume(turn, parsed, len(raw), ours, descriptor)
            call.reason = "upstream_no_answer"
        else:
            reply = await self._consume(turn, parsed, len(raw), ours, descriptor)
        await self._finish_json(out, call, status, reply, dict(wire.str_headers(passed)))

    def _client_session(
        self, turn: _Turn, session_id: str, status: int, passed: list[tuple[bytes, bytes]]
    ) -> list[tuple[bytes, bytes]]:
        """The sandbox's session id never reaches the client: a new session's is sealed to the
        principal; otherwise the client's own sealed id goes back, or none at all."""
        client_id = turn.sealed_session
        if turn.msg is not None and turn.msg.method == "initialize" and status == 200:
            client_id = self._sessions.seal(session_id, turn.principal)
        kept = [(n, v) for n, v in passed if n != b"mcp-session-id"]
        return kept if client_id is None else [*kept, (b"mcp-session-id", client_id.encode("ascii"))]

    async def _too_large(
        self, turn: _Turn, ours: rpc.RpcMessage, descriptor: dict[str, Any], limit: int, *, stream: bool
    ) -> None:
        """A tool's answer past what the broker reads: that call alone fails (failed, or
        result_unknown for a save), audited once. The sandbox did answer, so this is no
        transport failure: not retried (it would only be sent again), not counted toward the
        breaker (which is for a sandbox that cannot answer), and the sandbox stays."""
        reply = await self._consume(turn, {}, max(limit, self._max_response) + 1, ours, descriptor)
        if stream:
            await self._answer_in_stream(turn.out, turn.call, wire.sse_event(reply))
            await turn.out.end()
        else:
            await self._finish_json(turn.out, turn.call, 200, reply)

    async def _answer_in_stream(self, out: Responder, call: CallRecord, framed: bytes) -> None:
        call.bytes_out += len(framed)
        await self._emit_terminal(call)  # the answer is held until it is audited
        await out.chunk(framed, counted=True)

    async def _consume(
        self,
        turn: _Turn,
        reply: dict[str, Any],
        size: int,
        msg: rpc.RpcMessage,
        descriptor: dict[str, Any] | None,
    ) -> dict[str, Any]:
        """The sandbox's answer to this request, checked; returns what the client gets."""
        call = turn.call
        if msg.method != "tools/call" or descriptor is None:
            result = reply.get("result")
            clean = results.handshake(msg.method or "", result) if isinstance(result, dict) else None
            if "error" in reply or clean is None:
                call.outcome, call.reason = Outcome.ERROR, "upstream_error"
                return rpc.error(msg.id, rpc.INTERNAL_ERROR, "Tool sandbox returned an error")
            call.outcome, call.reason = Outcome.OK, "ok"
            return rpc.result(msg.id, clean)
        arguments = call.save.arguments if call.save is not None else msg.arguments
        consumed = results.consume(reply, call.tool or "", arguments, size, self._max_response)
        call.outcome, call.reason = _OUTCOMES[consumed.status], consumed.reason
        result = consumed.result
        if call.save is not None and consumed.status == c.Status.OK.value:
            reports = self._reports_for(turn.principal.tenant)
            accepted = await reports.accept(call.save.filename, call.save.sha256)
            if accepted is not Accepted.OK:
                call.outcome, call.reason = Outcome.RESULT_UNKNOWN, f"report_{accepted.value}"
                result = results.broker_result(c.Status.RESULT_UNKNOWN, c.Message.WRITE_UNKNOWN.value)
        elif call.save is not None and _says_report_exists(result):
            # Only the broker's store knows which reports exist; the drop-box was emptied just
            # before this save, so a sandbox that says "exists" and has no such report lies.
            if not await self._reports_for(turn.principal.tenant).exists(call.save.filename):
                call.outcome, call.reason = Outcome.FAILED, "report_exists_unconfirmed"
                result = results.broker_result(c.Status.FAILED, c.Message.WRITE_FAILED.value)
        return rpc.result(msg.id, wire.typed(msg, result))

    async def _refused_from_sandbox(self, turn: _Turn, message: dict[str, Any]) -> None:
        """A request or unexpected notification from the sandbox: dropped, and audited by name."""
        method = message.get("method")
        await self._audit.emit(
            "policy.denied",
            tenant=turn.principal.tenant,
            subject=turn.principal.subject,
            request_id=turn.call.request_id,
            method=audit_method(method),
            outcome="denied",
            reason="sandbox_message_refused",
        )

    # -- endings ----------------------------------------------------------------------------

    async def _keep_unsent_approval(self, call: CallRecord) -> None:
        """A save refused or failed before its bytes reached the sandbox gives its approval
        back, before the client is answered (so its retry finds it approved)."""
        if call.save is None or call.forwarded or call.principal is None:
            return
        save, call.save = call.save, None
        ids = {"request_id": call.request_id, "tenant": call.principal.tenant,
               "subject": call.principal.subject}  # fmt: skip
        try:
            await self._approvals.release(save, ids)
        except AuditSinkError:
            log.error("audit write failed while keeping an unsent approval")

    def _audit_ready(self) -> None:
        try:
            self._audit.check()
        except Exception:
            raise Denied(Denial.AUDIT_UNAVAILABLE, "audit_unavailable") from None

    async def _emit_terminal(self, call: CallRecord) -> None:
        if call.audited:
            return
        call.audited = True
        try:
            await self._audit.emit(call.event, **call.audit_fields())
        except Exception:
            log.error("audit write failed; refusing the response")
            raise _AuditFailed from None

    async def _finish_json(
        self,
        out: Responder,
        call: CallRecord,
        status: int,
        body: dict[str, Any],
        headers: dict[str, str] | None = None,
    ) -> None:
        payload = rpc.encode(body)
        extra = [(k.encode(), v.encode()) for k, v in (headers or {}).items() if k != "content-type"]
        await self._finish_raw(out, call, status, payload, [(b"content-type", b"application/json"), *extra])

    async def _finish_raw(
        self,
        out: Responder,
        call: CallRecord,
        status: int,
        payload: bytes,
        headers: list[tuple[bytes, bytes]],
    ) -> None:
        call.status = status
        call.bytes_out = len(payload)
        try:
            await self._emit_terminal(call)
        except _AuditFailed:
            if out.started:
                return
            denial = Denial.AUDIT_UNAVAILABLE
            status, payload = denial.status, rpc.encode(rpc.error(call.rpc_id, denial.code, denial.message))
            headers = [(b"content-type", b"application/json")]
        await out.whole(status, payload, headers)


def _says_report_exists(result: dict[str, Any]) -> bool:
    structured = result.get("structuredContent")
    return isinstance(structured, dict) and structured.get("message") == c.Message.REPORT_EXISTS.value
