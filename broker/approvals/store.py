"""Approval records in SQLite: they survive a broker restart (DESIGN §4).

Every state change is one conditional UPDATE (`... WHERE state = 'pending'`), so two
humans clicking at once, or two retries racing, cannot both win: exactly one transition
happens and the loser sees the record as it now is.
"""

from __future__ import annotations

import secrets
import sqlite3
import time
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

from broker.types import ApprovalState

_SCHEMA = """
CREATE TABLE IF NOT EXISTS approvals (
    id          TEXT PRIMARY KEY,
    tenant      TEXT NOT NULL,
    requester   TEXT NOT NULL,
    filename    TEXT NOT NULL,
    sha256      TEXT NOT NULL,
    bytes       INTEGER NOT NULL,
    content     TEXT NOT NULL,
    state       TEXT NOT NULL,
    created_at  REAL NOT NULL,
    expires_at  REAL NOT NULL,
    decided_by  TEXT,
    decided_at  REAL,
    consumed_at REAL
);
CREATE INDEX IF NOT EXISTS approvals_lookup ON approvals (tenant, requester, filename, sha256, state);
"""


class DecisionError(StrEnum):
    """Why a decision was not recorded. Callers map these to HTTP statuses."""

    NOT_FOUND = "not_found"  # also: another tenant's record (no oracle for ids)
    NOT_PENDING = "not_pending"
    EXPIRED = "expired"
    SAME_PERSON = "approver_is_requester"


class TooManyPending(Exception):
    """The tenant has reached its cap of open approvals."""


@dataclass(frozen=True)
class Draft:
    """A report someone wants written: what a human approves, exactly."""

    tenant: str
    requester: str
    filename: str
    content: str
    sha256: str
    size: int


@dataclass(frozen=True)
class Approval:
    id: str
    tenant: str
    requester: str
    filename: str
    sha256: str
    bytes: int
    content: str  # shown to the approver; the tenant's data, kept in the broker's private data dir
    state: ApprovalState
    created_at: float
    expires_at: float
    decided_by: str | None
    decided_at: float | None
    consumed_at: float | None

    def public(self) -> dict[str, object]:
        """What the REST API and the approvals page show (to approvers of the same tenant)."""
        return {
            "approval_id": self.id,
            "state": self.state.value,
            "requester": self.requester,
            "filename": self.filename,
            "sha256": self.sha256,
            "bytes": self.bytes,
            "created_at": self.created_at,
            "expires_at": self.expires_at,
            "decided_by": self.decided_by,
        }

    def detail(self) -> dict[str, object]:
        """The record with the full content, for the human deciding on it."""
        return {**self.public(), "content": self.content}


class ApprovalStore:
    def __init__(self, path: Path, clock: Callable[[], float] = time.time) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self._db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        self._db.row_factory = sqlite3.Row
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=FULL")  # a decision that was shown as made must persist
        self._db.executescript(_SCHEMA)
        path.chmod(0o600)
        self._clock = clock

    def close(self) -> None:
        self._db.close()

    # -- reads ------------------------------------------------------------------------------

    def get(self, approval_id: str, tenant: str) -> Approval | None:
        row = self._db.execute(
            "SELECT * FROM approvals WHERE id = ? AND tenant = ?", (approval_id, tenant)
        ).fetchone()
        return self._expired_view(_row(row)) if row else None

    def list(self, tenant: str, state: ApprovalState | None = None, limit: int = 200) -> list[Approval]:
        rows = self._db.execute(
            "SELECT * FROM approvals WHERE tenant = ? ORDER BY created_at DESC LIMIT ?", (tenant, limit)
        ).fetchall()
        items = [self._expired_view(_row(r)) for r in rows]
        return [a for a in items if state is None or a.state is state]

    def pending_count(self) -> int:
        row = self._db.execute(
            "SELECT COUNT(*) FROM approvals WHERE state = 'pending' AND expires_at > ?", (self._clock(),)
        ).fetchone()
        return int(row[0])

    # -- transitions ------------------------------------------------------------------------

    def request(self, draft: Draft, *, ttl: float, max_pending: int) -> tuple[Approval, bool]:
        """The open approval for exactly this report, or a new pending one. Returns (record, created)."""
        now = self._clock()
        row = self._db.execute(
            "SELECT * FROM approvals WHERE tenant = ? AND requester = ? AND filename = ? AND sha256 = ? "
            "AND state IN ('pending', 'approved') AND expires_at > ? ORDER BY created_at DESC LIMIT 1",
            (draft.tenant, draft.requester, draft.filename, draft.sha256, now),
        ).fetchone()
        if row:
            return _row(row), False
        open_count = self._db.execute(
            "SELECT COUNT(*) FROM approvals WHERE tenant = ? AND state = 'pending' AND expires_at > ?",
            (draft.tenant, now),
        ).fetchone()[0]
        if open_count >= max_pending:
            raise TooManyPending
        approval_id = secrets.token_hex(16)
        self._insert_pending(approval_id, draft, now + ttl)
        created = self.get(approval_id, draft.tenant)
        assert created is not None
        return created, True

    def decide(
        self, approval_id: str, *, tenant: str, approver: str, approve: bool, require_distinct: bool
    ) -> Approval | DecisionError:
        current = self.get(approval_id, tenant)
        if current is None:
            return DecisionError.NOT_FOUND
        if current.state is ApprovalState.EXPIRED:
            return DecisionError.EXPIRED
        if current.state is not ApprovalState.PENDING:
            return DecisionError.NOT_PENDING
        if require_distinct and approver == current.requester:
            return DecisionError.SAME_PERSON
        new_state = ApprovalState.APPROVED if approve else ApprovalState.DENIED
        cur = self._db.execute(
            "UPDATE approvals SET state = ?, decided_by = ?, decided_at = ? "
            "WHERE id = ? AND tenant = ? AND state = 'pending' AND expires_at > ?",
            (new_state.value, approver, self._clock(), approval_id, tenant, self._clock()),
        )
        if cur.rowcount != 1:
            return DecisionError.NOT_PENDING
        decided = self.get(approval_id, tenant)
        assert decided is not None
        return decided

    def consume(self, *, tenant: str, requester: str, filename: str, sha256: str) -> Approval | None:
        """Take the approved record for exactly this report, once. None if there is none."""
        now = self._clock()
        row = self._db.execute(
            "SELECT id FROM approvals WHERE tenant = ? AND requester = ? AND filename = ? AND sha256 = ? "
            "AND state = 'approved' AND expires_at > ? ORDER BY created_at LIMIT 1",
            (tenant, requester, filename, sha256, now),
        ).fetchone()
        if row is None:
            return None
        cur = self._db.execute(
            "UPDATE approvals SET state = 'consumed', consumed_at = ? WHERE id = ? AND state = 'approved'",
            (now, row["id"]),
        )
        if cur.rowcount != 1:
            return None  # a concurrent retry won the race
        return self.get(row["id"], tenant)

    def release(self, approval_id: str, tenant: str) -> bool:
        """Give back a consumed approval whose write never reached the sandbox (refused or
        failed before it was sent): the human's decision stands for the client's retry. One
        conditional update, so only a consumption can be undone, and only once."""
        cur = self._db.execute(
            "UPDATE approvals SET state = 'approved', consumed_at = NULL "
            "WHERE id = ? AND tenant = ? AND state = 'consumed'",
            (approval_id, tenant),
        )
        return cur.rowcount == 1

    def denied(self, draft: Draft) -> Approval | None:
        """A human's unexpired "no" to exactly this report: asking again must not reopen it."""
        row = self._db.execute(
            "SELECT * FROM approvals WHERE tenant = ? AND requester = ? AND filename = ? AND sha256 = ? "
            "AND state = 'denied' AND expires_at > ? ORDER BY decided_at DESC LIMIT 1",
            (draft.tenant, draft.requester, draft.filename, draft.sha256, self._clock()),
        ).fetchone()
        return _row(row) if row else None

    def record_in_band(self, approval_id: str, draft: Draft, *, ttl: float) -> None:
        """An in-band question was asked: remember it as pending so its answer counts once."""
        self._insert_pending(approval_id, draft, self._clock() + ttl)

    def answer_in_band(
        self, approval_id: str, *, tenant: str, approver: str, approve: bool
    ) -> Approval | None:
        """Record the in-band answer and, on approve, consume at once. None if already answered."""
        now = self._clock()
        new_state = ApprovalState.CONSUMED if approve else ApprovalState.DENIED
        cur = self._db.execute(
            "UPDATE approvals SET state = ?, decided_by = ?, decided_at = ?, consumed_at = ? "
            "WHERE id = ? AND tenant = ? AND state = 'pending' AND expires_at > ?",
            (new_state.value, approver, now, now if approve else None, approval_id, tenant, now),
        )
        return self.get(approval_id, tenant) if cur.rowcount == 1 else None

    def _insert_pending(self, approval_id: str, draft: Draft, expires_at: float) -> None:
        self._db.execute(
            "INSERT INTO approvals (id, tenant, requester, filename, sha256, bytes, content, state, "
            "created_at, expires_at) VALUES (?, ?, ?, ?, ?, ?, ?, 'pending', ?, ?)",
            (approval_id, draft.tenant, draft.requester, draft.filename, draft.sha256, draft.size,
             draft.content, self._clock(), expires_at),
        )  # fmt: skip

    def _expired_view(self, approval: Approval) -> Approval:
        if (
            approval.state in (ApprovalState.PENDING, ApprovalState.APPROVED)
            and approval.expires_at <= self._clock()
        ):
            return _replace_state(approval, ApprovalState.EXPIRED)
        return approval


def _row(row: sqlite3.Row) -> Approval:
    return Approval(
        id=row["id"],
        tenant=row["tenant"],
        requester=row["requester"],
        filename=row["filename"],
        sha256=row["sha256"],
        bytes=row["bytes"],
        content=row["content"],
        state=ApprovalState(row["state"]),
        created_at=row["created_at"],
        expires_at=row["expires_at"],
        decided_by=row["decided_by"],
        decided_at=row["decided_at"],
        consumed_at=row["consumed_at"],
    )


def _replace_state(approval: Approval, state: ApprovalState) -> Approval:
    from dataclasses import replace

    return replace(approval, state=state)
