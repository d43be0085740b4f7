"""REST for out-of-band approvals: list, show, approve, deny (DESIGN §4).

Only principals with `reports:approve` may use it, and only for their own tenant: another
tenant's approval id answers 404, exactly like an id that does not exist.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from broker.approvals.store import ApprovalStore, DecisionError
from broker.audit import AuditSinkError
from broker.auth import AuthError
from broker.auth.preauth import client_address
from broker.auth.service import AuthService
from broker.policy import Policies
from broker.types import ApprovalState, Principal

_ID_RE = re.compile(r"[0-9a-f]{32}")
_DECISION_STATUS = {
    DecisionError.NOT_FOUND: 404,
    DecisionError.NOT_PENDING: 409,
    DecisionError.EXPIRED: 410,
    DecisionError.SAME_PERSON: 403,
}

Audit = Callable[..., Awaitable[None]]
Endpoint = Callable[[Request], Awaitable[Response]]


class ApprovalsApi:
    def __init__(
        self,
        *,
        auth: AuthService,
        store: ApprovalStore,
        policies: Policies,
        audit: Audit,
        audit_ready: Callable[[], None],
        require_distinct_approver: bool,
    ) -> None:
        self._auth = auth
        self._store = store
        self._policies = policies
        self._audit = audit
        self._audit_ready = audit_ready  # raises AuditSinkError while the log cannot be written
        self._require_distinct = require_distinct_approver

    def routes(self) -> list[Route]:
        return [
            Route("/v1/approvals", _fail_closed(self.list), methods=["GET"]),
            Route("/v1/approvals/{approval_id}", _fail_closed(self.show), methods=["GET"]),
            Route("/v1/approvals/{approval_id}/approve", _fail_closed(self.approve), methods=["POST"]),
            Route("/v1/approvals/{approval_id}/deny", _fail_closed(self.deny), methods=["POST"]),
        ]

    async def _approver(self, request: Request) -> Principal | Response:
        try:
            authorization = request.headers.getlist("authorization")
            return await self._auth.approver(authorization, client_address(request.scope))
        except AuthError as exc:
            if not exc.counted:  # else on the pre-auth limiter's counted line for the interval
                reason = exc.reason.value
                await self._audit("auth.denied", outcome="denied", reason=reason, method="approvals")
            error = {401: "unauthorized", 429: "too_many_requests"}.get(exc.status, "forbidden")
            return JSONResponse({"error": error}, exc.status, headers=self._auth.challenge(exc))

    async def list(self, request: Request) -> Response:
        principal = await self._approver(request)
        if isinstance(principal, Response):
            return principal
        state_name = request.query_params.get("state", "pending")
        if state_name not in {s.value for s in ApprovalState} | {"all"}:
            return JSONResponse({"error": "unknown_state"}, 400)
        state = None if state_name == "all" else ApprovalState(state_name)
        self._audit_ready()
        items = [a.public() for a in self._store.list(principal.tenant, state)]
        await self._audit("approval.viewed", outcome="ok", reason="listed", **_who(principal))
        return JSONResponse({"approvals": items})

    async def show(self, request: Request) -> Response:
        principal = await self._approver(request)
        if isinstance(principal, Response):
            return principal
        approval_id = request.path_params["approval_id"]
        record = self._store.get(approval_id, principal.tenant) if _ID_RE.fullmatch(approval_id) else None
        if record is None:
            return JSONResponse({"error": "not_found"}, 404)
        self._audit_ready()
        # The content of a report is shown here: who read it is worth a record.
        await self._audit(
            "approval.viewed", approval_id=record.id, outcome="ok", reason="shown", **_who(principal)
        )
        return JSONResponse(record.detail())

    async def approve(self, request: Request) -> Response:
        return await self._decide(request, approve=True)

    async def deny(self, request: Request) -> Response:
        return await self._decide(request, approve=False)

    async def _decide(self, request: Request, *, approve: bool) -> Response:
        principal = await self._approver(request)
        if isinstance(principal, Response):
            return principal
        approval_id = request.path_params["approval_id"]
        if not _ID_RE.fullmatch(approval_id):
            return JSONResponse({"error": "not_found"}, 404)
        policy = self._policies.get(principal.tenant)
        self._audit_ready()  # a decision is recorded only while it can be audited
        outcome = self._store.decide(
            approval_id,
            tenant=principal.tenant,
            approver=principal.subject,
            approve=approve,
            require_distinct=self._require_distinct or policy.require_distinct_approver,
        )
        fields = _who(principal)
        if isinstance(outcome, DecisionError):
            await self._audit("approval.decided", outcome="rejected", reason=outcome.value, **fields)
            return JSONResponse({"error": outcome.value}, _DECISION_STATUS[outcome])
        decision = "approved" if approve else "denied"
        await self._audit(
            "approval.decided", approval_id=outcome.id, decision=decision, outcome="ok", **fields
        )
        return JSONResponse(outcome.public())


def _who(principal: Principal) -> dict[str, Any]:
    return {"tenant": principal.tenant, "subject": principal.subject, "method": "approvals"}


def _fail_closed(endpoint: Endpoint) -> Endpoint:
    """The audit log cannot be written: refuse with 503 (as /mcp does), never a bare 500."""

    async def guarded(request: Request) -> Response:
        try:
            return await endpoint(request)
        except AuditSinkError:
            return JSONResponse({"error": "audit_unavailable"}, 503)

    return guarded
