# Over 450 lines: one class, every ApprovalStore method in SQLite.
"""The embedded `ApprovalStore`: SQLite in the broker's data dir, survives a restart.

SQLite calls block. They run on one worker thread, never on the event loop, so a slow
query or a large record makes no other tenant's call wait. One thread also keeps every
operation whole: a check-then-insert (the pending cap) cannot interleave with another.
Each multi-statement operation is also one `BEGIN IMMEDIATE` transaction, for any other
process that opens the same file. The schema is versioned (`broker.approvals.migrations`).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import secrets
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

from broker.approvals import migrations
from broker.approvals.store import (
    INSERT_VIEW,
    INSERT_VOTE,
    META_COLUMNS,
    REQUESTER_IS,
    SEEN,
    VOTE_COLUMNS,
    Approval,
    ApprovalDetail,
    Claim,
    DecisionError,
    Draft,
    HeldClaim,
    Page,
    Position,
    TooManyPending,
    Vote,
    approval_from_row,
    refusal,
    requester_params,
    select,
    state_filter,
    vote_from_row,
    vote_row,
)
from broker.types import ApprovalState, Person

_PURGE_BATCH = 500  # rows per DELETE: the metrics gauge never waits on one long purge
_REQUESTER = REQUESTER_IS.format(p="?")

T = TypeVar("T")


class SqliteApprovalStore:
    def __init__(self, path: Path, clock: Callable[[], float] = time.time) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        # Used by the worker thread and (for the metrics gauge only) the event loop: the lock
        # keeps them from sharing the connection at the same moment.
        self._db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        self._db.row_factory = sqlite3.Row
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=FULL")
        self._db.execute(
            "PRAGMA foreign_keys=ON"
        )  # a purged record takes its votes with it  # a decision that was shown as made must persist
        try:
            # This file is the one broker's own: it upgrades it; a schema from a newer broker
            # is refused (SchemaMismatch), never written to.
            migrations.upgrade_sqlite(self._db)
        except BaseException:
            self._db.close()
            raise
        path.chmod(0o600)
        self._lock = threading.Lock()
        self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="approvals-store")
        self._clock = clock

    async def _run(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        call = functools.partial(self._locked, fn, *args, **kwargs)
        return await asyncio.get_running_loop().run_in_executor(self._worker, call)

    def _locked(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        with self._lock:
            return fn(*args, **kwargs)

    async def health(self) -> dict[str, object]:
        return {"backend": "sqlite", "reachable": True}  # a file of this broker's own

    async def call(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        """`fn(connection)` on the store's one worker, whole: for the approvers' sign-in
        sessions, which live in this file too (broker/web/approver_sessions.py)."""
        return await self._run(fn, self._db)

    async def close(self) -> None:
        await self._run(self._db.close)
        self._worker.shutdown(wait=True)

    # -- reads ------------------------------------------------------------------------------

    async def get(self, approval_id: str, tenant: str) -> Approval | None:
        return await self._run(self._get, approval_id, tenant)

    async def detail(self, approval_id: str, tenant: str) -> ApprovalDetail | None:
        return await self._run(self._detail, approval_id, tenant)

    async def page(
        self, tenant: str, state: ApprovalState | None, *, limit: int, after: Position | None
    ) -> Page:
        return await self._run(self._page, tenant, state, limit, after)

    def pending_count(self) -> int:
        with self._lock:
            row = self._db.execute(
                "SELECT COUNT(*) FROM approvals WHERE state = 'pending' AND expires_at > ?", (self._clock(),)
            ).fetchone()
        return int(row[0])

    async def denied(self, draft: Draft) -> Approval | None:
        return await self._run(self._denied, draft)

    # -- transitions ------------------------------------------------------------------------

    async def request(self, draft: Draft, *, ttl: float, max_pending: int) -> tuple[Approval, bool]:
        return await self._run(self._request, draft, ttl, max_pending)

    async def decide(
        self, approval_id: str, *, tenant: str, vote: Vote, approve: bool, require_distinct: bool
    ) -> Approval | DecisionError:
        return await self._run(self._decide, approval_id, tenant, vote, approve, require_distinct)

    async def votes(self, approval_id: str, tenant: str) -> list[Vote]:
        return await self._run(self._votes, approval_id, tenant)

    async def viewed(self, approval_id: str, tenant: str, viewer: Person) -> None:
        params = (viewer.issuer, viewer.id, self._clock(), approval_id, tenant)
        await self._run(self._db.execute, INSERT_VIEW.format(p="?"), params)

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
        return await self._run(self._reopen, approval_id, tenant, owner, consumed_at, keep, required)

    async def consume(
        self, *, tenant: str, requester: Person, filename: str, sha256: str, claim: Claim
    ) -> Approval | None:
        return await self._run(self._consume, tenant, requester, filename, sha256, claim)

    async def confirm(self, approval_id: str, tenant: str, owner: str, *, consumed_at: float) -> bool:
        return await self._run(self._confirm, approval_id, tenant, owner, consumed_at)

    async def release(self, approval_id: str, tenant: str, owner: str, *, consumed_at: float) -> bool:
        return await self._run(self._release, approval_id, tenant, owner, consumed_at)

    async def claims(self, tenant: str | None, *, limit: int) -> list[HeldClaim]:
        return await self._run(self._claims, tenant, limit)

    async def held(self, draft: Draft) -> list[HeldClaim]:
        return await self._run(self._held, draft)

    async def revert(self, claim: HeldClaim) -> bool:
        return await self._run(self._revert, claim)

    async def record_in_band(self, approval_id: str, draft: Draft, *, ttl: float, max_pending: int) -> None:
        await self._run(self._record_in_band, approval_id, draft, ttl, max_pending)

    async def answer_in_band(
        self, approval_id: str, *, tenant: str, approver: str, approve: bool, claim: Claim
    ) -> Approval | None:
        return await self._run(self._answer_in_band, approval_id, tenant, approver, approve, claim)

    async def purge(self, *, closed_before: float) -> int:
        total = 0
        while True:  # in batches, each its own turn on the worker and under the lock
            deleted = await self._run(self._purge_batch, closed_before)
            total += deleted
            if deleted < _PURGE_BATCH:
                return total

    # -- on the worker thread ---------------------------------------------------------------

    def _get(self, approval_id: str, tenant: str) -> Approval | None:
        row = self._db.execute(
            select(META_COLUMNS, "WHERE id = ? AND tenant = ?"), (approval_id, tenant)
        ).fetchone()
        return approval_from_row(row).as_of(self._clock()) if row else None

    def _detail(self, approval_id: str, tenant: str) -> ApprovalDetail | None:
        row = self._db.execute(
            select(META_COLUMNS + ", content", "WHERE id = ? AND tenant = ?"), (approval_id, tenant)
        ).fetchone()
        return ApprovalDetail(approval_from_row(row).as_of(self._clock()), row["content"]) if row else None

    def _page(self, tenant: str, state: ApprovalState | None, limit: int, after: Position | None) -> Page:
        now = self._clock()
        where = ["tenant = :tenant"]
        if state is not None:
            where.append(f"({state_filter(state, ':now')})")
        if after is not None:
            where.append("(created_at < :at OR (created_at = :at AND id < :id))")
        params = {"tenant": tenant, "now": now, "limit": limit + 1}
        if after is not None:
            params.update(at=after.created_at, id=after.id)
        order = "ORDER BY created_at DESC, id DESC LIMIT :limit"
        sql = select(META_COLUMNS, f"WHERE {' AND '.join(where)} {order}")
        rows = self._db.execute(sql, params).fetchall()
        items = [approval_from_row(r).as_of(now) for r in rows[:limit]]
        more = len(rows) > limit
        return Page(items, Position(items[-1].created_at, items[-1].id) if more else None)

    def _denied(self, draft: Draft) -> Approval | None:
        row = self._db.execute(
            select(
                META_COLUMNS,
                f"WHERE tenant = ? AND {_REQUESTER} AND filename = ? AND sha256 = ? "
                "AND state = 'denied' AND expires_at > ? ORDER BY decided_at DESC LIMIT 1",
            ),
            (draft.tenant, *requester_params(draft.requester), draft.filename, draft.sha256, self._clock()),
        ).fetchone()
        return approval_from_row(row) if row else None

    def _request(self, draft: Draft, ttl: float, max_pending: int) -> tuple[Approval, bool]:
        with self._transaction():
            now = self._clock()
            row = self._db.execute(
                select(
                    META_COLUMNS,
                    f"WHERE tenant = ? AND {_REQUESTER} AND filename = ? AND sha256 = ? "
                    "AND state IN ('pending', 'approved') AND expires_at > ? "
                    "ORDER BY created_at DESC LIMIT 1",
                ),
                (draft.tenant, *requester_params(draft.requester), draft.filename, draft.sha256, now),
            ).fetchone()
            if row:
                return approval_from_row(row), False
            approval_id = secrets.token_hex(16)
            self._insert_pending(approval_id, draft, now, ttl, max_pending)
        created = self._get(approval_id, draft.tenant)
        assert created is not None
        return created, True

    def _record_in_band(self, approval_id: str, draft: Draft, ttl: float, max_pending: int) -> None:
        with self._transaction():
            self._insert_pending(approval_id, draft, self._clock(), ttl, max_pending)

    def _insert_pending(
        self, approval_id: str, draft: Draft, now: float, ttl: float, max_pending: int
    ) -> None:
        # The one cap: every pending record counts, whichever way its human will answer.
        open_count = self._db.execute(
            "SELECT COUNT(*) FROM approvals WHERE tenant = ? AND state = 'pending' AND expires_at > ?",
            (draft.tenant, now),
        ).fetchone()[0]
        if open_count >= max_pending:
            raise TooManyPending
        self._db.execute(
            "INSERT INTO approvals (id, tenant, requester, requester_issuer, filename, sha256, bytes, "
            "content, salt, state, created_at, expires_at) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, 'pending', ?, ?)",
            (approval_id, draft.tenant, draft.requester.id, draft.requester.issuer, draft.filename,
             draft.sha256, draft.size, draft.content, draft.salt, now, now + ttl),
        )  # fmt: skip

    def _decide(
        self, approval_id: str, tenant: str, vote: Vote, approve: bool, require_distinct: bool
    ) -> Approval | DecisionError:
        with self._transaction():
            current = self._get(approval_id, tenant)
            refused = refusal(current, vote.approver, require_distinct)
            if refused is not None or current is None:
                return refused or DecisionError.NOT_FOUND
            seen = (approval_id, vote.approver.issuer, vote.approver.id)
            if approve and self._db.execute(SEEN.format(p="?"), seen).fetchone() is None:
                return DecisionError.CONTENT_NOT_VIEWED
            now = self._clock()
            try:
                self._db.execute(INSERT_VOTE.format(p="?"), vote_row(approval_id, vote, approve, now))
            except sqlite3.IntegrityError:  # the key: one decision per approver
                return DecisionError.ALREADY_DECIDED
            yes, required = self._db.execute(
                "SELECT COUNT(*), COALESCE(MAX(required), 1) FROM approval_votes "
                "WHERE approval_id = ? AND approve",
                (approval_id,),
            ).fetchone()
            # The record's count stands too: a reopen set it, for the set in force (`reopen`).
            required = max(required, current.required)
            state = "denied" if not approve else "approved" if yes >= required else "pending"
            self._db.execute(
                "UPDATE approvals SET state = ?, decided_by = ?, decided_at = ?, approvals = ?, "
                "required = ?, policy_hash = ? WHERE id = ? AND tenant = ? AND state = 'pending'",
                (state, vote.approver.id, now, yes, required,
                 vote.policy_hash if state == "approved" else None, approval_id, tenant),
            )  # fmt: skip
        decided = self._get(approval_id, tenant)
        assert decided is not None
        return decided

    def _votes(self, approval_id: str, tenant: str) -> list[Vote]:
        rows = self._db.execute(
            f"SELECT {VOTE_COLUMNS} FROM approval_votes WHERE approve AND approval_id = "  # noqa: S608
            "(SELECT id FROM approvals WHERE id = ? AND tenant = ?) ORDER BY decided_at",
            (approval_id, tenant),
        ).fetchall()
        return [vote_from_row(tuple(r)) for r in rows]

    def _reopen(
        self,
        approval_id: str,
        tenant: str,
        owner: str,
        consumed_at: float,
        keep: Sequence[Person],
        required: int,
    ) -> bool:
        with self._transaction():
            cur = self._db.execute(
                "UPDATE approvals SET state = 'pending', consumed_at = NULL, claimed_by = NULL, "
                "claim_until = NULL, decided_by = NULL, decided_at = NULL, policy_hash = NULL, "
                "approvals = ?, required = ? WHERE id = ? AND tenant = ? AND state = 'consumed' "
                "AND claimed_by = ? AND consumed_at = ?",
                (len(keep), required, approval_id, tenant, owner, consumed_at),
            )
            if cur.rowcount != 1:
                return False
            votes = self._db.execute(
                "SELECT issuer, approver FROM approval_votes WHERE approval_id = ?", (approval_id,)
            ).fetchall()
            for issuer, approver in votes:  # a vote is its person's: kept or not as a pair
                if Person(issuer, approver) not in keep:
                    self._db.execute(
                        "DELETE FROM approval_votes WHERE approval_id = ? AND issuer = ? AND approver = ?",
                        (approval_id, issuer, approver),
                    )
            # The kept votes were decided again: the count they now ask for is the reopen's,
            # not the one they asked when cast (`_decide` takes the most of the votes').
            self._db.execute(
                "UPDATE approval_votes SET required = ? WHERE approval_id = ?", (required, approval_id)
            )
        return True

    def _consume(
        self, tenant: str, requester: Person, filename: str, sha256: str, claim: Claim
    ) -> Approval | None:
        now = self._clock()
        row = self._db.execute(
            f"SELECT id FROM approvals WHERE tenant = ? AND {_REQUESTER} AND filename = ? AND sha256 = ? "  # noqa: S608
            "AND state = 'approved' AND expires_at > ? ORDER BY created_at LIMIT 1",
            (tenant, *requester_params(requester), filename, sha256, now),
        ).fetchone()
        if row is None:
            return None
        cur = self._db.execute(
            "UPDATE approvals SET state = 'consumed', consumed_at = ?, claimed_by = ?, claim_until = ? "
            "WHERE id = ? AND state = 'approved'",
            (now, claim.owner, claim.until, row["id"]),
        )
        if cur.rowcount != 1:
            return None  # another process's retry won the race
        return self._get(row["id"], tenant)

    def _confirm(self, approval_id: str, tenant: str, owner: str, consumed_at: float) -> bool:
        cur = self._db.execute(
            "UPDATE approvals SET claim_until = NULL WHERE id = ? AND tenant = ? "
            "AND state = 'consumed' AND claimed_by = ? AND consumed_at = ?",
            (approval_id, tenant, owner, consumed_at),
        )
        return cur.rowcount == 1

    def _release(self, approval_id: str, tenant: str, owner: str, consumed_at: float) -> bool:
        with self._transaction():  # the transition and its record, together
            cur = self._db.execute(
                "UPDATE approvals SET state = 'approved', consumed_at = NULL, claimed_by = NULL, "
                "claim_until = NULL WHERE id = ? AND tenant = ? AND state = 'consumed' AND claimed_by = ? "
                "AND consumed_at = ?",
                (approval_id, tenant, owner, consumed_at),
            )
            if cur.rowcount == 1:
                self._db.execute(
                    "INSERT INTO approval_releases (approval_id, owner, consumed_at, released_at) "
                    "VALUES (?, ?, ?, ?) ON CONFLICT (approval_id, owner, consumed_at) "
                    "DO UPDATE SET released_at = excluded.released_at",
                    (approval_id, owner, consumed_at, self._clock()),
                )
                return True
            # Given back already by this owner (an earlier call whose caller never heard)?
            before = self._db.execute(
                "SELECT 1 FROM approval_releases r JOIN approvals a ON a.id = r.approval_id "
                "WHERE r.approval_id = ? AND a.tenant = ? AND r.owner = ? AND r.consumed_at = ?",
                (approval_id, tenant, owner, consumed_at),
            ).fetchone()
            return before is not None

    def _held(self, draft: Draft) -> list[HeldClaim]:
        rows = self._db.execute(
            f"SELECT id, tenant, claimed_by, claim_until FROM approvals WHERE tenant = ? AND {_REQUESTER} "  # noqa: S608
            "AND filename = ? AND sha256 = ? AND state = 'consumed' AND claim_until IS NOT NULL "
            "ORDER BY claim_until",
            (draft.tenant, *requester_params(draft.requester), draft.filename, draft.sha256),
        ).fetchall()
        return [HeldClaim(r[0], r[1], r[2], r[3]) for r in rows]

    def _claims(self, tenant: str | None, limit: int) -> list[HeldClaim]:
        rows = self._db.execute(
            "SELECT id, tenant, claimed_by, claim_until FROM approvals WHERE claim_until IS NOT NULL "
            "AND state = 'consumed' AND (? IS NULL OR tenant = ?) ORDER BY claim_until LIMIT ?",
            (tenant, tenant, limit),
        ).fetchall()
        return [HeldClaim(r[0], r[1], r[2], r[3]) for r in rows]

    def _revert(self, claim: HeldClaim) -> bool:
        cur = self._db.execute(
            "UPDATE approvals SET state = 'approved', consumed_at = NULL, claimed_by = NULL, "
            "claim_until = NULL WHERE id = ? AND tenant = ? AND state = 'consumed' "
            "AND claimed_by = ? AND claim_until = ?",
            (claim.approval_id, claim.tenant, claim.owner, claim.until),
        )
        return cur.rowcount == 1

    def _answer_in_band(
        self, approval_id: str, tenant: str, approver: str, approve: bool, claim: Claim
    ) -> Approval | None:
        now = self._clock()
        new_state = ApprovalState.CONSUMED if approve else ApprovalState.DENIED
        cur = self._db.execute(
            "UPDATE approvals SET state = ?, decided_by = ?, decided_at = ?, consumed_at = ?, "
            "claimed_by = ?, claim_until = ? "
            "WHERE id = ? AND tenant = ? AND state = 'pending' AND expires_at > ?",
            (new_state.value, approver, now, now if approve else None,
             claim.owner if approve else None, claim.until if approve else None,
             approval_id, tenant, now),
        )  # fmt: skip
        return self._get(approval_id, tenant) if cur.rowcount == 1 else None

    def _purge_batch(self, closed_before: float) -> int:
        # A denial stands until its expiry (asking again must not reopen it): it closes then.
        cur = self._db.execute(
            "DELETE FROM approvals WHERE id IN (SELECT id FROM approvals WHERE expires_at < :t "
            "OR (state = 'consumed' AND consumed_at < :t) LIMIT :n)",
            {"t": closed_before, "n": _PURGE_BATCH},
        )
        return cur.rowcount

    @contextlib.contextmanager
    def _transaction(self) -> Iterator[None]:
        """BEGIN IMMEDIATE ... COMMIT; ROLLBACK on any exception, TooManyPending included."""
        self._db.execute("BEGIN IMMEDIATE")
        try:
            yield
        except BaseException:
            self._db.execute("ROLLBACK")
            raise
        self._db.execute("COMMIT")
