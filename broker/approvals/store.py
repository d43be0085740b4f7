"""Approval records: what they hold and what a store of them must do (DESIGN §4).

`ApprovalStore` is the interface the approval flow, the REST API and the retention purge
use; `broker.approvals.sqlite_store` is the embedded implementation (one host) and
`broker.approvals.postgres_store` the shared one (replicas, DESIGN §9). Its methods are
coroutines, so an implementation never makes the event loop wait on its database.

Every state change is one conditional transition (`... WHERE state = 'pending'`), so two
humans clicking at once, or two retries racing, cannot both win: exactly one transition
happens and the loser sees the record as it now is.

Consumption has two phases, so a broker that dies between taking an approval and sending
the write loses nothing (DESIGN §9): `consume` takes the record with a claim (who, until
when), `confirm` makes it final just before the write's bytes leave for the sandbox. A claim
never confirmed goes back to approved: given back by its owner (`release`: the write was
refused before it was sent), or taken back (`revert`) by any broker once its owner is dead
or its time is up. A confirmed consumption is never undone: that write may have happened.
One consumption is named by (id, owner, `consumed_at`): an owner confirms or gives back only
the consumption it made, never a later one of the same record (taken back meanwhile, and
consumed again by the same process for another request). A release is recorded under that name,
so its retry knows it already happened.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import Any, Protocol

from broker.types import ApprovalState, Person


class DecisionError(StrEnum):
    """Why a decision was not recorded. Callers map these to HTTP statuses."""

    NOT_FOUND = "not_found"  # also: another tenant's record (no oracle for ids)
    NOT_PENDING = "not_pending"
    EXPIRED = "expired"
    SAME_PERSON = "approver_is_requester"
    ALREADY_DECIDED = "already_decided"  # this approver's decision on it is already counted
    CONTENT_NOT_VIEWED = "content_not_viewed"  # a yes from someone who never fetched the content


class TooManyPending(Exception):
    """The tenant has reached its cap of open approvals (in-band and out-of-band together)."""


class StoreError(Exception):
    """The store cannot do its job. Messages are fixed texts: never a URL, a host or a password.

    StoreError
     ├── StoreUnavailable   the database cannot be reached or did not answer in time
     └── SchemaMismatch     the database's schema is not the version this broker knows
    """


class StoreUnavailable(StoreError):
    def __init__(self) -> None:
        super().__init__("the approvals database cannot be reached or did not answer in time")


class SchemaMismatch(StoreError):
    pass


@dataclass(frozen=True)
class Draft:
    """A report someone wants written: what a human approves, exactly."""

    tenant: str
    requester: Person
    filename: str
    content: str
    sha256: str
    size: int
    # Hex of 32 random bytes: the audit's lines carry sha256(salt ‖ sha256(content)) only
    # (broker/audit/commitment.py); a record requested again keeps the salt it was made with.
    salt: str = field(default_factory=lambda: secrets.token_hex(32))


@dataclass(frozen=True)
class Approval:
    """One record's metadata: everything but the report's content."""

    id: str
    tenant: str
    requester: Person  # its issuer "" when recorded before issuers were (migration 6)
    filename: str
    sha256: str
    bytes: int
    state: ApprovalState
    created_at: float
    expires_at: float
    decided_by: str | None
    decided_at: float | None
    consumed_at: float | None
    # The two-person rule: distinct approvers who said yes, how many the policy asks for, and
    # the hash of the policy set the record was approved under (None until approved).
    approvals: int = 0
    required: int = 1
    policy_hash: str | None = None
    salt: str = ""  # the content commitment's salt; "" for a record from before (migration 8)

    def public(self) -> dict[str, object]:
        """What the REST API and the approvals page show (to approvers of the same tenant)."""
        return {
            "approval_id": self.id,
            "state": self.state.value,
            "requester": self.requester.id,
            "requester_issuer": self.requester.issuer or None,
            "filename": self.filename,
            "sha256": self.sha256,
            "bytes": self.bytes,
            "created_at": self.created_at,
            "expires_at": self.expires_at,
            "decided_by": self.decided_by,
            "decided_at": self.decided_at,
            "consumed_at": self.consumed_at,
            "approvals": self.approvals,
            "required": self.required,
        }

    def as_of(self, now: float) -> Approval:
        """An open record past its expiry reads as expired (nothing rewrites it on disk)."""
        if self.state in (ApprovalState.PENDING, ApprovalState.APPROVED) and self.expires_at <= now:
            return replace(self, state=ApprovalState.EXPIRED)
        return self


@dataclass(frozen=True)
class ApprovalDetail:
    """A record with the report's content, for the human deciding on it."""

    approval: Approval
    content: str  # the tenant's data, kept in the broker's private data dir

    def public(self) -> dict[str, object]:
        return {**self.approval.public(), "content": self.content}


@dataclass(frozen=True)
class Position:
    """Where a listing page ended: the last record's (created_at, id), newest first."""

    created_at: float
    id: str


@dataclass(frozen=True)
class Page:
    items: list[Approval]
    next: Position | None  # None: this was the last page


# -- what the SQL stores share ----------------------------------------------------------------

# Everything but `content`, in this order (`approval_from_row` reads by position): listings and
# decisions never read a report's text.
META_COLUMNS = (
    "id, tenant, requester, filename, sha256, bytes, state, created_at, expires_at, "
    "decided_by, decided_at, consumed_at, approvals, required, policy_hash, requester_issuer, salt"
)
# A draft's requester in a lookup (`{p}`: the backend's placeholder), bound with
# `requester_params`: a record from before issuers were recorded is the requester's still.
REQUESTER_IS = "requester = {p} AND requester_issuer IN ({p}, '')"


def requester_params(person: Person) -> tuple[str, str]:
    return (person.id, person.issuer)


def state_filter(state: ApprovalState, now: str) -> str:
    """A state as it reads in SQL, `now` being the backend's placeholder for the time: expiry
    is computed, never written back."""
    match state:
        case ApprovalState.PENDING | ApprovalState.APPROVED:
            return f"state = '{state.value}' AND expires_at > {now}"
        case ApprovalState.EXPIRED:
            return f"(state IN ('pending', 'approved') AND expires_at <= {now}) OR state = 'expired'"
        case _:
            return f"state = '{state.value}'"


def refusal(current: Approval | None, approver: Person, require_distinct: bool) -> DecisionError | None:
    """Why a decision on this record (as it now reads) cannot be recorded; None if it can."""
    if current is None:
        return DecisionError.NOT_FOUND
    if current.state is ApprovalState.EXPIRED:
        return DecisionError.EXPIRED
    if current.state is not ApprovalState.PENDING:
        return DecisionError.NOT_PENDING
    if require_distinct and current.requester.may_be(approver):
        return DecisionError.SAME_PERSON
    return None


def select(columns: str, rest: str) -> str:
    # Only the stores' own constants are spliced in; every value is a bound parameter.
    return f"SELECT {columns} FROM approvals {rest}"  # noqa: S608


def approval_from_row(row: Sequence[Any]) -> Approval:
    """A record from a row whose first columns are META_COLUMNS."""
    return Approval(
        id=row[0],
        tenant=row[1],
        requester=Person(row[15], row[2]),
        filename=row[3],
        sha256=row[4],
        bytes=row[5],
        state=ApprovalState(row[6]),
        created_at=row[7],
        expires_at=row[8],
        decided_by=row[9],
        decided_at=row[10],
        consumed_at=row[11],
        approvals=row[12],
        required=row[13],
        policy_hash=row[14],
        salt=row[16] or "",
    )


@dataclass(frozen=True)
class Vote:
    """One approver's decision on a record, as the policy decided it: enough to decide it again
    when the set changes before the report is written (names and the set's hash, no values)."""

    approver: Person  # in the record's tenant
    groups: tuple[str, ...]
    scopes: tuple[str, ...]
    required: int  # the distinct approvers the policy asked for, at this decision
    policy_hash: str


def vote_row(approval_id: str, vote: Vote, approve: bool, now: float) -> tuple[Any, ...]:
    """The `approval_votes` row of a vote (both stores; groups and scopes as JSON lists)."""
    return (approval_id, vote.approver.id, vote.approver.issuer, json.dumps(list(vote.groups)),
            json.dumps(list(vote.scopes)), approve, vote.required, vote.policy_hash, now)  # fmt: skip


def vote_from_row(row: Sequence[Any]) -> Vote:
    """A vote from (approver, issuer, groups, scopes, required, policy_hash)."""
    approver = Person(row[1], row[0])
    return Vote(approver, tuple(json.loads(row[2])), tuple(json.loads(row[3])), row[4], row[5])


VOTE_COLUMNS = "approver, issuer, groups, scopes, required, policy_hash"
# Bound (issuer, viewer, viewed_at, approval_id, tenant): one row per person and record (the
# first view), and none for another tenant's record.
INSERT_VIEW = (
    "INSERT INTO approval_views (approval_id, issuer, viewer, viewed_at) SELECT id, {p}, {p}, {p} "
    "FROM approvals WHERE id = {p} AND tenant = {p} ON CONFLICT DO NOTHING"
)
SEEN = "SELECT 1 FROM approval_views WHERE approval_id = {p} AND issuer = {p} AND viewer = {p}"


INSERT_VOTE = (
    "INSERT INTO approval_votes (approval_id, approver, issuer, groups, scopes, approve, required, "
    "policy_hash, decided_at) VALUES ({p}, {p}, {p}, {p}, {p}, {p}, {p}, {p}, {p})"
)


@dataclass(frozen=True)
class Claim:
    """Who takes an approval (`<replica>/<incarnation>`) and until when it may hold it unsent."""

    owner: str
    until: float


@dataclass(frozen=True)
class HeldClaim:
    """An approval consumed under a claim not yet confirmed: its write has not been sent."""

    approval_id: str
    tenant: str
    owner: str
    until: float


class ApprovalStore(Protocol):
    """Approval records of every tenant. Every read and change names the tenant it is for."""

    async def get(self, approval_id: str, tenant: str) -> Approval | None: ...

    async def detail(self, approval_id: str, tenant: str) -> ApprovalDetail | None: ...

    async def page(
        self, tenant: str, state: ApprovalState | None, *, limit: int, after: Position | None
    ) -> Page:
        """Records in `state` (None: any), newest first, filtered by the store, `limit` at most."""
        ...

    def pending_count(self) -> int:
        """Open approvals of all tenants, for the metrics gauge (called on the event loop: cheap)."""
        ...

    async def request(self, draft: Draft, *, ttl: float, max_pending: int) -> tuple[Approval, bool]:
        """The open approval for exactly this report, or a new pending one: (record, created).

        Raises TooManyPending when a new one would pass the tenant's cap.
        """
        ...

    async def decide(
        self, approval_id: str, *, tenant: str, vote: Vote, approve: bool, require_distinct: bool
    ) -> Approval | DecisionError:
        """Record one approver's decision, in one transaction (on every replica, one at a time
        per record): a "no" denies; a "yes" counts, and the record is approved when the distinct
        approvers who said yes reach the most any of their decisions asked for. An approver's
        second decision on it is ALREADY_DECIDED; a yes from an approver the content was never
        shown to (`viewed`) is CONTENT_NOT_VIEWED: what a person approves is what they read."""
        ...

    async def votes(self, approval_id: str, tenant: str) -> list[Vote]:
        """The approvers who said yes to a record, in the order they did."""
        ...

    async def viewed(self, approval_id: str, tenant: str, viewer: Person) -> None:
        """`viewer` was shown the record's content: from now on their yes may count. Nothing
        for another tenant's record (or none)."""
        ...

    async def reopen(
        self,
        approval_id: str,
        tenant: str,
        owner: str,
        *,
        consumed_at: float,
        keep: Sequence[Person],
        required: int,
    ) -> bool:
        """A consumption whose approval the policy in force no longer grants (the set changed
        since): back to pending with only the votes of `keep`, needing `required`, to collect
        decisions again. Conditional as `release` is; False if that consumption is gone."""
        ...

    async def consume(
        self, *, tenant: str, requester: Person, filename: str, sha256: str, claim: Claim
    ) -> Approval | None:
        """Take the approved record for exactly this report, once, under `claim`. None if
        there is none."""
        ...

    async def confirm(self, approval_id: str, tenant: str, owner: str, *, consumed_at: float) -> bool:
        """Make `owner`'s claim (its consumption at `consumed_at`) final, just before the write
        is sent (again on a resend: it is idempotent). False if the consumption is no longer
        that one (taken back: its time was up): the write must not be sent."""
        ...

    async def release(self, approval_id: str, tenant: str, owner: str, *, consumed_at: float) -> bool:
        """Give back a consumption whose write never reached the sandbox (refused or failed
        before it was sent): the human's decision stands for the client's retry. One
        conditional transition (that consumption by `owner` → approved), so only its own
        consumption is undone, once. The caller knows no byte was sent, so a confirmed one may
        be given back (a confirm whose answer the database's outage lost).

        Idempotent, and provable: the transition records the consumption it gave back (in
        `approval_releases`, in the same transaction), and a call for a consumption already
        given back by `owner` undoes nothing and answers True again. So a release whose commit
        landed but whose answer was lost (StoreUnavailable, the release owed) is told by its
        retry that it happened, and audited then: once, never zero times. False: the
        consumption was not `owner`'s to give (another's, taken back by another broker, or
        never made)."""
        ...

    async def claims(self, tenant: str | None, *, limit: int) -> list[HeldClaim]:
        """Unconfirmed claims, of `tenant` or of every tenant (None), oldest first."""
        ...

    async def held(self, draft: Draft) -> list[HeldClaim]:
        """Unconfirmed claims on exactly this report (tenant, requester, file name, sha256):
        while one is live, the human's approval is in a broker's hands, not gone."""
        ...

    async def revert(self, claim: HeldClaim) -> bool:
        """Take back a claim whose owner is dead or whose time is up (→ approved). Conditional
        on the claim being still exactly that one, so two brokers cannot both take it back."""
        ...

    async def denied(self, draft: Draft) -> Approval | None:
        """A human's unexpired "no" to exactly this report: asking again must not reopen it."""
        ...

    async def record_in_band(self, approval_id: str, draft: Draft, *, ttl: float, max_pending: int) -> None:
        """An in-band question is asked: a pending record under the same cap as out-of-band ones.

        Raises TooManyPending when the tenant's cap is reached.
        """
        ...

    async def answer_in_band(
        self, approval_id: str, *, tenant: str, approver: str, approve: bool, claim: Claim
    ) -> Approval | None:
        """Record the in-band answer and, on approve, consume at once under `claim`. None if
        already answered."""
        ...

    async def purge(self, *, closed_before: float) -> int:
        """Delete records that closed (expired, or consumed) before this time; how many went.

        Open records are never purged: a pending or approved one is open until it expires.
        """
        ...

    async def health(self) -> dict[str, object]:
        """For /readyz: the backend's name, and whether it answers now (a query, bounded)."""
        ...

    async def close(self) -> None: ...
