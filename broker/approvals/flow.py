# Over 450 lines: one class, the approval gate's state machine (in-band and out-of-band).
"""The approval gate in front of `save_report` (DESIGN §4).

A `save_report` call never reaches the sandbox without a human's approval of this exact
filename and content. `ApprovalFlow.gate` decides, for one call, between:

- `Forward`: approved; the call goes on with a freshly minted `approval_token`;
- `Answer`: the broker answers itself: a `waiting_approval` result (out-of-band), an
  `input_required` question (in-band, 2026-07-28 clients that declare elicitation), or a
  rejection.

The approval token is minted here, with the tenant's derived secret, only at the moment of
forwarding; it never reaches the client.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import logging
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from broker.approvals import visible
from broker.approvals.claims import Claims, Unsent, give_back, give_back_owed, recover_claims
from broker.approvals.reports import Reports
from broker.approvals.sealing import SealedApproval, StateSealer
from broker.approvals.store import Approval, ApprovalStore, Draft, StoreUnavailable, TooManyPending
from broker.audit import AuditFn
from broker.audit.commitment import commitment_field
from broker.audit.schema import AuditEvent
from broker.errors import Denial, Denied
from broker.policy import APPROVE, Call, Decider, Decision, TenantPolicy
from broker.protocol.answers import BROKER_ONLY_ARGUMENT, broker_result
from broker.protocol.jsonrpc import RpcMessage
from broker.protocol.versions import MODERN
from broker.settings import ApprovalSettings
from broker.types import OAuthScope, Outcome, Person, Principal, TenantId
from server import contracts as c
from server.approval import content_sha256, mint_token

log = logging.getLogger("docbroker")

INPUT_KEY = "approval"
DENIED_MESSAGE = "the report was not approved"
TOO_MANY_MESSAGE = "too many reports are waiting for approval"
NO_APPROVE_SCOPE_MESSAGE = "answering an approval needs the reports:approve scope"
SAME_PERSON_MESSAGE = "this report must be approved by someone other than its requester"
NOT_PERMITTED_MESSAGE = "the policy does not let this approver decide for the tenant"
MORE_APPROVERS_MESSAGE = "this report needs more than one approver: it waits for them out-of-band"
POLICY_CHANGED_MESSAGE = "the policy changed since this report was approved and no longer grants it"

# event name, fields (names and ids only)


class _ClientSave(c.StrictInput):
    """What a client may send: the server's input without the broker-only token."""

    filename: c.Filename
    content: c.ReportContent


@dataclass(frozen=True)
class Forward:
    arguments: dict[str, Any]
    approval_id: str
    filename: str
    sha256: str
    consumed_at: float  # names this consumption of the record (store: confirm, release)


@dataclass(frozen=True)
class Answer:
    result: dict[str, Any]  # the JSON-RPC `result` value to send back
    outcome: Outcome
    reason: str
    approval_id: str | None = None
    policy: Decision | None = None  # the approver's decision, when the policy refused it


def _rejected(message: str, reason: str) -> Answer:
    return Answer(broker_result(c.Status.REJECTED, message), Outcome.REJECTED, reason)


class ApprovalFlow:
    def __init__(
        self,
        *,
        store: ApprovalStore,
        sealer: StateSealer,
        secret_for: Callable[[str], str],
        reports_for: Callable[[str], Reports],
        claims: Claims,
        settings: ApprovalSettings,
        public_url: str,
        audit: AuditFn,
        engine: Decider,
        clock: Callable[[], float] = time.time,
        notify_pending: Callable[[Approval, str], None] | None = None,
    ) -> None:
        self._engine = engine  # may this approver decide for the tenant (the `approve` action)
        self._notify_pending = notify_pending  # (record, approve_url): queued, never awaited
        self._store = store
        self._sealer = sealer
        self._secret_for = secret_for
        self._reports_for = reports_for
        self._claims = claims
        self._settings = settings
        self._public_url = public_url
        self._audit = audit
        self._clock = clock

    async def gate(
        self, principal: Principal, policy: TenantPolicy, msg: RpcMessage, request_id: str
    ) -> Forward | Answer:
        """Raises Denied(APPROVALS_UNAVAILABLE) when the store cannot be reached: fail closed."""
        try:
            return await self._gate(principal, policy, msg, request_id)
        except StoreUnavailable:
            raise Denied(Denial.APPROVALS_UNAVAILABLE, "approval_store_unavailable", retry_after=5) from None

    async def _gate(
        self, principal: Principal, policy: TenantPolicy, msg: RpcMessage, request_id: str
    ) -> Forward | Answer:
        args = msg.arguments
        if BROKER_ONLY_ARGUMENT in args:
            return _rejected(c.Message.INVALID_INPUT.value, "client_supplied_approval_token")
        try:
            save = _ClientSave.model_validate(args)
        except ValidationError:
            return _rejected(c.Message.INVALID_INPUT.value, "invalid_arguments")
        data = save.content.encode("utf-8")  # the model checked it is encodable and small enough
        if await self._reports_for(principal.tenant).exists(save.filename):
            return _rejected(c.Message.REPORT_EXISTS.value, "report_exists")
        draft = Draft(
            tenant=principal.tenant,
            requester=principal.person,
            filename=save.filename,
            content=save.content,
            sha256=content_sha256(save.content),
            size=len(data),
        )
        ids = {"request_id": request_id, "tenant": principal.tenant, "subject": principal.subject}
        if principal.issuer:  # the requester is the pair (issuer, subject), as a receipt names them
            ids["issuer"] = principal.issuer

        state = msg.params.get("requestState")
        if state is not None:
            responses = msg.params.get("inputResponses")
            return await self._answered_in_band(principal, policy, draft, state, responses, ids)

        approved = await self._consume(draft)
        if approved is not None:
            changed = await self._decided_again(draft, approved)
            if changed is not None:
                return changed
            await self._audit(
                AuditEvent.APPROVAL_CONSUMED, approval_id=approved.id, outcome=Outcome.OK,
                **commitment_field(approved.salt, approved.sha256), **ids,
            )  # fmt: skip
            return self._forward(draft, approved)
        if await self._claim_held(draft):
            # A broker holds this report's approval (a save in flight, or one whose release
            # waits for the database): the human already said yes. Retry later, never ask again.
            raise Denied(Denial.APPROVALS_UNAVAILABLE, "approval_claim_held", retry_after=2)

        refused = await self._store.denied(draft)
        if refused is not None:
            result = broker_result(c.Status.REJECTED, DENIED_MESSAGE)
            return Answer(result, Outcome.REJECTED, "approval_denied", refused.id)

        if self._in_band_possible(principal, policy, msg, draft):
            return await self._ask_in_band(draft, policy, ids)
        return await self._wait_out_of_band(draft, policy, ids)

    # -- out-of-band ------------------------------------------------------------------------

    async def _wait_out_of_band(self, draft: Draft, policy: TenantPolicy, ids: dict[str, str]) -> Answer:
        try:
            record, created = await self._store.request(
                draft, ttl=self._settings.ttl_seconds, max_pending=policy.max_pending_approvals
            )
        except TooManyPending:
            return _rejected(TOO_MANY_MESSAGE, "too_many_pending_approvals")
        approve_url = f"{self._public_url}/approvals?id={record.id}"
        if created:
            await self._audit(
                AuditEvent.APPROVAL_REQUESTED,
                approval_id=record.id,
                outcome=Outcome.WAITING_APPROVAL,
                **commitment_field(record.salt, record.sha256),
                **ids,
            )
            if self._notify_pending is not None:
                self._notify_pending(record, approve_url)
        data = c.PendingApprovalData(
            approval_id=record.id,
            filename=draft.filename,
            bytes=draft.size,
            sha256=draft.sha256,
            approve_url=approve_url,
        ).model_dump()
        result = broker_result(c.Status.WAITING_APPROVAL, c.Message.WAITING_APPROVAL.value, data)
        return Answer(result, Outcome.WAITING_APPROVAL, "approval_pending", record.id)

    # -- in-band ----------------------------------------------------------------------------

    def _in_band_possible(
        self, principal: Principal, policy: TenantPolicy, msg: RpcMessage, draft: Draft
    ) -> bool:
        # The human answering in-band is the caller: only when they may approve, and the
        # tenant does not demand a second person — nor the policy, for this report.
        if msg.protocol_version != MODERN or "elicitation" not in msg.client_capabilities():
            return False
        if self._distinct_approver(policy) or not principal.has(OAuthScope.REPORTS_APPROVE):
            return False
        own = self._engine.decide(self._own(principal, draft))
        return own.allowed and own.approvers == 1  # one answer in-band cannot be two approvers

    @staticmethod
    def _own(principal: Principal, draft: Draft) -> Call:
        """The policy's question for an answer in-band: its requester approves their report."""
        return Call(principal, APPROVE, content_bytes=draft.size, self_approval=True)

    def _distinct_approver(self, policy: TenantPolicy) -> bool:
        return policy.require_distinct_approver or self._settings.require_distinct_approver

    async def _ask_in_band(self, draft: Draft, policy: TenantPolicy, ids: dict[str, str]) -> Answer:
        approval_id = secrets.token_hex(16)
        ttl = min(self._settings.ttl_seconds, 600)
        try:  # the same cap as out-of-band: an unanswered question holds a pending record too
            await self._store.record_in_band(
                approval_id, draft, ttl=ttl, max_pending=policy.max_pending_approvals
            )
        except TooManyPending:
            return _rejected(TOO_MANY_MESSAGE, "too_many_pending_approvals")
        sealed = self._sealer.seal(
            SealedApproval(
                approval_id=approval_id,
                tenant=draft.tenant,
                subject=draft.requester.id,
                filename=draft.filename,
                sha256=draft.sha256,
                expires=int(self._clock() + ttl),
            )
        )
        # The client shows this text to the human deciding: nothing in it may hide, reorder
        # or drive the display (bidi controls, zero-width, ESC, …); such characters are marks.
        shown = visible.marked(draft.content)
        notice = visible.notice(shown)
        question = {
            "method": "elicitation/create",
            "params": {
                "mode": "form",
                "message": (
                    "Approve writing this report?\n\n"
                    f"File: {draft.filename}\nSize: {draft.size} bytes\nSHA-256: {draft.sha256}\n\n"
                    f"{notice}--- content ---\n{shown.text}\n--- end ---"
                ),
                "requestedSchema": {
                    "type": "object",
                    "properties": {
                        "decision": {"type": "string", "title": "Decision", "enum": ["approve", "deny"]}
                    },
                    "required": ["decision"],
                },
            },
        }
        await self._audit(
            AuditEvent.APPROVAL_REQUESTED,
            approval_id=approval_id,
            outcome=Outcome.WAITING_APPROVAL,
            **commitment_field(draft.salt, draft.sha256),
            **ids,
        )
        result = {
            "resultType": "input_required",
            "inputRequests": {INPUT_KEY: question},
            "requestState": sealed,
        }
        return Answer(result, Outcome.WAITING_APPROVAL, "approval_in_band", approval_id)

    async def _answered_in_band(
        self,
        principal: Principal,
        policy: TenantPolicy,
        draft: Draft,
        state: Any,
        responses: Any,
        ids: dict[str, str],
    ) -> Answer | Forward:
        opened = self._sealer.open(state)
        if opened is None or (opened.tenant, opened.subject, opened.filename, opened.sha256) != (
            draft.tenant,
            draft.requester.id,
            draft.filename,
            draft.sha256,
        ):
            return _rejected(c.Message.APPROVAL_INVALID.value, "request_state_invalid")
        # The sealed state says which question this answers, not who may answer it: the
        # answering request's own principal must be an approver now (its token may differ from
        # the one that asked), and a rule requiring a second person holds here as on REST. The
        # record stays pending: a rightful answer can still come.
        if not principal.has(OAuthScope.REPORTS_APPROVE):
            return _rejected(NO_APPROVE_SCOPE_MESSAGE, "approver_lacks_scope")
        if self._distinct_approver(policy):
            return _rejected(SAME_PERSON_MESSAGE, "approver_is_requester")
        asked = self._own(principal, draft)
        verdict = self._engine.decide(asked)
        if not verdict.allowed:
            # As on REST: refused only because it is their own report, or refused as an approver.
            if self._engine.decide(dataclasses.replace(asked, self_approval=False)).allowed:
                refused = _rejected(SAME_PERSON_MESSAGE, "approver_is_requester")
            else:
                refused = _rejected(NOT_PERMITTED_MESSAGE, "approver_not_permitted")
            return Answer(refused.result, refused.outcome, refused.reason, policy=verdict)
        if verdict.approvers > 1:  # the set changed since the question: more people must decide
            refused = _rejected(MORE_APPROVERS_MESSAGE, "more_approvers_required")
            return Answer(refused.result, refused.outcome, refused.reason, policy=verdict)
        answer = responses.get(INPUT_KEY) if isinstance(responses, dict) else None
        approve = (
            isinstance(answer, dict)
            and answer.get("action") == "accept"
            and isinstance(answer.get("content"), dict)
            and answer["content"].get("decision") == "approve"
        )
        record = await self._store.answer_in_band(
            opened.approval_id,
            tenant=draft.tenant,
            approver=draft.requester.id,
            approve=approve,
            claim=self._claims.new(),
        )
        if record is None:  # answered before: a replayed state
            return _rejected(c.Message.APPROVAL_INVALID.value, "approval_replayed")
        decision = "approved" if approve else "denied"
        await self._audit(
            AuditEvent.APPROVAL_DECIDED, approval_id=record.id, decision=decision, outcome=Outcome.OK,
            policy_ids=list(verdict.policy_ids) or None, policy_hash=verdict.policy_hash,
            approvers_required=verdict.approvers, **commitment_field(record.salt, record.sha256), **ids,
        )  # fmt: skip
        if not approve:
            return Answer(
                broker_result(c.Status.REJECTED, DENIED_MESSAGE),
                Outcome.REJECTED,
                "approval_denied",
                record.id,
            )
        await self._audit(
            AuditEvent.APPROVAL_CONSUMED, approval_id=record.id, outcome=Outcome.OK,
            **commitment_field(record.salt, record.sha256), **ids,
        )  # fmt: skip
        return self._forward(draft, record)

    async def _consume(self, draft: Draft) -> Approval | None:
        """Take the approval for exactly this report. First give back what this broker owes
        of the tenant (releases the database's outage held up); if there is none to take, take
        back claims on it that are lost (a broker that died after consuming it, before sending
        the write) and try again."""
        await give_back_owed(self._store, self._claims, self._audit, draft.tenant)
        take = functools.partial(
            self._store.consume, tenant=draft.tenant, requester=draft.requester,
            filename=draft.filename, sha256=draft.sha256,
        )  # fmt: skip
        approved = await take(claim=self._claims.new())
        if approved is None and await recover_claims(self._store, self._claims, self._audit, draft.tenant):
            approved = await take(claim=self._claims.new())
        return approved

    async def _decided_again(self, draft: Draft, taken: Approval) -> Answer | None:
        """An approval with a yes cast under another policy set than the one in force — any
        yes, not only the one that completed the count (the record names only that one's
        set) — is decided again before its report is written: each yes, as its approver's
        `approve` decision now, and the count the permits now ask for. Still granted: None
        (the write goes on). Not: the consumption is undone, the record reopened with the
        yeses that still hold to collect decisions again, and the save refused with the
        policies that decided (the forbids, or the permits asking for more approvers)."""
        if taken.policy_hash is None:
            return None  # answered in-band (under the set in force), or before votes were kept
        votes = await self._store.votes(taken.id, draft.tenant)
        in_force = self._engine.hash
        if taken.policy_hash == in_force and all(vote.policy_hash == in_force for vote in votes):
            return None
        kept: list[Person] = []
        required, refusing, asking = 1, None, None
        for vote in votes:
            approver = Principal(
                tenant=TenantId(draft.tenant),
                subject=vote.approver.id,
                issuer=vote.approver.issuer,
                scopes=frozenset(OAuthScope(s) for s in vote.scopes if s in OAuthScope._value2member_map_),
                groups=frozenset(vote.groups),
            )
            own = draft.requester.may_be(vote.approver)
            asked = Call(approver, APPROVE, content_bytes=draft.size, self_approval=own)
            verdict = self._engine.decide(asked)
            if not verdict.allowed:
                refusing = refusing or verdict
                continue
            kept.append(vote.approver)
            if asking is None or verdict.approvers > asking.approvers:
                asking = verdict
            required = max(required, verdict.approvers)
        if kept and len(kept) >= required:
            return None
        assert taken.consumed_at is not None
        await self._store.reopen(
            taken.id,
            draft.tenant,
            self._claims.owner,
            consumed_at=taken.consumed_at,
            keep=kept,
            required=required,
        )
        refused = _rejected(POLICY_CHANGED_MESSAGE, "approval_policy_changed")
        return Answer(refused.result, refused.outcome, refused.reason, taken.id, policy=refusing or asking)

    async def _claim_held(self, draft: Draft) -> bool:
        return any(not self._claims.lost(held) for held in await self._store.held(draft))

    async def confirm(self, forward: Forward, tenant: str) -> bool:
        """Make the consumption final, right before the write is sent. False: this broker's
        claim was taken back (it held it past its time), so the write must not be sent."""
        try:
            return await self._store.confirm(
                forward.approval_id, tenant, self._claims.owner, consumed_at=forward.consumed_at
            )
        except StoreUnavailable:
            raise Denied(Denial.APPROVALS_UNAVAILABLE, "approval_store_unavailable", retry_after=5) from None

    async def release(self, forward: Forward, ids: dict[str, str]) -> None:
        """The consumed approval goes back to approved: its write was never sent (DESIGN §4:
        no approval is used up by a call that did not reach the sandbox). If the store cannot
        take it now, it is owed (`Claims.owe`) and given back once the store answers again; its
        claim stays this live broker's meanwhile, so no other broker takes it back and the
        client's retry is told to retry later, not asked for a second approval."""
        unsent = Unsent(forward.approval_id, forward.consumed_at, dict(ids))
        try:
            await give_back(self._store, self._claims, unsent, self._audit)
        except StoreUnavailable:
            log.warning("an unsent approval could not be given back yet: the store is unavailable")
            self._claims.owe(unsent)
        except asyncio.CancelledError:  # the store may not have answered: give it back later
            self._claims.owe(unsent)
            raise

    # -- forwarding -------------------------------------------------------------------------

    def _forward(self, draft: Draft, taken: Approval) -> Forward:
        token = mint_token(
            secret=self._secret_for(draft.tenant),
            tenant=draft.tenant,
            tool=c.TOOL_SAVE,
            filename=draft.filename,
            sha256=draft.sha256,
            expires=int(self._clock()) + self._settings.token_ttl_seconds,
            jti=secrets.token_hex(16),
        )
        arguments = {"filename": draft.filename, "content": draft.content, BROKER_ONLY_ARGUMENT: token}
        assert taken.consumed_at is not None  # a consumed record: the store set it
        return Forward(
            arguments=arguments,
            approval_id=taken.id,
            filename=draft.filename,
            sha256=draft.sha256,
            consumed_at=taken.consumed_at,
        )
