"""The `/mcp` endpoint: request → auth → policy → runtime → gateway → audit.

A raw ASGI app (it sits on the hot path of every call; Starlette's request objects would
cost more than they give here). For each request it:

1. authenticates the bearer JWT and applies the tenant's policy and limits;
2. inspects the JSON-RPC message (names only) and gates `save_report` behind approvals;
3. leases the tenant's sandbox and forwards the request over its socket, streaming SSE
   event by event (notifications pass at once; the final response is held until audited);
4. filters `tools/list`, reads tool outcomes, moves approved reports out of the drop-box;
5. writes exactly one terminal audit event. If the audit log cannot be written, the request
   is refused before anything reaches a sandbox, and no result is released unaudited.
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx2
from starlette.types import Receive, Scope, Send

from broker.auth import AuthError
from broker.auth.service import AuthService
from broker.approvals.flow import ApprovalFlow, Answer, Forward, tool_result
from broker.approvals.reports import Accepted, ReportStore
from broker.errors import Denial, Denied
from broker.gateway import jsonrpc as rpc
from broker.gateway import sse
from broker.gateway.sessions import SessionBindings
from broker.gateway.tools_filter import may_call, visible_tools
from broker.gateway.upstream import PARAM_PREFIX, Upstreams, request_headers, response_headers
from broker.metrics import Metrics
from broker.policy import Policies, TenantLimiter
from broker.runtime.base import CapacityError, Runtime, RuntimeErrorBase
from broker.types import Outcome, Principal
from server import contracts as c

log = logging.getLogger("docbroker.gateway")

MAX_UPSTREAM_EVENT_BYTES = 1024 * 1024
_RESULT_STATUSES = {s.value for s in c.Status}
_KNOWN_METHODS = frozenset(
    {"initialize", "notifications/initialized", "ping", "server/discover", "tools/list", "tools/call",
     "notifications/cancelled", "GET", "DELETE"}
)  # fmt: skip

class AuditLike:
    """What the gateway needs of the audit log (see broker.audit)."""

    def check(self) -> None: ...

    async def emit(self, event: str, **fields: Any) -> None: ...


@dataclass
class _Call:
    """Everything known about one request, for its terminal audit event."""

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
    event: str = "mcp.request"
    save: Forward | None = None
    rpc_id: rpc.RequestId | None = None
    audited: bool = False

    def audit_fields(self) -> dict[str, Any]:
        fields: dict[str, Any] = {
            "request_id": self.request_id,
            "method": self.method,
            "outcome": self.outcome.value,
            "reason": self.reason,
            "status": self.status,
            "duration_ms": round((time.perf_counter() - self.started) * 1000, 3),
            "bytes_in": self.bytes_in,
            "bytes_out": self.bytes_out,
        }
        if self.principal is not None:
            fields["tenant"] = self.principal.tenant
            fields["subject"] = self.principal.subject
        optional = {"tool": self.tool, "protocol": self.protocol, "approval_id": self.approval_id}
        fields.update({k: v for k, v in optional.items() if v is not None})
        if self.arg_names:
            fields["arg_names"] = self.arg_names
        if self.header_names:
            fields["header_names"] = self.header_names
        return fields


class McpGateway:
    def __init__(
        self,
        *,
        auth: AuthService,
        policies: Policies,
        limiter: TenantLimiter,
        runtime: Runtime,
        upstreams: Upstreams,
        sessions: SessionBindings,
        approvals: ApprovalFlow,
        reports_for: Callable[[str], ReportStore],
        audit: AuditLike,
        metrics: Metrics,
        max_body_bytes: int,
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
        self._max_body = max_body_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        call = _Call(request_id=uuid.uuid4().hex, started=time.perf_counter())
        out = _Responder(send, call)
        entered: str | None = None
        try:
            entered = await self._serve(scope, receive, out, call)
        except AuthError as exc:
            call.event, call.outcome, call.reason = "auth.denied", Outcome.DENIED, exc.reason.value
            await self._finish_json(out, call, exc.status, _auth_error_body(exc), self._auth.challenge(exc))
        except Denied as exc:
            call.outcome = Outcome.DENIED if exc.denial.status in (403, 404, 405, 429) else Outcome.ERROR
            if exc.denial in (Denial.TOOL_NOT_ALLOWED, Denial.METHOD_NOT_FOUND):
                call.event, call.outcome = "policy.denied", Outcome.DENIED
            call.reason = exc.reason
            headers = {"retry-after": str(exc.retry_after)} if exc.retry_after else {}
            body = rpc.error(call.rpc_id, exc.denial.code, exc.denial.message)
            await self._finish_json(out, call, exc.denial.status, body, headers)
        finally:
            if entered is not None:
                self._limiter.leave(entered)
            self._metrics.observe(
                call.method if call.method in _KNOWN_METHODS else "other",
                call.tool if call.tool in c.TOOL_NAMES else "-",
                call.outcome.value,
                time.perf_counter() - call.started,
            )

    # -- the pipeline -----------------------------------------------------------------------

    async def _serve(self, scope: Scope, receive: Receive, out: _Responder, call: _Call) -> str | None:
        http_method = scope["method"]
        headers = _headers(scope)
        if http_method not in ("POST", "GET", "DELETE"):
            raise Denied(Denial.METHOD_NOT_ALLOWED, "http_method_not_allowed")
        call.method = http_method
        call.principal = principal = await self._auth.authenticate(_all(scope, b"authorization"))
        policy = self._policies.get(principal.tenant)
        call.header_names = sorted(n.title() for n in headers if n.startswith(PARAM_PREFIX))

        msg: rpc.RpcMessage | None = None
        body = b""
        if http_method == "POST":
            body = await _read_body(receive, self._max_body, headers)
            call.bytes_in = len(body)
            try:
                msg = rpc.parse(body)
            except rpc.RpcParseError as exc:
                raise Denied(Denial.BAD_REQUEST, exc.reason) from None
            call.method = msg.method or "response"
            call.rpc_id = msg.id
            call.tool, call.arg_names = msg.tool, msg.arg_names
            call.protocol = msg.protocol_version or headers.get("mcp-protocol-version")
            _check_routing_headers(msg, headers)

        retry_after = self._limiter.take(principal.tenant)
        if retry_after:
            raise Denied(Denial.RATE_LIMITED, "rate_limited", retry_after=int(retry_after))
        if not self._limiter.enter(principal.tenant):
            raise Denied(Denial.TOO_MANY_CONCURRENT, "concurrency_limited", retry_after=1)
        entered = principal.tenant

        session_id = headers.get("mcp-session-id")
        if session_id is not None and not self._sessions.owned_by(session_id, principal):
            raise Denied(Denial.SESSION_NOT_FOUND, "session_not_owned")
        if http_method in ("GET", "DELETE") and session_id is None:
            raise Denied(Denial.BAD_REQUEST, "session_required")

        if msg is not None and msg.method == "tools/call":
            if call.tool is None or not may_call(principal, policy, call.tool):
                raise Denied(Denial.TOOL_NOT_ALLOWED, "tool_not_allowed")
            if call.tool == c.TOOL_SAVE:
                decision = await self._approvals.gate(principal, policy, msg, call.request_id)
                if isinstance(decision, Answer):
                    call.outcome, call.reason, call.approval_id = decision.outcome, decision.reason, decision.approval_id
                    result = decision.result
                    if msg.protocol_version is not None:  # 2026-07-28 results carry their type
                        result = {"resultType": "complete", **result}
                    await self._finish_json(out, call, 200, rpc.result(msg.id, result))
                    return entered
                call.save, call.approval_id = decision, decision.approval_id
                body = _forward_body(msg, decision)

        self._audit_ready()
        await self._forward(http_method, headers, body, msg, principal, out, call)
        return entered

    async def _forward(
        self,
        http_method: str,
        headers: dict[str, str],
        body: bytes,
        msg: rpc.RpcMessage | None,
        principal: Principal,
        out: _Responder,
        call: _Call,
    ) -> None:
        try:
            async with self._runtime.lease(principal.tenant) as endpoint:
                client = self._upstreams.client(endpoint)
                request = client.build_request(
                    http_method, endpoint.url, headers=request_headers(headers.items()), content=body or None
                )
                try:
                    response = await client.send(request, stream=True)
                except httpx2.TimeoutException:
                    raise Denied(Denial.UPSTREAM_TIMEOUT, "upstream_timeout") from None
                except httpx2.TransportError:
                    await self._runtime.mark_broken(principal.tenant)
                    await self._upstreams.forget(endpoint)
                    raise Denied(Denial.SANDBOX_UNAVAILABLE, "upstream_unreachable", retry_after=1) from None
                try:
                    await self._relay(response, msg, principal, out, call)
                except httpx2.TimeoutException:
                    raise Denied(Denial.UPSTREAM_TIMEOUT, "upstream_timeout") from None
                except (httpx2.TransportError, sse.EventTooLarge):
                    await self._runtime.mark_broken(principal.tenant)
                    raise Denied(Denial.UPSTREAM_FAILED, "upstream_failed") from None
                finally:
                    await response.aclose()
        except CapacityError:
            raise Denied(Denial.SANDBOX_UNAVAILABLE, CapacityError.reason, retry_after=30) from None
        except RuntimeErrorBase as exc:
            raise Denied(Denial.SANDBOX_UNAVAILABLE, exc.reason, retry_after=5) from None

    async def _relay(
        self, response: httpx2.Response, msg: rpc.RpcMessage | None, principal: Principal, out: _Responder, call: _Call
    ) -> None:
        session_id = response.headers.get("mcp-session-id")
        if session_id and msg is not None and msg.method == "initialize" and response.status_code == 200:
            self._sessions.bind(session_id, principal)
        if call.method == "DELETE" and response.status_code < 300 and session_id:
            self._sessions.forget(session_id)
        passed = response_headers(response.headers.items())
        content_type = response.headers.get("content-type", "")

        if content_type.startswith("text/event-stream"):
            await out.start(response.status_code, passed)
            async for event in sse.events(response.aiter_raw(), MAX_UPSTREAM_EVENT_BYTES):
                data = event.data
                parsed = _json(data) if data is not None else None
                if isinstance(parsed, dict) and msg is not None and parsed.get("id") == msg.id and msg.id is not None:
                    reply = await self._consume(parsed, msg, principal, call)
                    framed = event.with_data(rpc.encode(reply))
                    call.bytes_out += len(framed)
                    await self._emit_terminal(call)  # the result is held until it is audited
                    await out.chunk(framed, counted=True)
                else:
                    await out.chunk(event.framed())
            if not call.audited:
                call.outcome, call.reason = _stream_outcome(call, response.status_code)
                await self._emit_terminal(call)
            await out.end()
            return

        raw = await _read_capped(response, MAX_UPSTREAM_EVENT_BYTES)
        parsed = _json(raw) if raw else None
        if isinstance(parsed, dict) and msg is not None and msg.id is not None and parsed.get("id") == msg.id:
            reply = await self._consume(parsed, msg, principal, call)
            await self._finish_json(out, call, response.status_code, reply, dict(_str_headers(passed)))
            return
        call.outcome, call.reason = _stream_outcome(call, response.status_code)
        await self._finish_raw(out, call, response.status_code, raw, passed)

    async def _consume(
        self, reply: dict[str, Any], msg: rpc.RpcMessage, principal: Principal, call: _Call
    ) -> dict[str, Any]:
        """Look at the sandbox's answer to this request; return what the client gets."""
        if "error" in reply or not isinstance(reply.get("result"), dict):
            call.outcome, call.reason = Outcome.ERROR, "upstream_error"
            return reply
        result = reply["result"]
        call.outcome, call.reason = Outcome.OK, "ok"
        if msg.method == "tools/list":
            tools = result.get("tools")
            policy = self._policies.get(principal.tenant)
            result = {**result, "tools": visible_tools(tools if isinstance(tools, list) else [], principal, policy)}
        elif msg.method == "tools/call":
            status = _tool_status(result)
            call.outcome, call.reason = Outcome(status), f"tool_{status}"
            if call.save is not None:
                result = self._accept_report(principal.tenant, result, status, call)
        return {**reply, "result": result}

    def _accept_report(self, tenant: str, result: dict[str, Any], status: str, call: _Call) -> dict[str, Any]:
        """Move an `ok` report out of the drop-box, or never call the write `ok`."""
        assert call.save is not None
        if status != c.Status.OK.value:
            if status not in (c.Status.REJECTED.value, c.Status.FAILED.value):
                call.outcome, call.reason = Outcome.RESULT_UNKNOWN, "save_result_unknown"
                return {**tool_result(c.Status.RESULT_UNKNOWN, c.Message.WRITE_UNKNOWN.value), **_extra(result)}
            return result
        accepted = self._reports_for(tenant).accept(call.save.filename, call.save.sha256)
        if accepted is Accepted.OK:
            return result
        call.outcome, call.reason = Outcome.RESULT_UNKNOWN, f"report_{accepted.value}"
        return {**tool_result(c.Status.RESULT_UNKNOWN, c.Message.WRITE_UNKNOWN.value), **_extra(result)}

    # -- endings ----------------------------------------------------------------------------

    def _audit_ready(self) -> None:
        try:
            self._audit.check()
        except Exception:
            raise Denied(Denial.AUDIT_UNAVAILABLE, "audit_unavailable") from None

    async def _emit_terminal(self, call: _Call) -> None:
        if call.audited:
            return
        call.audited = True
        try:
            await self._audit.emit(call.event, **call.audit_fields())
        except Exception:
            log.error("audit write failed; refusing the response")
            raise _AuditFailed from None

    async def _finish_json(
        self, out: _Responder, call: _Call, status: int, body: dict[str, Any], headers: dict[str, str] | None = None
    ) -> None:
        payload = rpc.encode(body)
        extra = [(k.encode(), v.encode()) for k, v in (headers or {}).items()]
        await self._finish_raw(out, call, status, payload, [(b"content-type", b"application/json"), *extra])

    async def _finish_raw(
        self, out: _Responder, call: _Call, status: int, payload: bytes, headers: list[tuple[bytes, bytes]]
    ) -> None:
        call.status = status
        call.bytes_out = len(payload)
        try:
            await self._emit_terminal(call)
        except _AuditFailed:
            if out.started:
                return
            status, payload = 503, rpc.encode(rpc.error(None, Denial.AUDIT_UNAVAILABLE.code, Denial.AUDIT_UNAVAILABLE.message))
            headers = [(b"content-type", b"application/json")]
        await out.whole(status, payload, headers)


class _AuditFailed(Exception):
    pass


class _Responder:
    """Sends one HTTP response: whole, or as a stream of chunks."""

    def __init__(self, send: Send, call: _Call) -> None:
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


# -- helpers ---------------------------------------------------------------------------------


def _headers(scope: Scope) -> dict[str, str]:
    return {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}


def _all(scope: Scope, name: bytes) -> list[str]:
    """Every value of a header: two Authorization headers must be refused, not merged."""
    return [v.decode("latin-1") for k, v in scope["headers"] if k == name]


def _str_headers(headers: list[tuple[bytes, bytes]]) -> list[tuple[str, str]]:
    return [(k.decode("latin-1"), v.decode("latin-1")) for k, v in headers]


async def _read_body(receive: Receive, limit: int, headers: dict[str, str]) -> bytes:
    if not headers.get("content-type", "").lower().startswith("application/json"):
        raise Denied(Denial.UNSUPPORTED_MEDIA, "unsupported_media_type")
    declared = headers.get("content-length")
    if declared is not None and (not declared.isdigit() or int(declared) > limit):
        raise Denied(Denial.TOO_LARGE, "body_too_large")
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise Denied(Denial.BAD_REQUEST, "client_disconnected")
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise Denied(Denial.TOO_LARGE, "body_too_large")
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)


async def _read_capped(response: httpx2.Response, limit: int) -> bytes:
    chunks: list[bytes] = []
    size = 0
    async for chunk in response.aiter_raw():
        size += len(chunk)
        if size > limit:
            raise sse.EventTooLarge
        chunks.append(chunk)
    return b"".join(chunks)


def _check_routing_headers(msg: rpc.RpcMessage, headers: dict[str, str]) -> None:
    """2026-07-28 routing headers must agree with the body, or policy could judge one thing
    while the sandbox routes another."""
    method_header = headers.get("mcp-method")
    if method_header is not None and method_header != msg.method:
        raise Denied(Denial.BAD_REQUEST, "routing_header_mismatch")
    name_header = headers.get("mcp-name")
    if name_header is not None and msg.method == "tools/call" and name_header != msg.tool:
        raise Denied(Denial.BAD_REQUEST, "routing_header_mismatch")


def _forward_body(msg: rpc.RpcMessage, decision: Forward) -> bytes:
    # The in-band answer is the broker's business: the sandbox gets a plain call with the token.
    params = {k: v for k, v in msg.params.items() if k not in ("requestState", "inputResponses")}
    params["arguments"] = decision.arguments
    return rpc.encode({**msg.body, "params": params})


def _json(raw: bytes | None) -> Any:
    if not raw:
        return None
    try:
        return json.loads(raw)
    except (ValueError, RecursionError):
        return None


def _tool_status(result: dict[str, Any]) -> str:
    structured = result.get("structuredContent")
    if isinstance(structured, dict) and structured.get("status") in _RESULT_STATUSES:
        return str(structured["status"])
    return c.Status.FAILED.value if result.get("isError") else c.Status.OK.value


def _extra(result: dict[str, Any]) -> dict[str, Any]:
    """Protocol fields of the original result worth keeping (e.g. resultType)."""
    return {k: v for k, v in result.items() if k in ("resultType", "_meta")}


def _stream_outcome(call: _Call, status: int) -> tuple[Outcome, str]:
    if status < 300:
        return Outcome.OK, "ok"
    return Outcome.ERROR, f"upstream_http_{status}"


def _auth_error_body(exc: AuthError) -> dict[str, Any]:
    text = {401: "Unauthorized", 403: "Forbidden"}.get(exc.status, "Service unavailable")
    return rpc.error(None, rpc.FORBIDDEN if exc.status == 403 else rpc.INVALID_REQUEST, text)
