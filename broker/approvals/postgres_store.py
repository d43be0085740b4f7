# Over 450 lines: one class, every ApprovalStore method in PostgreSQL's dialect, each one transaction.
"""The shared `ApprovalStore`: PostgreSQL, for replicas that serve any request (DESIGN §9).

psycopg 3, async, with a psycopg_pool pool: nothing here blocks the event loop, and no
SQLAlchemy, since every statement is a hand-written conditional transition whose SQL is the
point (one dialect; the SQLite twin keeps the same statements side by side).

Across replicas:
- consumption is one `UPDATE … WHERE state = 'approved' … RETURNING`: the row lock makes a
  second consumer re-check the condition after the first commits, so it finds nothing;
- decisions are `UPDATE … WHERE state = 'pending'`: the first commits, the rest see it decided;
- the pending cap (and "one open approval per report") is a count and an insert under a
  per-tenant advisory transaction lock. Chosen over SERIALIZABLE: it blocks only the same
  tenant's requests for one short transaction and never aborts, where SERIALIZABLE would fail
  a racing request and need a retry loop (and could abort unrelated tenants' inserts on
  predicate conflicts);
- retention: any replica may purge; batches skip rows another purge holds, so each row is
  deleted and counted once.

Failure: every operation gets a connection within `pool_timeout` and runs under a
server-side `statement_timeout` and a client-side deadline; any database error becomes
`StoreUnavailable` with a fixed message (psycopg's texts can carry a host or a DSN). The
pool checks a connection before lending it (unless it answered within the last second:
`_Freshness`) and reconnects in the background, so the store recovers by itself when the
server is back.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import secrets
import time
import weakref
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

import psycopg
from psycopg.conninfo import conninfo_to_dict
from psycopg_pool import AsyncConnectionPool

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
    StoreUnavailable,
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
from broker.settings import DatabaseSettings
from broker.types import ApprovalState, Person

log = logging.getLogger("docbroker")

_PURGE_BATCH = 500
_REQUESTER = REQUESTER_IS.format(p="%s")
# The pending gauge is a cached count: `pending_count()` is called on the event loop and
# must not wait for a database; a few seconds old is fine for a gauge.
_GAUGE_REFRESH_SECONDS = 5.0
# A replacement connection is retried with backoff for this long; after that the next
# request tries afresh. So the store is back at most about this long after the server is.
_RECONNECT_SECONDS = 5.0


# A connection that answered this recently is lent without the pool's check (an empty query:
# one round trip more for every operation, several per request). Within a request's operations,
# or back-to-back requests, it answered milliseconds ago; one idle longer is checked as before,
# so a pool left over from before a server restart is still weeded out before it is lent. A
# connection that broke inside the window fails its operation: StoreUnavailable, fail-closed,
# as if it had broken just after a check; the pool discards it.
_FRESH_SECONDS = 1.0


class _Freshness:
    """The pool's `check` and `reset` callbacks: when each connection last answered."""

    def __init__(self, seconds: float = _FRESH_SECONDS) -> None:
        self._seconds = seconds
        self._answered: weakref.WeakKeyDictionary[psycopg.AsyncConnection[Any], float] = (
            weakref.WeakKeyDictionary()
        )

    def answered(self, conn: psycopg.AsyncConnection[Any]) -> None:
        # Marked by the store after an operation that ended without a database error, just
        # before the connection goes back. (Not the pool's `reset` callback: with one, the pool
        # returns every connection through a background task, which costs more than the check.)
        self._answered[conn] = time.monotonic()

    async def check(self, conn: psycopg.AsyncConnection[Any]) -> None:
        answered = self._answered.pop(conn, None)
        if answered is not None and time.monotonic() - answered < self._seconds and not conn.closed:
            return
        await AsyncConnectionPool.check_connection(conn)


def _returning(statement: str) -> str:
    return f"{statement} RETURNING {META_COLUMNS}"


def connection_kwargs(settings: DatabaseSettings) -> dict[str, Any]:
    """The URL's parameters plus ours; the statement timeout is set for every session."""
    assert settings.url is not None
    try:
        params: dict[str, Any] = conninfo_to_dict(settings.url)
    except psycopg.Error:
        raise StoreUnavailable from None
    millis = math.ceil(settings.statement_timeout_seconds * 1000)
    ours = f"-c statement_timeout={millis} -c idle_in_transaction_session_timeout={millis * 5}"
    params["options"] = f"{params.get('options', '')} {ours}".strip()
    params["connect_timeout"] = max(2, math.ceil(settings.pool_timeout_seconds))
    params.setdefault("application_name", "docbroker")
    params["autocommit"] = True  # one statement, one round trip; transactions are explicit
    return params


class PostgresApprovalStore:
    def __init__(
        self,
        pool: AsyncConnectionPool[Any],
        settings: DatabaseSettings,
        clock: Callable[[], float] = time.time,
        freshness: _Freshness | None = None,
    ) -> None:
        self._pool = pool
        self._clock = clock
        self._freshness = freshness or _Freshness()
        # Bounds a whole operation, even against a server that stopped answering at all.
        self._deadline = settings.pool_timeout_seconds + settings.statement_timeout_seconds + 1.0
        self._pending = 0
        self._up = True
        self._gauge: asyncio.Task[None] | None = None

    @classmethod
    async def open(
        cls, settings: DatabaseSettings, *, clock: Callable[[], float] = time.time, check_schema: bool = True
    ) -> PostgresApprovalStore:
        """Connect, and (unless told otherwise) refuse a schema other than `migrations.LATEST`.

        Raises StoreUnavailable (cannot connect) or SchemaMismatch (what to run)."""
        freshness = _Freshness()
        pool: AsyncConnectionPool[Any] = AsyncConnectionPool(
            kwargs=connection_kwargs(settings),
            min_size=settings.pool_min,
            max_size=settings.pool_max,
            timeout=settings.pool_timeout_seconds,
            check=freshness.check,
            reconnect_timeout=_RECONNECT_SECONDS,
            name="approvals",
            open=False,
        )
        store = cls(pool, settings, clock, freshness)
        try:
            try:
                await pool.open(wait=settings.pool_min > 0, timeout=settings.pool_timeout_seconds + 3)
            except psycopg.Error:
                raise StoreUnavailable from None
            if check_schema:
                async with store._conn() as conn:
                    version = await migrations.postgres_version(conn)
                migrations.check(version)
                await store._refresh_pending()
                store._gauge = asyncio.create_task(store._keep_gauge())
        except BaseException:
            await pool.close()
            raise
        return store

    async def close(self) -> None:
        if self._gauge is not None:
            self._gauge.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._gauge
        await self._pool.close()

    @contextlib.asynccontextmanager
    async def _conn(self) -> AsyncIterator[psycopg.AsyncConnection[Any]]:
        """A pooled connection for one operation; any database failure → StoreUnavailable."""
        try:
            async with asyncio.timeout(self._deadline), self._pool.connection() as conn:
                yield conn
                self._freshness.answered(conn)
        except (psycopg.Error, TimeoutError, OSError) as exc:
            if self._up:
                self._up = False
                log.warning("approvals database unavailable", extra={"error": type(exc).__name__})
            raise StoreUnavailable from None
        if not self._up:
            self._up = True
            log.warning("approvals database reachable again")

    def connection(self) -> contextlib.AbstractAsyncContextManager[psycopg.AsyncConnection[Any]]:
        """A pooled connection for one operation (failures → StoreUnavailable): for the
        approvers' sign-in sessions, shared by replicas in this database (broker/web/approver_sessions.py)."""
        return self._conn()

    async def _one(self, sql: str, params: Any) -> tuple[Any, ...] | None:
        async with self._conn() as conn:
            cur = await conn.execute(sql, params)
            row: tuple[Any, ...] | None = await cur.fetchone()
            return row

    # -- schema -----------------------------------------------------------------------------

    async def health(self) -> dict[str, object]:
        try:
            reachable = await self._one("SELECT 1", ()) == (1,)
        except StoreUnavailable:
            reachable = False
        return {"backend": "postgresql", "reachable": reachable}

    async def schema_version(self) -> int:
        async with self._conn() as conn:
            return await migrations.postgres_version(conn)

    async def upgrade(self) -> list[int]:
        async with self._conn() as conn:
            return await migrations.upgrade_postgres(conn)

    # -- reads ------------------------------------------------------------------------------

    async def get(self, approval_id: str, tenant: str) -> Approval | None:
        row = await self._one(select(META_COLUMNS, "WHERE id = %s AND tenant = %s"), (approval_id, tenant))
        return approval_from_row(row).as_of(self._clock()) if row else None

    async def detail(self, approval_id: str, tenant: str) -> ApprovalDetail | None:
        row = await self._one(
            select(META_COLUMNS + ", content", "WHERE id = %s AND tenant = %s"), (approval_id, tenant)
        )
        return ApprovalDetail(approval_from_row(row).as_of(self._clock()), row[-1]) if row else None

    async def page(
        self, tenant: str, state: ApprovalState | None, *, limit: int, after: Position | None
    ) -> Page:
        now = self._clock()
        where = ["tenant = %(tenant)s"]
        params: dict[str, Any] = {"tenant": tenant, "now": now, "limit": limit + 1}
        if state is not None:
            where.append(f"({state_filter(state, '%(now)s')})")
        if after is not None:
            where.append("(created_at < %(at)s OR (created_at = %(at)s AND id < %(id)s))")
            params.update(at=after.created_at, id=after.id)
        order = "ORDER BY created_at DESC, id DESC LIMIT %(limit)s"
        sql = select(META_COLUMNS, f"WHERE {' AND '.join(where)} {order}")
        async with self._conn() as conn:
            cur = await conn.execute(sql, params)
            rows = await cur.fetchall()
        items = [approval_from_row(r).as_of(now) for r in rows[:limit]]
        more = len(rows) > limit
        return Page(items, Position(items[-1].created_at, items[-1].id) if more else None)

    def pending_count(self) -> int:
        return self._pending

    async def _refresh_pending(self) -> None:
        row = await self._one(
            "SELECT COUNT(*) FROM approvals WHERE state = 'pending' AND expires_at > %s", (self._clock(),)
        )
        self._pending = int(row[0]) if row else 0

    async def _keep_gauge(self) -> None:
        while True:
            await asyncio.sleep(_GAUGE_REFRESH_SECONDS)
            with contextlib.suppress(StoreUnavailable):  # the last known value stands meanwhile
                await self._refresh_pending()

    async def denied(self, draft: Draft) -> Approval | None:
        row = await self._one(
            select(
                META_COLUMNS,
                f"WHERE tenant = %s AND {_REQUESTER} AND filename = %s AND sha256 = %s "
                "AND state = 'denied' AND expires_at > %s ORDER BY decided_at DESC LIMIT 1",
            ),
            (draft.tenant, *requester_params(draft.requester), draft.filename, draft.sha256, self._clock()),
        )
        return approval_from_row(row) if row else None

    # -- transitions ------------------------------------------------------------------------

    async def request(self, draft: Draft, *, ttl: float, max_pending: int) -> tuple[Approval, bool]:
        async with self._conn() as conn, conn.pipeline(), conn.transaction():
            now = self._clock()
            existing, pending = await self._under_tenant_lock(conn, draft, now)
            if existing is not None:
                return existing, False
            return await self._insert_pending(
                conn, secrets.token_hex(16), draft, now, ttl, pending, max_pending
            ), True

    async def record_in_band(self, approval_id: str, draft: Draft, *, ttl: float, max_pending: int) -> None:
        async with self._conn() as conn, conn.pipeline(), conn.transaction():
            now = self._clock()
            _, pending = await self._under_tenant_lock(conn, draft, now)
            await self._insert_pending(conn, approval_id, draft, now, ttl, pending, max_pending)

    async def _under_tenant_lock(
        self, conn: psycopg.AsyncConnection[Any], draft: Draft, now: float
    ) -> tuple[Approval | None, int]:
        """Take the tenant's lock, then read (the open record for this report, pending count).

        The lock is held to the end of the transaction: other replicas' count-then-insert for
        this tenant waits for it, so the cap holds across them (a hash collision between two
        tenants only makes them take turns). The reads are statements of their own, after the
        lock, so they see what the previous holder committed. In a pipeline: one round trip.
        """
        await conn.execute(
            "SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))", ("docbroker/approvals/" + draft.tenant,)
        )
        found = await conn.execute(
            select(
                META_COLUMNS,
                f"WHERE tenant = %s AND {_REQUESTER} AND filename = %s AND sha256 = %s "
                "AND state IN ('pending', 'approved') AND expires_at > %s "
                "ORDER BY created_at DESC LIMIT 1",
            ),
            (draft.tenant, *requester_params(draft.requester), draft.filename, draft.sha256, now),
        )
        counted = await conn.execute(
            "SELECT COUNT(*) FROM approvals WHERE tenant = %s AND state = 'pending' AND expires_at > %s",
            (draft.tenant, now),
        )
        row = await found.fetchone()
        count = await counted.fetchone()
        return (approval_from_row(row) if row else None), (int(count[0]) if count else 0)

    @staticmethod
    async def _insert_pending(
        conn: psycopg.AsyncConnection[Any],
        approval_id: str,
        draft: Draft,
        now: float,
        ttl: float,
        pending: int,
        max_pending: int,
    ) -> Approval:
        # The one cap: every pending record counts, whichever way its human will answer.
        if pending >= max_pending:
            raise TooManyPending
        await conn.execute(
            "INSERT INTO approvals (id, tenant, requester, requester_issuer, filename, sha256, bytes, "
            "content, salt, state, created_at, expires_at) "
            "VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, 'pending', %s, %s)",
            (approval_id, draft.tenant, draft.requester.id, draft.requester.issuer, draft.filename,
             draft.sha256, draft.size, draft.content, draft.salt, now, now + ttl),
        )  # fmt: skip
        # Sent with the COMMIT, not waited for alone: the record is what was just written.
        return Approval(
            id=approval_id,
            tenant=draft.tenant,
            requester=draft.requester,
            filename=draft.filename,
            sha256=draft.sha256,
            bytes=draft.size,
            state=ApprovalState.PENDING,
            created_at=now,
            expires_at=now + ttl,
            decided_by=None,
            decided_at=None,
            consumed_at=None,
            salt=draft.salt,
        )

    async def decide(
        self, approval_id: str, *, tenant: str, vote: Vote, approve: bool, require_distinct: bool
    ) -> Approval | DecisionError:
        # In a pipeline: three round trips (BEGIN with the locking read; the vote with the
        # count; the update with the COMMIT), where one per statement made six.
        async with self._conn() as conn, conn.pipeline():
            async with conn.transaction():
                # The record's row lock: approvers deciding at once on any replica take turns, so
                # each counts the votes the previous one committed (two yeses make two, never one).
                cur = await conn.execute(
                    select(META_COLUMNS, "WHERE id = %s AND tenant = %s FOR UPDATE"), (approval_id, tenant)
                )
                row = await cur.fetchone()
                now = self._clock()
                current = approval_from_row(row).as_of(now) if row else None
                refused = refusal(current, vote.approver, require_distinct)
                if refused is not None or current is None:
                    return refused or DecisionError.NOT_FOUND
                if approve:
                    seen = await conn.execute(
                        SEEN.format(p="%s"), (approval_id, vote.approver.issuer, vote.approver.id)
                    )
                    if await seen.fetchone() is None:
                        return DecisionError.CONTENT_NOT_VIEWED
                inserted = await conn.execute(
                    INSERT_VOTE.format(p="%s") + " ON CONFLICT DO NOTHING RETURNING approver",
                    vote_row(approval_id, vote, approve, now),
                )
                # The same transaction's next statement sees the vote just inserted (if it was).
                counted = await conn.execute(
                    "SELECT COUNT(*), COALESCE(MAX(required), 1) FROM approval_votes "
                    "WHERE approval_id = %s AND approve",
                    (approval_id,),
                )
                if await inserted.fetchone() is None:  # the key: one decision per approver
                    return DecisionError.ALREADY_DECIDED
                totals = await counted.fetchone()
                assert totals is not None
                yes, required = totals
                # The record's count stands too: a reopen set it, for the set in force (`reopen`).
                required = max(required, current.required)
                state = "denied" if not approve else "approved" if yes >= required else "pending"
                updated = await conn.execute(
                    _returning(
                        "UPDATE approvals SET state = %s, decided_by = %s, decided_at = %s, approvals = %s, "
                        "required = %s, policy_hash = %s WHERE id = %s AND tenant = %s"
                    ),
                    (state, vote.approver.id, now, yes, required,
                     vote.policy_hash if state == "approved" else None, approval_id, tenant),
                )  # fmt: skip
            decided = await updated.fetchone()  # sent with the COMMIT, read after it
            assert decided is not None
            return approval_from_row(decided)

    async def votes(self, approval_id: str, tenant: str) -> list[Vote]:
        async with self._conn() as conn:
            cur = await conn.execute(
                f"SELECT {VOTE_COLUMNS} FROM approval_votes WHERE approve AND approval_id = "  # noqa: S608
                "(SELECT id FROM approvals WHERE id = %s AND tenant = %s) ORDER BY decided_at",
                (approval_id, tenant),
            )
            rows = await cur.fetchall()
        return [vote_from_row(r) for r in rows]

    async def viewed(self, approval_id: str, tenant: str, viewer: Person) -> None:
        params = (viewer.issuer, viewer.id, self._clock(), approval_id, tenant)
        async with self._conn() as conn:
            await conn.execute(INSERT_VIEW.format(p="%s"), params)

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
        async with self._conn() as conn, conn.transaction():
            cur = await conn.execute(
                "UPDATE approvals SET state = 'pending', consumed_at = NULL, claimed_by = NULL, "
                "claim_until = NULL, decided_by = NULL, decided_at = NULL, policy_hash = NULL, "
                "approvals = %s, required = %s WHERE id = %s AND tenant = %s AND state = 'consumed' "
                "AND claimed_by = %s AND consumed_at = %s RETURNING id",
                (len(keep), required, approval_id, tenant, owner, consumed_at),
            )
            if await cur.fetchone() is None:
                return False
            await conn.execute(  # a vote is its person's: kept or not as a pair
                "DELETE FROM approval_votes WHERE approval_id = %s AND NOT EXISTS (SELECT 1 FROM "
                "unnest(%s::text[], %s::text[]) AS k (issuer, approver) "
                "WHERE k.issuer = approval_votes.issuer AND k.approver = approval_votes.approver)",
                (approval_id, [p.issuer for p in keep], [p.id for p in keep]),
            )
            # The kept votes were decided again: the count they now ask for is the reopen's,
            # not the one they asked when cast (`decide` takes the most of the votes').
            await conn.execute(
                "UPDATE approval_votes SET required = %s WHERE approval_id = %s", (required, approval_id)
            )
        return True

    async def consume(
        self, *, tenant: str, requester: Person, filename: str, sha256: str, claim: Claim
    ) -> Approval | None:
        now = self._clock()
        # One statement: the subquery's row lock makes a concurrent consumer (any replica)
        # wait and then re-check `state = 'approved'`, which no longer holds: it gets nothing.
        row = await self._one(
            _returning(
                "UPDATE approvals SET state = 'consumed', consumed_at = %(now)s, "
                "claimed_by = %(owner)s, claim_until = %(until)s WHERE id = ("
                "SELECT id FROM approvals WHERE tenant = %(tenant)s AND requester = %(requester)s "
                "AND requester_issuer IN (%(issuer)s, '') "
                "AND filename = %(filename)s AND sha256 = %(sha256)s AND state = 'approved' "
                "AND expires_at > %(now)s ORDER BY created_at LIMIT 1 FOR UPDATE"
                ") AND state = 'approved'"
            ),
            {"now": now, "tenant": tenant, "requester": requester.id, "issuer": requester.issuer,
             "filename": filename,
             "sha256": sha256, "owner": claim.owner, "until": claim.until},
        )  # fmt: skip
        return approval_from_row(row) if row else None

    async def confirm(self, approval_id: str, tenant: str, owner: str, *, consumed_at: float) -> bool:
        row = await self._one(
            "UPDATE approvals SET claim_until = NULL WHERE id = %s AND tenant = %s "
            "AND state = 'consumed' AND claimed_by = %s AND consumed_at = %s RETURNING id",
            (approval_id, tenant, owner, consumed_at),
        )
        return row is not None

    async def release(self, approval_id: str, tenant: str, owner: str, *, consumed_at: float) -> bool:
        # One statement, so one transaction and one round trip: the transition and its record
        # commit together, and the last SELECT sees the table as it was before this statement
        # (a data-modifying CTE's rows are not visible to its own query), so True means "given
        # back now" or "given back by an earlier call whose answer was lost".
        row = await self._one(
            "WITH given AS (UPDATE approvals SET state = 'approved', consumed_at = NULL, "
            "claimed_by = NULL, claim_until = NULL WHERE id = %(id)s AND tenant = %(tenant)s "
            "AND state = 'consumed' AND claimed_by = %(owner)s AND consumed_at = %(at)s RETURNING id), "
            "recorded AS (INSERT INTO approval_releases (approval_id, owner, consumed_at, released_at) "
            "SELECT id, %(owner)s, %(at)s, %(now)s FROM given "
            "ON CONFLICT (approval_id, owner, consumed_at) DO UPDATE SET released_at = excluded.released_at "
            "RETURNING approval_id) "
            "SELECT EXISTS (SELECT 1 FROM recorded) OR EXISTS (SELECT 1 FROM approval_releases r "
            "JOIN approvals a ON a.id = r.approval_id WHERE r.approval_id = %(id)s "
            "AND a.tenant = %(tenant)s AND r.owner = %(owner)s AND r.consumed_at = %(at)s)",
            {"id": approval_id, "tenant": tenant, "owner": owner, "at": consumed_at, "now": self._clock()},
        )
        return bool(row and row[0])

    async def claims(self, tenant: str | None, *, limit: int) -> list[HeldClaim]:
        async with self._conn() as conn:
            cur = await conn.execute(
                "SELECT id, tenant, claimed_by, claim_until FROM approvals WHERE claim_until IS NOT NULL "
                "AND state = 'consumed' AND (%(tenant)s::text IS NULL OR tenant = %(tenant)s) "
                "ORDER BY claim_until LIMIT %(limit)s",
                {"tenant": tenant, "limit": limit},
            )
            rows = await cur.fetchall()
        return [HeldClaim(r[0], r[1], r[2], r[3]) for r in rows]

    async def held(self, draft: Draft) -> list[HeldClaim]:
        async with self._conn() as conn:
            cur = await conn.execute(
                "SELECT id, tenant, claimed_by, claim_until FROM approvals WHERE tenant = %s "  # noqa: S608
                f"AND {_REQUESTER} AND filename = %s AND sha256 = %s AND state = 'consumed' "
                "AND claim_until IS NOT NULL ORDER BY claim_until",
                (draft.tenant, *requester_params(draft.requester), draft.filename, draft.sha256),
            )
            rows = await cur.fetchall()
        return [HeldClaim(r[0], r[1], r[2], r[3]) for r in rows]

    async def revert(self, claim: HeldClaim) -> bool:
        row = await self._one(
            "UPDATE approvals SET state = 'approved', consumed_at = NULL, claimed_by = NULL, "
            "claim_until = NULL WHERE id = %s AND tenant = %s AND state = 'consumed' "
            "AND claimed_by = %s AND claim_until = %s RETURNING id",
            (claim.approval_id, claim.tenant, claim.owner, claim.until),
        )
        return row is not None

    async def answer_in_band(
        self, approval_id: str, *, tenant: str, approver: str, approve: bool, claim: Claim
    ) -> Approval | None:
        now = self._clock()
        new_state = ApprovalState.CONSUMED if approve else ApprovalState.DENIED
        row = await self._one(
            _returning(
                "UPDATE approvals SET state = %s, decided_by = %s, decided_at = %s, consumed_at = %s, "
                "claimed_by = %s, claim_until = %s "
                "WHERE id = %s AND tenant = %s AND state = 'pending' AND expires_at > %s"
            ),
            (new_state.value, approver, now, now if approve else None,
             claim.owner if approve else None, claim.until if approve else None,
             approval_id, tenant, now),
        )  # fmt: skip
        return approval_from_row(row) if row else None

    async def purge(self, *, closed_before: float) -> int:
        total = 0
        while True:
            async with self._conn() as conn:
                # SKIP LOCKED: replicas purging at once take disjoint rows, each counted once.
                cur = await conn.execute(
                    "DELETE FROM approvals WHERE id IN (SELECT id FROM approvals WHERE expires_at < %(t)s "
                    "OR (state = 'consumed' AND consumed_at < %(t)s) LIMIT %(n)s FOR UPDATE SKIP LOCKED)",
                    {"t": closed_before, "n": _PURGE_BATCH},
                )
                deleted = cur.rowcount
            total += deleted
            if deleted < _PURGE_BATCH:
                return total
