# Over 450 lines: the sandbox leg of one request, streamed or buffered, with its failure rules.
"""The relay: the sandbox leg of a request the gate let through.

It leases the tenant's sandbox, checks its circuit breaker and its pinned contract (tool
descriptors admitted and pinned when the sandbox started), forwards the request over the
sandbox's socket and streams SSE event by event, retrying once where that cannot do a thing
twice. What comes back is checked (broker.gateway.replies) and answered through the
responder; `tools/list` is answered from the pin, after a fresh listing proves it unchanged
(a changed sandbox is replaced).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any

from starlette.types import Receive

from broker.approvals.flow import ApprovalFlow
from broker.approvals.reports import Reports, audit_sweep
from broker.audit import AuditEvent
from broker.audit.fields import sandbox_field
from broker.errors import Denial, Denied
from broker.gateway import forwarding, listing, results
from broker.gateway.breaker import BreakerState, CircuitBreakers
from broker.gateway.contract import Pin
from broker.gateway.gate import Passed
from broker.gateway.legacy_sessions import SessionSealer
from broker.gateway.pinning import Pinning, legacy_session
from broker.gateway.record import CallRecord
from broker.gateway.replies import Consumer
from broker.gateway.responder import AuditLike, Responder
from broker.protocol import answers, inbound, sse
from broker.protocol import jsonrpc as rpc
from broker.protocol.codec import loads_sandbox
from broker.protocol.methods import audit_method, sandbox_may_send
from broker.runtime.base import CapacityError, RuntimeErrorBase
from broker.runtime.lifecycle import Runtime
from broker.tracing import SandboxSpans
from broker.types import Outcome, RunningSandbox, TenantId
from broker.upstream import (
    BodyTooLarge,
    Deadlines,
    Upstream,
    UpstreamError,
    UpstreamResponse,
    Upstreams,
    UpstreamTimeout,
    UpstreamUnreachable,
)
from server import contracts as c

log = logging.getLogger("docbroker.gateway")

MAX_UPSTREAM_EVENT_BYTES = 1024 * 1024
_RETRYABLE_METHODS = frozenset({"server/discover", "ping", "tools/list"})


class _TransportFailed(Exception):
    """The sandbox could not be reached or dropped the connection before answering."""

    def __init__(self, *, unsent: bool) -> None:
        super().__init__()
        self.unsent = unsent  # no connection was made: the request never left the broker


class Relay:
    def __init__(
        self,
        *,
        runtime: Runtime,
        upstreams: Upstreams,
        breakers: CircuitBreakers,
        pinning: Pinning,
        sessions: SessionSealer,
        approvals: ApprovalFlow,
        reports_for: Callable[[str], Reports],
        audit: AuditLike,
        max_response_bytes: int,
    ) -> None:
        self._runtime = runtime
        self._upstreams = upstreams
        self._breakers = breakers
        self._pinning = pinning
        self._approvals = approvals
        self._sessions = sessions
        self._reports_for = reports_for
        self._audit = audit
        self._max_response = max_response_bytes
        self._consumer = Consumer(reports_for, max_response_bytes)
        self._deadlines = Deadlines()

    async def __call__(self, passed: Passed, receive: Receive, out: Responder, record: CallRecord) -> None:
        principal = passed.principal
        if record.save is not None:
            # The drop-box is emptied before and after the approved write, whatever its outcome.
            ids = {"tenant": principal.tenant, "subject": principal.subject, "request_id": record.request_id}
            async with self._reports_for(principal.tenant).saving(audit_sweep(self._audit.emit, **ids)):
                await self._to_sandbox(passed, out, record)
            return
        work = self._to_sandbox(passed, out, record)
        if passed.http_method != "GET":
            await work
        elif await _until_client_leaves(receive, work) and not record.audited:
            record.end(Outcome.OK, "client_disconnected")
            await out.audit()

    async def session_alive(self, tenant: TenantId, headers: dict[str, str]) -> bool:
        """Does the tenant's sandbox still hold the legacy session of these (unsealed) request
        headers? The gate asks before a save's approval: no one is asked to approve a write
        the client's session can no longer make, and an approval given is not spent on one.
        True when it cannot be told now (the breaker is not closed, the sandbox fails): the
        request goes on and meets the same state there."""
        session = legacy_session(headers, headers.get("mcp-session-id"))
        if session is None or self._breakers.state(tenant) is not BreakerState.CLOSED:
            return True
        try:
            async with self._runtime.lease(tenant) as sandbox:
                client = self._upstreams.client(sandbox.tenant, sandbox.endpoint)
                async with self._deadlines.within(self._upstreams.call_timeout):
                    return await listing.session_alive(client, *session)
        except (UpstreamError, RuntimeErrorBase):
            return True

    # -- the lease, the breaker, retries ----------------------------------------------------

    async def _to_sandbox(self, passed: Passed, out: Responder, record: CallRecord) -> None:
        tenant = passed.principal.tenant
        ticket = self._breakers.admit(tenant)
        if ticket.wait:
            raise Denied(Denial.SANDBOX_UNAVAILABLE, "circuit_open", retry_after=ticket.wait)
        try:
            await self._attempts(passed, out, record)
        finally:
            # A trial cut short (its client left, a refusal, capacity, the audit log) ends
            # here; one left running would hold every later call of the tenant at 503.
            self._breakers.release(tenant, ticket)

    async def _attempts(self, passed: Passed, out: Responder, record: CallRecord) -> None:
        msg, tenant = passed.msg, passed.principal.tenant
        # Reads may be retried once on a transport failure; writes only if nothing was sent
        # (DESIGN §2: a write that may have happened is result_unknown, not something to do twice).
        retryable = msg is not None and (
            msg.method in _RETRYABLE_METHODS or (msg.method == "tools/call" and record.tool != c.TOOL_SAVE)
        )
        for attempt in (1, 2):
            try:
                async with self._runtime.lease(tenant) as sandbox:
                    record.sandbox = sandbox_field(sandbox.backend_id)
                    await self._on(sandbox, passed, out, record)
                self._breakers.success(tenant)
                return
            except UpstreamTimeout:
                self._breakers.failure(tenant)
                await self._failed(passed, out, record, Denial.UPSTREAM_TIMEOUT, "upstream_timeout")
                return
            except _TransportFailed as exc:
                self._breakers.failure(tenant)
                # A request that never left (the sandbox was gone: crashed, or replaced by an
                # operator) is sent once to its successor, a save included: it cannot have run.
                if attempt == 1 and (retryable or exc.unsent) and not out.started:
                    continue
                await self._failed(passed, out, record, Denial.UPSTREAM_FAILED, "upstream_failed")
                return
            except CapacityError:
                raise Denied(Denial.SANDBOX_UNAVAILABLE, CapacityError.reason, retry_after=30) from None
            except RuntimeErrorBase as exc:
                self._breakers.failure(tenant)
                raise Denied(Denial.SANDBOX_UNAVAILABLE, exc.reason, retry_after=5) from None

    async def _on(self, sandbox: RunningSandbox, passed: Passed, out: Responder, record: CallRecord) -> None:
        """One attempt on a leased sandbox."""
        msg = passed.msg
        client = self._upstreams.client(sandbox.tenant, sandbox.endpoint)
        try:
            # One deadline for a POST's whole exchange, pinning included. A GET stream lives
            # as long as its session: only its pinning has one.
            async with self._deadlines.within(self._upstreams.call_timeout):
                pin = await self._pinning.pinned(passed.principal.tenant, sandbox, client)
                if msg is not None and msg.method == "tools/list":
                    session = legacy_session(passed.headers, passed.sealed_session)
                    if session is None and not inbound.is_modern(passed.headers):
                        # Answered from the pin, so first what the sandbox would say to a
                        # handshake-era request without a session (the SDK's stateful 400).
                        if await listing.needs_session(client):
                            raise Denied(Denial.SESSION_REQUIRED, "session_required")
                    answer = await self._pinning.tools_list(
                        passed.principal, msg, session, sandbox, client, pin, record.request_id
                    )
                    record.end(Outcome.OK, "ok")
                    await out.json(200, answer)
                elif msg is not None:
                    await self._exchange(passed, client, pin, out, record)
            if msg is None:
                await self._exchange(passed, client, pin, out, record)
        except (UpstreamError, sse.EventTooLarge, listing.ListingError) as exc:
            # The pool stays: other calls of this tenant may be in flight on it, and a
            # replaced sandbox listens on the same socket path.
            await self._runtime.mark_broken(passed.principal.tenant)
            if isinstance(exc, UpstreamTimeout):
                raise
            raise _TransportFailed(unsent=isinstance(exc, UpstreamUnreachable)) from exc

    async def _failed(
        self, passed: Passed, out: Responder, record: CallRecord, denial: Denial, reason: str
    ) -> None:
        msg = passed.msg
        if out.started:
            # Mid-stream: the client still gets exactly one answer, then the stream ends.
            if msg is not None and msg.id is not None and not record.audited:
                if record.save is not None:
                    record.end(Outcome.RESULT_UNKNOWN, reason)
                    body = rpc.result(msg.id, answers.typed(msg, answers.write_unknown()))
                else:
                    record.end(Outcome.ERROR, reason)
                    body = rpc.error(msg.id, denial.code, denial.message)
                await out.answer(sse.frame(rpc.encode(body)))
            else:
                record.end(Outcome.ERROR, reason)
                await out.audit()
            await out.end()
            return
        if record.save is not None and msg is not None and record.forwarded:
            # The approved write was sent: it may or may not have happened.
            record.end(Outcome.RESULT_UNKNOWN, reason)
            await out.json(200, rpc.result(msg.id, answers.typed(msg, answers.write_unknown())))
            return
        raise Denied(denial, reason)

    # -- the exchange -----------------------------------------------------------------------

    async def _exchange(
        self, passed: Passed, client: Upstream, pin: Pin, out: Responder, record: CallRecord
    ) -> None:
        descriptor: dict[str, Any] | None = None
        if passed.msg is not None and passed.msg.method == "tools/call":
            descriptor = pin.admission.tools.get(record.tool or "")
            if descriptor is None:
                raise Denied(Denial.TOOL_NOT_ALLOWED, "tool_not_admitted")
        save = record.save
        session = legacy_session(passed.headers, passed.sealed_session)
        if save is not None and not await self._approvals.confirm(save, passed.principal.tenant):
            # Held past its time and taken back by another broker: that one may write it now.
            record.save = None
            raise Denied(Denial.APPROVALS_UNAVAILABLE, "approval_claim_lost", retry_after=1)
        headers = forwarding.request_headers(passed.headers.items())
        body = passed.body
        if record.traceparent is not None:
            headers["traceparent"] = record.traceparent  # the broker's span: the sandbox's parent
            if passed.msg is not None:
                body = forwarding.traced_body(passed.msg, body, record.traceparent)
            record.sent_ns = time.time_ns()  # before the bytes leave: the sandbox's window starts here
        in_flight = await client.start(passed.http_method, headers, body or None)
        record.sent()  # while the sandbox works
        response = await in_flight.response()
        try:
            if response.status_code == 404 and session is not None and save is None:
                # The sandbox no longer holds the session (a DELETE through any replica ended
                # it, or the sandbox was replaced): every method gets the 404 that `tools/list`
                # gets, never a tool result made of the sandbox's refusal. (A save's session
                # was asked about before its approval: `session_alive`. Sent, it is
                # result_unknown whatever the sandbox says: below.)
                raise Denied(Denial.SESSION_NOT_FOUND, "session_ended")
            status = results.relay_status(response.status_code)
            leg = _Leg(passed, response, descriptor, status, self._headers(passed, response, status))
            if response.headers.get("content-type", "").startswith("text/event-stream"):
                await self._stream(leg, out, record)
            else:
                await self._whole(leg, out, record)
        finally:
            await response.aclose()

    async def _stream(self, leg: _Leg, out: Responder, record: CallRecord) -> None:
        passed, descriptor, request = leg.passed, leg.descriptor, leg.request
        response, status = leg.response, leg.status
        await out.start(200 if descriptor is not None else status, leg.headers)
        try:
            async for event in sse.events(response.aiter_raw(), MAX_UPSTREAM_EVENT_BYTES):
                data = event.data
                parsed = loads_sandbox(data)
                if request is not None and _answers(parsed, request):
                    _sandbox_spans(parsed, record)
                    size = len(data or b"")
                    reply = await self._consumer(passed.principal, parsed, size, request, descriptor, record)
                    await out.answer(event.with_data(rpc.encode(reply)))
                    break  # one answer per request: anything the sandbox sends after it is dropped
                elif isinstance(parsed, dict) and sandbox_may_send(parsed):
                    clean = results.notification(parsed, request)
                    if clean is None:
                        await self._refused_from_sandbox(passed, parsed, record)
                    else:
                        await out.chunk(event.with_data(rpc.encode(clean)))
                elif parsed is not None:
                    await self._refused_from_sandbox(passed, parsed, record)
        except sse.EventTooLarge:
            if request is None or descriptor is None or record.audited:
                raise
            # Too large to read is too large to pass: the call's own failure (below)
            limit = MAX_UPSTREAM_EVENT_BYTES
            await self._too_large(passed, request, descriptor, limit, out, record, stream=True)
            return
        if request is not None and not record.audited:
            reply = await self._consumer(passed.principal, {}, 0, request, descriptor, record)
            record.reason = "upstream_no_answer"
            await out.answer(sse.frame(rpc.encode(reply)))
        elif not record.audited:
            record.end(*_plain_outcome(status))
            await out.audit()
        await out.end()

    async def _whole(self, leg: _Leg, out: Responder, record: CallRecord) -> None:
        passed, descriptor, request = leg.passed, leg.descriptor, leg.request
        response, status = leg.response, leg.status
        headers = leg.headers
        # A tool's answer is read no further than the client could be given of it.
        limit = self._max_response if descriptor is not None else MAX_UPSTREAM_EVENT_BYTES
        try:
            raw = await response.read(limit)
        except BodyTooLarge:
            if request is None or descriptor is None:
                raise
            await self._too_large(passed, request, descriptor, limit, out, record, stream=False)
            return
        parsed = loads_sandbox(raw)
        if status >= 400 and _transport_refusal(parsed) and record.save is None:
            # The SDK's transport refusing the client's message before reading it (no id:
            # "Missing session ID", "Not Acceptable"): the client's error, passed on as checked.
            record.end(Outcome.ERROR, "request_invalid")
            await out.json(status, inbound.sandbox_error(None, parsed["error"]))
            return
        if request is None:
            # Notifications, responses, GET and DELETE: the status is the answer; a body the
            # sandbox attaches has no reader and is not passed on.
            record.end(*_plain_outcome(status))
            await out.raw(status, b"", headers)
            return
        if descriptor is not None:
            status = 200  # a tool's answer is the broker's checked (or own) result, whatever the sandbox said
        if not _answers(parsed, request):
            # Not an answer to this request (another id, HTML, nothing): none of it is passed
            # on; the client gets the broker's own answer (for save_report: result_unknown).
            status = 200 if descriptor is not None or status < 400 else status
            reply = await self._consumer(passed.principal, {}, len(raw), request, descriptor, record)
            record.reason = "upstream_no_answer"
        else:
            _sandbox_spans(parsed, record)
            reply = await self._consumer(passed.principal, parsed, len(raw), request, descriptor, record)
            error = reply.get("error")
            if isinstance(error, dict) and record.reason == "request_invalid":
                # the status the SDK gives the code (2026-07-28), or the sandbox's as relayed
                status = inbound.error_status(error["code"]) if record.typed_results else leg.status
        await out.json(status, reply, {k.decode("latin-1"): v.decode("latin-1") for k, v in headers})

    def _headers(self, passed: Passed, response: UpstreamResponse, status: int) -> list[tuple[bytes, bytes]]:
        """The client's response headers. The sandbox's session id never reaches the client: a
        new session's is sealed to the principal; otherwise the client's own sealed id goes
        back, or none at all."""
        headers = forwarding.response_headers(response.headers)
        session_id = forwarding.session_id(response.headers)
        if session_id is None:
            return headers
        client_id = passed.sealed_session
        if passed.msg is not None and passed.msg.method == "initialize" and status == 200:
            client_id = self._sessions.seal(session_id, passed.principal)
        kept = [(n, v) for n, v in headers if n != b"mcp-session-id"]
        return kept if client_id is None else [*kept, (b"mcp-session-id", client_id.encode("ascii"))]

    async def _too_large(
        self,
        passed: Passed,
        request: rpc.RpcMessage,
        descriptor: dict[str, Any],
        limit: int,
        out: Responder,
        record: CallRecord,
        *,
        stream: bool,
    ) -> None:
        """A tool's answer past what the broker reads: that call alone fails (failed, or
        result_unknown for a save), audited once. The sandbox did answer, so this is no
        transport failure: not retried (it would only be sent again), not counted toward the
        breaker (which is for a sandbox that cannot answer), and the sandbox stays."""
        size = max(limit, self._max_response) + 1
        reply = await self._consumer(passed.principal, {}, size, request, descriptor, record)
        if stream:
            await out.answer(sse.frame(rpc.encode(reply)))
            await out.end()
        else:
            await out.json(200, reply)

    async def _refused_from_sandbox(
        self, passed: Passed, message: dict[str, Any], record: CallRecord
    ) -> None:
        """A request or unexpected notification from the sandbox: dropped, and audited by name."""
        await self._audit.emit(
            AuditEvent.POLICY_DENIED,
            tenant=passed.principal.tenant,
            subject=passed.principal.subject,
            request_id=record.request_id,
            method=audit_method(message.get("method")),
            outcome=Outcome.DENIED,
            reason="sandbox_message_refused",
        )


@dataclass(frozen=True)
class _Leg:
    """The sandbox's response to one forwarded request, as the relay reads it."""

    passed: Passed
    response: UpstreamResponse
    descriptor: dict[str, Any] | None  # the admitted tool's, for a tools/call
    status: int  # what the client may be told (results.relay_status)
    headers: list[tuple[bytes, bytes]]  # the client's response headers

    @property
    def request(self) -> rpc.RpcMessage | None:
        """The request whose answer the client waits for (None: notifications, GET, DELETE)."""
        msg = self.passed.msg
        return msg if msg is not None and msg.id is not None else None


def _answers(parsed: Any, request: rpc.RpcMessage) -> bool:
    """Is this sandbox message the answer to `request` (its id, and no method)?"""
    return isinstance(parsed, dict) and parsed.get("id") == request.id and "method" not in parsed


def _transport_refusal(parsed: Any) -> bool:
    """Is this sandbox message a JSON-RPC error of no request (`id: null`)?"""
    return isinstance(parsed, dict) and parsed.get("id") is None and isinstance(parsed.get("error"), dict)


def _sandbox_spans(answer: Any, record: CallRecord) -> None:
    """When the request is traced: the span records of the sandbox's answer, as checked."""
    if record.traceparent is not None and record.sent_ns is not None:
        window = time.time_ns() - record.sent_ns
        record.sandbox_spans = SandboxSpans.check(answer, record.traceparent, window)


def _plain_outcome(status: int) -> tuple[Outcome, str]:
    return (Outcome.OK, "ok") if status < 300 else (Outcome.ERROR, f"upstream_http_{status}")


async def _until_client_leaves(receive: Receive, work: Coroutine[Any, Any, None]) -> bool:
    """Run `work` (a GET stream's relay) until it ends or the client disconnects; True if the
    client left first. Only `receive` tells: uvicorn drops what is sent to a gone client
    without a word, and a sandbox's idle stream sends nothing the relay would forward, so a
    vanished client would otherwise hold its tenant's concurrency slot and lease for ever."""
    job = asyncio.ensure_future(work)

    async def disconnected() -> None:
        while (await receive())["type"] != "http.disconnect":
            pass

    watcher = asyncio.ensure_future(disconnected())
    try:
        await asyncio.wait({job, watcher}, return_when=asyncio.FIRST_COMPLETED)
    except BaseException:
        job.cancel()
        raise
    finally:
        watcher.cancel()
    if job.done():
        job.result()  # the relay's own exceptions (Denied, AuditFailed...) go on as usual
        return False
    job.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await job
    return True
