"""Approvers' sign-in sessions, server-side, in the approvals store (DESIGN §12).

The browser holds an opaque random value; the store holds its SHA-256 digest, so a copy of
the database (a backup, a replica's view) gives no cookie that works. Sessions live in the
approvals store, SQLite or the PostgreSQL every replica shares, so any replica serves a
session another began, and a logout on one ends it on all.

A session ends at the first of: its lifetime from sign-in (`expires_at`), its idle timeout
since its last request (`idle_until`, moved on by every request, never past `expires_at`),
logout. A sign-in under way is no row: it travels sealed in the browser's cookie
(broker/web/signin.py), so starts that never finish cannot fill the store.
"""

from __future__ import annotations

import hashlib
import json
import secrets
import sqlite3
from dataclasses import dataclass
from typing import Any, Protocol

from broker.approvals.store import ApprovalStore
from broker.types import Person

COOKIE_BYTES = 32


def new_secret() -> str:
    return secrets.token_urlsafe(COOKIE_BYTES)


def digest(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


@dataclass(frozen=True)
class WebSession:
    id: str  # digest of the cookie
    issuer: str
    subject: str
    tenants: tuple[str, ...]  # those the person approves for, mapped at sign-in
    csrf: str  # sent back by the page in X-CSRF-Token on every state-changing request
    created_at: float
    expires_at: float
    idle_until: float
    # The id_token's groups at sign-in (DOCBROKER_OIDC_GROUPS_CLAIM): the policy decides on
    # them for every request of the session, as it does on a token's.
    groups: tuple[str, ...] = ()

    @property
    def person(self) -> Person:
        return Person(self.issuer, self.subject)


class WebSessions(Protocol):
    async def create(self, session: WebSession) -> None: ...

    async def touch(self, session_id: str, now: float, idle_seconds: float) -> WebSession | None:
        """The live session, its idle deadline moved on; None if unknown, ended or expired."""
        ...

    async def end(self, session_id: str) -> bool: ...

    async def purge(self, now: float) -> None: ...


# One statement per operation, the same in both dialects but for the placeholders (and
# MIN/LEAST, below); SQLite's are written here, PostgreSQL's derived by `_pg`.
_CREATE = (
    "INSERT INTO web_sessions (id, issuer, subject, tenants, csrf, created_at, expires_at, idle_until, "
    "groups) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)"
)
_TOUCH = (
    "UPDATE web_sessions SET idle_until = MIN(?, expires_at) WHERE id = ? AND idle_until > ? "
    "AND expires_at > ? RETURNING id, issuer, subject, tenants, csrf, created_at, expires_at, idle_until, "
    "groups"
)
_END = "DELETE FROM web_sessions WHERE id = ?"
_PURGE_SESSIONS = "DELETE FROM web_sessions WHERE idle_until <= ?"


def _pg(statement: str) -> str:
    return statement.replace("?", "%s").replace("MIN(", "LEAST(")


def _session(row: Any) -> WebSession:
    tenants = json.loads(row[3])
    groups = tuple(json.loads(row[8]))
    return WebSession(row[0], row[1], row[2], tuple(tenants), row[4], row[5], row[6], row[7], groups)


def _session_params(s: WebSession) -> tuple[Any, ...]:
    tenants = json.dumps(list(s.tenants))
    groups = json.dumps(sorted(s.groups))
    return (s.id, s.issuer, s.subject, tenants, s.csrf, s.created_at, s.expires_at, s.idle_until, groups)


class SqliteWebSessions:
    """In the embedded store's file, on its worker thread (one broker owns that file)."""

    def __init__(self, store: Any) -> None:
        self._store = store  # a SqliteApprovalStore

    async def _run(self, statement: str, params: tuple[Any, ...]) -> Any:
        def run(db: sqlite3.Connection) -> Any:
            cur = db.execute(statement, params)
            if cur.description is None:
                return cur.rowcount
            rows = cur.fetchall()  # to the end: a RETURNING statement is done only then
            return rows[0] if rows else None

        return await self._store.call(run)

    async def create(self, session: WebSession) -> None:
        await self._run(_CREATE, _session_params(session))

    async def touch(self, session_id: str, now: float, idle_seconds: float) -> WebSession | None:
        row = await self._run(_TOUCH, (now + idle_seconds, session_id, now, now))
        return _session(row) if row else None

    async def end(self, session_id: str) -> bool:
        return bool(await self._run(_END, (session_id,)))

    async def purge(self, now: float) -> None:
        await self._run(_PURGE_SESSIONS, (now,))


class PostgresWebSessions(SqliteWebSessions):
    """In the PostgreSQL every replica shares: one autocommitted statement per operation."""

    async def _run(self, statement: str, params: tuple[Any, ...]) -> Any:
        async with self._store.connection() as conn:
            cur = await conn.execute(_pg(statement), params)
            return await cur.fetchone() if cur.description else cur.rowcount


def web_sessions_for(store: ApprovalStore) -> WebSessions:
    """The sessions table of the store the broker opened."""
    from broker.approvals.sqlite_store import SqliteApprovalStore

    if isinstance(store, SqliteApprovalStore):
        return SqliteWebSessions(store)
    return PostgresWebSessions(store)
