# Over 450 lines: the approvals REST routes, one handler each, over one access check.
"""REST for out-of-band approvals: list, show, approve, deny (DESIGN §4).

Only principals with `reports:approve` may use it, and only for their own tenant: another
tenant's approval id answers 404, exactly like an id that does not exist. Without an
`Authorization` header, an approver signed in on the page (broker/web/signin.py) is served by
the session cookie instead: for the tenants the provider's claims mapped (a listing names one
with `?tenant=` when there are several), and every POST must carry the session's CSRF token in
`X-CSRF-Token` (403 {"error": "csrf"}); an ended or expired session answers 401.

    GET  /v1/approvals?state=pending&limit=50&cursor=OPAQUE[&tenant=T, signed-in approvers]
         -> {"approvals": [metadata, ...], "next_cursor": "OPAQUE" | null}
         state: pending (default) | approved | denied | consumed | expired | all
         limit: 1..100 (default 50); newest first; follow `next_cursor` until it is null
    GET  /v1/approvals/{id}          -> metadata + {"content": "..."} (the only place with content)
    POST /v1/approvals/{id}/approve  -> metadata
    POST /v1/approvals/{id}/deny     -> metadata; optional body {"reason": CODE}, CODE one of
                                        DENY_REASONS (audited as `decision_reason`; never text)

    metadata = {"approval_id", "state", "requester", "requester_issuer", "filename", "sha256",
                "bytes", "created_at", "expires_at", "decided_by", "decided_at", "consumed_at",
                "approvals", "required"}
               (the requester is a person: their id and the issuer that vouches for it, null for
               a record from before issuers were kept)
               (times are Unix seconds, floats; the decided/consumed ones may be null)

The cursor is opaque to clients: it holds a position in the listing and the state it was
made for, never a tenant (the tenant is always the principal's). A page for one approval
(`/approvals?id=X`) should fetch `GET /v1/approvals/X` itself, not search the listing.

Errors are `{"error": CODE}`: 400 unknown_state | bad_limit | bad_cursor, 401/403 (with a
`WWW-Authenticate` challenge), 404 not_found (also another tenant's id, or a malformed one),
409 not_pending | already_decided | content_not_viewed (an approve by someone who never
fetched `GET /v1/approvals/{id}`: what a person approves is what they read; a deny needs no
fetch), 410 expired, 403 approver_is_requester, 429 rate_limited | concurrency_limited
(with `Retry-After`; REST calls count against the tenant's limits like /mcp calls), 503
audit_unavailable | approvals_unavailable (the approvals database cannot be reached; with
`Retry-After`). Every response carries `Cache-Control: no-store` and
`X-Content-Type-Options: nosniff`, and every request leaves exactly one audit event.
"""

from __future__ import annotations

import json
import logging
import math
import re
import secrets
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

import anyio
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from broker.approvals.receipts import complete_receipt
from broker.approvals.store import ApprovalStore, DecisionError, Position, StoreUnavailable, Vote
from broker.audit import AuditSinkError
from broker.audit.commitment import commitment_field
from broker.audit.schema import AuditEvent
from broker.auth import AuthError
from broker.auth.preauth import client_address
from broker.auth.service import AuthService
from broker.base64url import b64url_decode, b64url_encode
from broker.policy import APPROVE, VIEW_APPROVALS, Call, Decider, Decision, Policies, TenantLimiter
from broker.types import ApprovalState, OAuthScope, Outcome, Principal, TenantId
from broker.web.approver_sessions import WebSession
from broker.web.signin import SignIn

log = logging.getLogger("docbroker")

PREFIX = "/v1/approvals"
DEFAULT_LIMIT = 50
MAX_LIMIT = 100
_ID_RE = re.compile(r"[0-9a-f]{32}")
_CURSOR_RE = re.compile(r"[A-Za-z0-9_-]{1,200}")
_STATES = {s.value: s for s in ApprovalState}
# Why an approver denied, as a code from this list: audited, counted, never free text (a
# reason typed by a person could carry the report's content or a name into the audit log).
DENY_REASONS = frozenset({"wrong_content", "not_expected", "hidden_characters", "wrong_file", "other"})
MAX_DECISION_BODY = 256
_DECISION_STATUS = {
    DecisionError.NOT_FOUND: 404,
    DecisionError.NOT_PENDING: 409,
    DecisionError.EXPIRED: 410,
    DecisionError.SAME_PERSON: 403,
    DecisionError.ALREADY_DECIDED: 409,
    DecisionError.CONTENT_NOT_VIEWED: 409,
}
# Report contents (and the metadata of other people's drafts) must not stay in a browser's
# or a proxy's cache, nor be sniffed into something other than JSON.
HEADERS = {"cache-control": "no-store", "x-content-type-options": "nosniff"}

Audit = Callable[..., Awaitable[None]]


@dataclass
class Reply:
    """One answer and the one audit event that records it."""

    status: int
    body: dict[str, object]
    event: AuditEvent
    outcome: Outcome
    reason: str
    approval_id: str | None = None  # only ids of records the principal's tenant holds
    decision: str | None = None
    headers: dict[str, str] = field(default_factory=dict)
    counted: bool = False  # audited on the interval's counted auth.denied line instead
    policy: Decision | None = None  # a decision's: the determining policy ids and the set's hash
    issuer: str | None = None  # on decisions: who vouches for the approver's subject
    decision_reason: str | None = None  # a denial's reason code (DENY_REASONS)
    # On decisions recorded: the record's content commitment and the approvers the policy
    # asked for (DESIGN §16: what a receipt checks the decisions against).
    commitment: dict[str, str] = field(default_factory=dict)
    approvers_required: int | None = None


def _refused(status: int, error: str, event: AuditEvent, reason: str | None = None) -> Reply:
    outcome = Outcome.DENIED if status in (401, 403, 429) else Outcome.REJECTED
    return Reply(status, {"error": error}, event, outcome, reason or error)


class ApprovalsApi:
    """An ASGI app for everything under /v1/approvals, so even an unknown path or method is
    answered here, with its audit event, rather than by the router."""

    def __init__(
        self,
        *,
        auth: AuthService,
        store: ApprovalStore,
        policies: Policies,
        engine: Decider,
        limiter: TenantLimiter,
        audit: Audit,
        audit_ready: Callable[[], None],
        require_distinct_approver: bool,
        signin: SignIn | None = None,
        audit_log: Path | None = None,
    ) -> None:
        self._auth = auth
        self._store = store
        self._policies = policies
        self._engine = engine
        self._limiter = limiter
        self._audit = audit
        self._audit_ready = audit_ready  # raises AuditSinkError while the log cannot be written
        self._require_distinct = require_distinct_approver
        self._signin = signin  # None: bearer tokens only (no OpenID Provider configured)
        self._audit_log = audit_log  # this replica's log: receipts are made from it and its peers'

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        request = Request(scope, receive)
        request_id = secrets.token_hex(16)
        try:
            reply, principal = await self._answer(request)
            if not reply.counted:
                await self._audit(
                    reply.event,
                    request_id=request_id,
                    tenant=principal.tenant if principal else None,
                    subject=principal.subject if principal else None,
                    method="approvals",
                    outcome=reply.outcome,
                    reason=reply.reason,
                    status=reply.status,
                    approval_id=reply.approval_id,
                    policy_ids=list(reply.policy.policy_ids) or None if reply.policy else None,
                    policy_hash=reply.policy.policy_hash if reply.policy else None,
                    decision=reply.decision,
                    **({"issuer": reply.issuer} if reply.issuer else {}),
                    **({"decision_reason": reply.decision_reason} if reply.decision_reason else {}),
                    **reply.commitment,
                    **({"approvers_required": reply.approvers_required} if reply.approvers_required else {}),
                )
        except AuditSinkError:
            # As /mcp does: refuse, never answer unaudited, never a bare 500.
            response = JSONResponse({"error": "audit_unavailable"}, 503, headers=HEADERS)
        else:
            response = JSONResponse(reply.body, reply.status, headers={**reply.headers, **HEADERS})
        await response(scope, receive, send)

    async def _answer(self, request: Request) -> tuple[Reply, Principal | None]:
        route = _route(request.method, request.scope["path"])
        authorization = request.headers.getlist("authorization")
        if not authorization and self._signin is not None and self._signin.has_cookie(request):
            return await self._with_session(request, route, self._signin)
        # A receipt is the requester's too, who need not be an approver: the handler decides.
        authenticate = (
            self._auth.authenticate if route.handler is ApprovalsApi._receipt else self._auth.approver
        )
        try:
            principal = await authenticate(authorization, client_address(request.scope))
        except AuthError as exc:
            error = {401: "unauthorized", 429: "too_many_requests"}.get(exc.status, "forbidden")
            reply = _refused(exc.status, error, AuditEvent.AUTH_DENIED, exc.reason.value)
            reply.headers = self._auth.challenge(exc)
            reply.counted = exc.counted  # the pre-auth limiter's counted line stands for it
            return reply, None
        return await self._serve(request, route, principal), principal

    async def _with_session(
        self, request: Request, route: _Route, signin: SignIn
    ) -> tuple[Reply, Principal | None]:
        """A signed-in approver (broker/web/signin.py): the session's person acts for the
        tenants the provider's claims mapped at sign-in, one per request."""
        try:
            session = await signin.session(request)
        except StoreUnavailable:
            return Reply(503, {"error": "approvals_unavailable"}, route.event, Outcome.ERROR,
                         "approval_store_unavailable", headers={"retry-after": "5"}), None  # fmt: skip
        if session is None:  # unknown, ended at logout, idle too long or past its lifetime
            reply = _refused(401, "unauthorized", AuditEvent.AUTH_DENIED, "session_invalid")
            reply.counted = signin.counted(request, reply.reason)  # as a bad token is
            return reply, None
        tenant = await self._session_tenant(request, route, session)
        # The person with the groups their id_token named: every policy decides on them here
        # as on a token's (a group's forbid holds on the page too).
        principal = Principal(tenant=TenantId(tenant or session.tenants[0]), subject=session.subject,
                              scopes=frozenset({OAuthScope.REPORTS_APPROVE}),
                              groups=frozenset(session.groups), issuer=session.issuer)  # fmt: skip
        if request.method not in ("GET", "HEAD") and not signin.csrf_ok(request, session):
            reply = _refused(403, "csrf", route.event, "csrf_token_invalid")
            reply.counted = signin.counted(request, reply.reason)
            return reply, principal
        if tenant is None:
            return _refused(403, "forbidden", route.event, "tenant_not_mapped"), principal
        return await self._serve(request, route, principal), principal

    async def _session_tenant(self, request: Request, route: _Route, session: WebSession) -> str | None:
        """The tenant this request is for: the listing's `tenant` (the only one if not named);
        for one approval, the mapped tenant that holds it (ids are unique across tenants)."""
        if route.handler is ApprovalsApi._list:
            named = request.query_params.get("tenant")
            if named is None:
                return session.tenants[0] if len(session.tenants) == 1 else None
            return named if named in session.tenants else None
        if route.approval_id is not None and len(session.tenants) > 1:
            for tenant in session.tenants:
                if await self._store.get(route.approval_id, tenant) is not None:
                    return tenant
        return session.tenants[0]  # the record is not found there either: 404, as for anyone

    async def _serve(self, request: Request, route: _Route, principal: Principal) -> Reply:
        # REST calls spend the tenant's own budget, like /mcp calls: an approver's token can
        # not be used to flood the broker (or starve the tenant's other callers) for free.
        tenant = principal.tenant
        wait = self._limiter.take(tenant)
        if wait:
            reply = _refused(429, "rate_limited", route.event)
            reply.headers = {"retry-after": str(int(wait))}
            return reply
        if not self._limiter.enter(tenant):
            reply = _refused(429, "concurrency_limited", route.event)
            reply.headers = {"retry-after": "1"}
            return reply
        try:
            if route.handler is None:
                return _refused(route.status, route.error, route.event)
            self._audit_ready()  # nothing is shown or decided while it cannot be recorded
            if route.event is AuditEvent.APPROVAL_VIEWED and route.handler is not ApprovalsApi._receipt:
                # Listing or reading approvals shows reports' contents: the policy decides who may.
                verdict = self._engine.decide(Call(principal, VIEW_APPROVALS))
                if not verdict.allowed:
                    refused = _refused(403, "forbidden", route.event, "viewer_not_permitted")
                    refused.policy = verdict
                    return refused
                reply = await route.handler(self, request, principal, route.approval_id)
                reply.policy = reply.policy or verdict
                return reply
            reply = await route.handler(self, request, principal, route.approval_id)
            if reply.event is AuditEvent.APPROVAL_DECIDED:
                reply.issuer = principal.issuer  # the approver is the pair (issuer, subject)
            return reply
        except AuditSinkError:
            raise
        except StoreUnavailable:  # fail closed, audited; the client may retry
            return Reply(503, {"error": "approvals_unavailable"}, route.event, Outcome.ERROR,
                         "approval_store_unavailable", headers={"retry-after": "5"})  # fmt: skip
        except Exception as exc:  # one audited answer, never a bare 500 from the router
            log.error("approvals api failed", extra={"error": type(exc).__name__})
            return Reply(500, {"error": "internal"}, route.event, Outcome.ERROR, "internal_error")
        finally:
            self._limiter.leave(tenant)

    def routes(self) -> list[Route]:
        return [Route(PREFIX, self), Route(PREFIX + "/{rest:path}", self)]

    # -- endpoints --------------------------------------------------------------------------

    async def _list(self, request: Request, principal: Principal, _: str | None) -> Reply:
        event = AuditEvent.APPROVAL_VIEWED
        query = request.query_params
        state_name = query.get("state", ApprovalState.PENDING.value)
        if state_name != "all" and state_name not in _STATES:
            return _refused(400, "unknown_state", event)
        limit = _limit(query.get("limit"))
        if limit is None:
            return _refused(400, "bad_limit", event)
        after = None
        if "cursor" in query:
            after = _read_cursor(query["cursor"], state_name)
            if after is None:
                return _refused(400, "bad_cursor", event)
        page = await self._store.page(principal.tenant, _STATES.get(state_name), limit=limit, after=after)
        body: dict[str, object] = {
            "approvals": [a.public() for a in page.items],
            "next_cursor": _write_cursor(page.next, state_name) if page.next else None,
        }
        return Reply(200, body, event, Outcome.OK, "listed")

    async def _show(self, request: Request, principal: Principal, approval_id: str | None) -> Reply:
        event = AuditEvent.APPROVAL_VIEWED
        record = await self._store.detail(approval_id, principal.tenant) if approval_id else None
        if record is None:
            return _refused(404, "not_found", event, "not_found" if approval_id else "malformed_id")
        # The content of a report is shown here: who read it is worth a record, and only a
        # person it was shown to may approve it (the store refuses anyone else's yes).
        await self._store.viewed(record.approval.id, principal.tenant, principal.person)
        return Reply(200, record.public(), event, Outcome.OK, "shown", approval_id=record.approval.id)

    async def _receipt(self, request: Request, principal: Principal, approval_id: str | None) -> Reply:
        """A written report's receipt (DESIGN §16): for the tenant's approvers (whom the policy
        lets view approvals) and its requester; 409 until the report is written and its lines
        are under signed checkpoints."""
        event = AuditEvent.APPROVAL_VIEWED
        record = await self._store.get(approval_id, principal.tenant) if approval_id else None
        if record is None:
            return _refused(404, "not_found", event, "not_found" if approval_id else "malformed_id")
        approver = principal.has(OAuthScope.REPORTS_APPROVE)
        verdict = self._engine.decide(Call(principal, VIEW_APPROVALS)) if approver else None
        if not record.requester.may_be(principal.person) and not (verdict and verdict.allowed):
            refused = _refused(403, "forbidden", event, "viewer_not_permitted")
            refused.policy = verdict
            return refused
        if record.state is not ApprovalState.CONSUMED or self._audit_log is None:
            return _refused(409, "not_written", event, "receipt_not_written")
        receipt = await anyio.to_thread.run_sync(complete_receipt, record, self._audit_log)
        if receipt is None:  # a line not yet under a checkpoint, or on a log out of reach
            reply = _refused(409, "receipt_not_ready", event, "receipt_not_ready")
            reply.headers = {"retry-after": "10"}
            return reply
        return Reply(200, receipt, event, Outcome.OK, "receipt", approval_id=record.id, policy=verdict)

    async def _approve(self, request: Request, principal: Principal, approval_id: str | None) -> Reply:
        return await self._decide(principal, approval_id, approve=True)

    async def _deny(self, request: Request, principal: Principal, approval_id: str | None) -> Reply:
        reason = await _deny_reason(request)
        if reason is None:
            return _refused(400, "bad_reason", AuditEvent.APPROVAL_DECIDED)
        reply = await self._decide(principal, approval_id, approve=False)
        if reply.status == 200 and reason:
            reply.decision_reason = reason
        return reply

    async def _decide(self, principal: Principal, approval_id: str | None, *, approve: bool) -> Reply:
        event = AuditEvent.APPROVAL_DECIDED
        if approval_id is None:
            return _refused(404, "not_found", event, "malformed_id")
        # The policy decides on the record (its size, whether this is its requester): read it
        # first, from this tenant's records only. Its state is the store's to check, atomically.
        current = await self._store.get(approval_id, principal.tenant)
        if current is None:
            return _refused(404, DecisionError.NOT_FOUND.value, event)
        asked = Call(
            principal,
            APPROVE,
            content_bytes=current.bytes,
            self_approval=current.requester.may_be(principal.person),
        )
        verdict = self._engine.decide(asked)
        if not verdict.allowed:
            # Refused only because it is their own report: the answer says so, as it always has.
            own = asked.self_approval and self._engine.decide(replace(asked, self_approval=False)).allowed
            if own:
                refused = _refused(403, DecisionError.SAME_PERSON.value, event)
            else:
                refused = _refused(403, "forbidden", event, "approver_not_permitted")
            refused.policy, refused.approval_id = verdict, current.id
            return refused
        policy = self._policies.get(principal.tenant)
        # The vote keeps what deciding again takes (the set may change before the write):
        # the approver's groups and scopes, and how many approvers this decision asked for.
        groups, scopes = tuple(sorted(principal.groups)), tuple(sorted(s.value for s in principal.scopes))
        vote = Vote(principal.person, groups, scopes, verdict.approvers, verdict.policy_hash)
        outcome = await self._store.decide(
            approval_id,
            tenant=principal.tenant,
            vote=vote,
            approve=approve,
            require_distinct=self._require_distinct or policy.require_distinct_approver,
        )
        if isinstance(outcome, DecisionError):
            reply = _refused(_DECISION_STATUS[outcome], outcome.value, event)
            if outcome is not DecisionError.NOT_FOUND:
                reply.approval_id = approval_id  # the tenant's own record: not a probe's guess
            return reply
        decision = ApprovalState.APPROVED if approve else ApprovalState.DENIED
        # A yes that leaves the record pending is counted: it waits for more approvers.
        reason = "decided" if outcome.state is not ApprovalState.PENDING else "more_approvers_required"
        return Reply(
            200, outcome.public(), event, Outcome.OK, reason, outcome.id, decision.value, policy=verdict,
            commitment=commitment_field(outcome.salt, outcome.sha256), approvers_required=verdict.approvers,
        )  # fmt: skip


async def _deny_reason(request: Request) -> str | None:
    """The denial's reason code: "" without a body, None (refused) for anything but
    {"reason": one of DENY_REASONS} in at most MAX_DECISION_BODY bytes."""
    body = b""
    async for chunk in request.stream():
        body += chunk
        if len(body) > MAX_DECISION_BODY:
            return None
    if not body.strip():
        return ""
    try:
        value = json.loads(body)
    except ValueError:
        return None
    reason = value.get("reason") if isinstance(value, dict) and set(value) == {"reason"} else None
    return reason if isinstance(reason, str) and reason in DENY_REASONS else None


Handler = Callable[[ApprovalsApi, Request, Principal, str | None], Awaitable[Reply]]


@dataclass(frozen=True)
class _Route:
    event: AuditEvent
    handler: Handler | None  # None: refused with `status` and `error`
    approval_id: str | None = None  # None also when the id in the path is malformed
    status: int = 404
    error: str = "not_found"


def _route(method: str, path: str) -> _Route:
    """Which endpoint a request is for. Decided before authentication only to name the event."""
    parts = path.removeprefix(PREFIX).strip("/").split("/") if path.rstrip("/") != PREFIX else []
    viewed, decided = AuditEvent.APPROVAL_VIEWED, AuditEvent.APPROVAL_DECIDED
    if len(parts) == 2 and parts[1] == "receipt":
        return _for_method(method, "GET", viewed, ApprovalsApi._receipt, parts[0])
    if len(parts) == 2 and parts[1] in ("approve", "deny"):
        handler = ApprovalsApi._approve if parts[1] == "approve" else ApprovalsApi._deny
        return _for_method(method, "POST", decided, handler, parts[0])
    if len(parts) == 1:
        return _for_method(method, "GET", viewed, ApprovalsApi._show, parts[0])
    if not parts:
        return _for_method(method, "GET", viewed, ApprovalsApi._list, None)
    return _Route(viewed, None)


def _for_method(method: str, wanted: str, event: AuditEvent, handler: Handler, raw_id: str | None) -> _Route:
    if method != wanted:
        return _Route(event, None, status=405, error="method_not_allowed")
    approval_id = raw_id if raw_id is not None and _ID_RE.fullmatch(raw_id) else None
    return _Route(event, handler, approval_id)


def _limit(raw: str | None) -> int | None:
    if raw is None:
        return DEFAULT_LIMIT
    if not raw.isascii() or not raw.isdigit() or not 1 <= int(raw) <= MAX_LIMIT:
        return None
    return int(raw)


# -- the cursor: opaque to clients, a position and the state it was made for, never a tenant --


def _write_cursor(position: Position, state_name: str) -> str:
    raw = json.dumps([1, state_name, position.created_at, position.id], separators=(",", ":"))
    return b64url_encode(raw.encode())


def _read_cursor(text: str, state_name: str) -> Position | None:
    if not _CURSOR_RE.fullmatch(text):
        return None
    raw = b64url_decode(text)  # one spelling per cursor, as for every value a client hands back
    if raw is None:
        return None
    try:
        value = json.loads(raw)
    except ValueError:
        return None
    if not isinstance(value, list) or len(value) != 4:
        return None
    version, state, created_at, approval_id = value
    if version != 1 or state != state_name:
        return None  # a cursor belongs to the listing it came from
    if type(created_at) not in (int, float) or not math.isfinite(created_at):
        return None
    if not isinstance(approval_id, str) or not _ID_RE.fullmatch(approval_id):
        return None
    return Position(float(created_at), approval_id)
