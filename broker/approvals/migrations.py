"""Versioned migrations of the approvals schema, for SQLite and PostgreSQL alike (DESIGN §9).

A table of our own, `docbroker_schema`, holds one row per applied migration (version, name,
time). That is enough here because the history is one line: migrations are numbered, applied
in order, never edited once released and never undone (a downgrade is a restore from backup).
Each upgrade runs in one transaction together with its rows (both databases have
transactional DDL), so a crash leaves the old version or the new one, never half of one; and
concurrent upgraders wait on one lock (`BEGIN IMMEDIATE` in SQLite, an advisory transaction
lock in PostgreSQL), so two replicas running `docbroker db upgrade` at once apply it once.

A broker checks the version at start and refuses any other than `LATEST`, older or newer,
with one line that says what to run. PostgreSQL is upgraded only by `docbroker db upgrade`
(replicas must not race a schema change at start-up); the embedded SQLite file belongs to
one broker, which upgrades it itself when it opens it.
"""

from __future__ import annotations

import sqlite3
import time
from dataclasses import dataclass
from typing import Any

from broker.approvals.store import SchemaMismatch

TABLE = "docbroker_schema"
UPGRADE_COMMAND = "docbroker db upgrade"
# pg_advisory_xact_lock's key for upgrades: any constant no other lock of ours uses.
_PG_UPGRADE_LOCK = 0x646F6362  # "docb"


@dataclass(frozen=True)
class Migration:
    version: int
    name: str
    sqlite: tuple[str, ...]
    postgres: tuple[str, ...]


_INDEXES = (
    "CREATE INDEX IF NOT EXISTS approvals_lookup ON approvals (tenant, requester, filename, sha256, state)",
    "CREATE INDEX IF NOT EXISTS approvals_by_state ON approvals (tenant, state, created_at, id)",
    "CREATE INDEX IF NOT EXISTS approvals_by_time ON approvals (tenant, created_at, id)",
    "CREATE INDEX IF NOT EXISTS approvals_open ON approvals (state, expires_at)",
)

_CLAIMS_INDEX = (
    "CREATE INDEX IF NOT EXISTS approvals_claims ON approvals (claim_until) WHERE claim_until IS NOT NULL"
)

_WEB_SESSIONS = (
    """CREATE TABLE web_sessions (
        id TEXT PRIMARY KEY, issuer TEXT NOT NULL, subject TEXT NOT NULL, tenants TEXT NOT NULL,
        csrf TEXT NOT NULL, created_at DOUBLE PRECISION NOT NULL,
        expires_at DOUBLE PRECISION NOT NULL, idle_until DOUBLE PRECISION NOT NULL)""",
    "CREATE INDEX web_sessions_idle ON web_sessions (idle_until)",
    """CREATE TABLE web_logins (
        id TEXT PRIMARY KEY, state TEXT NOT NULL, nonce TEXT NOT NULL, verifier TEXT NOT NULL,
        return_to TEXT NOT NULL, expires_at DOUBLE PRECISION NOT NULL)""",
    "CREATE INDEX web_logins_expiry ON web_logins (expires_at)",
)


def _votes(real: str, flag: str) -> tuple[str, ...]:
    return (
        "ALTER TABLE approvals ADD COLUMN approvals INTEGER NOT NULL DEFAULT 0",
        "ALTER TABLE approvals ADD COLUMN required INTEGER NOT NULL DEFAULT 1",
        "ALTER TABLE approvals ADD COLUMN policy_hash TEXT",
        f"""CREATE TABLE approval_votes (
            approval_id TEXT NOT NULL REFERENCES approvals (id) ON DELETE CASCADE,
            approver TEXT NOT NULL, issuer TEXT NOT NULL, groups TEXT NOT NULL, scopes TEXT NOT NULL,
            approve {flag} NOT NULL, required INTEGER NOT NULL, policy_hash TEXT NOT NULL,
            decided_at {real} NOT NULL, PRIMARY KEY (approval_id, approver))""",
    )


def _releases(real: str) -> tuple[str, ...]:
    return (
        f"""CREATE TABLE approval_releases (
            approval_id TEXT NOT NULL REFERENCES approvals (id) ON DELETE CASCADE,
            owner TEXT NOT NULL, consumed_at {real} NOT NULL, released_at {real} NOT NULL,
            PRIMARY KEY (approval_id, owner, consumed_at))""",
    )


_VOTE_COLUMNS = "approval_id, approver, issuer, groups, scopes, approve, required, policy_hash, decided_at"


def _people(votes_key: tuple[str, ...]) -> tuple[str, ...]:
    return (
        # A record from before this keeps "" (its requester's issuer is unknown): it stands for
        # any issuer where that refuses (self-approval) and for its requester's saves.
        "ALTER TABLE approvals ADD COLUMN requester_issuer TEXT NOT NULL DEFAULT ''",
        *votes_key,
        "ALTER TABLE web_sessions ADD COLUMN groups TEXT NOT NULL DEFAULT '[]'",
        # A session begun before holds no groups: it would escape a group's forbid. Sign in again.
        "DELETE FROM web_sessions",
    )


# SQLite cannot change a primary key: the votes move to a table keyed by person.
_SQLITE_VOTES_BY_PERSON = (
    """CREATE TABLE approval_votes_people (
        approval_id TEXT NOT NULL REFERENCES approvals (id) ON DELETE CASCADE,
        approver TEXT NOT NULL, issuer TEXT NOT NULL, groups TEXT NOT NULL, scopes TEXT NOT NULL,
        approve INTEGER NOT NULL, required INTEGER NOT NULL, policy_hash TEXT NOT NULL,
        decided_at REAL NOT NULL, PRIMARY KEY (approval_id, issuer, approver))""",
    f"INSERT INTO approval_votes_people ({_VOTE_COLUMNS}) SELECT {_VOTE_COLUMNS} FROM approval_votes",  # noqa: S608
    "DROP TABLE approval_votes",
    "ALTER TABLE approval_votes_people RENAME TO approval_votes",
)
_PG_VOTES_BY_PERSON = (
    "ALTER TABLE approval_votes DROP CONSTRAINT approval_votes_pkey, "
    "ADD PRIMARY KEY (approval_id, issuer, approver)",
)


def _views(real: str) -> tuple[str, ...]:
    return (
        f"""CREATE TABLE approval_views (
            approval_id TEXT NOT NULL REFERENCES approvals (id) ON DELETE CASCADE,
            issuer TEXT NOT NULL, viewer TEXT NOT NULL, viewed_at {real} NOT NULL,
            PRIMARY KEY (approval_id, issuer, viewer))""",
    )


_SALT = ("ALTER TABLE approvals ADD COLUMN salt TEXT NOT NULL DEFAULT ''",)

MIGRATIONS: tuple[Migration, ...] = (
    Migration(
        1,
        "approvals",
        # IF NOT EXISTS: a data dir from before versioning already holds this table; it is adopted.
        sqlite=(
            """CREATE TABLE IF NOT EXISTS approvals (
                id TEXT PRIMARY KEY, tenant TEXT NOT NULL, requester TEXT NOT NULL,
                filename TEXT NOT NULL, sha256 TEXT NOT NULL, bytes INTEGER NOT NULL,
                content TEXT NOT NULL, state TEXT NOT NULL, created_at REAL NOT NULL,
                expires_at REAL NOT NULL, decided_by TEXT, decided_at REAL, consumed_at REAL)""",
            *_INDEXES,
        ),
        postgres=(
            """CREATE TABLE approvals (
                id TEXT PRIMARY KEY, tenant TEXT NOT NULL, requester TEXT NOT NULL,
                filename TEXT NOT NULL, sha256 TEXT NOT NULL, bytes INTEGER NOT NULL,
                content TEXT NOT NULL,
                state TEXT NOT NULL CHECK (state IN ('pending', 'approved', 'denied', 'consumed', 'expired')),
                created_at DOUBLE PRECISION NOT NULL, expires_at DOUBLE PRECISION NOT NULL,
                decided_by TEXT, decided_at DOUBLE PRECISION, consumed_at DOUBLE PRECISION)""",
            *_INDEXES,
        ),
    ),
    Migration(
        2,
        "consume_claims",
        # Who consumed a record, and until when an unconfirmed consumption is held (two-phase).
        sqlite=(
            "ALTER TABLE approvals ADD COLUMN claimed_by TEXT",
            "ALTER TABLE approvals ADD COLUMN claim_until REAL",
            _CLAIMS_INDEX,
        ),
        postgres=(
            "ALTER TABLE approvals ADD COLUMN claimed_by TEXT",
            "ALTER TABLE approvals ADD COLUMN claim_until DOUBLE PRECISION",
            _CLAIMS_INDEX,
        ),
    ),
    Migration(
        3,
        "web_sessions",
        # Approvers' sign-in sessions and sign-ins under way (broker/web/approver_sessions.py): ids are
        # SHA-256 digests of the cookies, never the cookies. Same SQL in both dialects.
        sqlite=_WEB_SESSIONS,
        postgres=_WEB_SESSIONS,
    ),
    Migration(
        4,
        "approval_votes",
        # The two-person rule (docs/policy.md): each approver's decision on a record, one per
        # approver (the key), with what the policy asked for and the set's hash; the record
        # counts the yeses, the number needed, and the set it was approved under.
        sqlite=_votes("REAL", "INTEGER"),
        postgres=_votes("DOUBLE PRECISION", "BOOLEAN"),
    ),
    Migration(
        5,
        "approval_releases",
        # Each consumption its owner gave back (`ApprovalStore.release`), named as the owner
        # names it (owner, consumed_at): a release whose commit landed but whose answer was lost
        # is recognised by its retry as already done, so it is audited once, not never.
        sqlite=_releases("REAL"),
        postgres=_releases("DOUBLE PRECISION"),
    ),
    Migration(
        6,
        "people",
        # A person is (issuer, id) (DESIGN §12): the requester's issuer beside it, votes keyed by
        # person (two people with one `sub` at two issuers are two votes), and a signed-in
        # approver's groups in their session, for the policy.
        sqlite=_people(_SQLITE_VOTES_BY_PERSON),
        postgres=_people(_PG_VOTES_BY_PERSON),
    ),
    Migration(
        7,
        "approval_views",
        # Who was shown a record's content (`ApprovalStore.viewed`): a yes counts only from a
        # person who fetched what they approve. A record from before has no views: its
        # approvers fetch it once more.
        sqlite=_views("REAL"),
        postgres=_views("DOUBLE PRECISION"),
    ),
    Migration(
        8,
        "approval_salts",
        # Each record's salt for its content commitment (DESIGN §16): the audit carries
        # sha256(salt ‖ sha256(content)), the receipt the salt. A record from before has none
        # ('') and its lines no commitment. Same SQL in both dialects.
        sqlite=_SALT,
        postgres=_SALT,
    ),
)
LATEST = MIGRATIONS[-1].version


def check(current: int) -> None:
    """Raise SchemaMismatch (one line, what to do) unless `current` is the version we know."""
    if current < LATEST:
        raise SchemaMismatch(
            f"the approvals database schema is at version {current}, this broker needs {LATEST}: "
            f"run `{UPGRADE_COMMAND}`"
        )
    if current > LATEST:
        raise SchemaMismatch(
            f"the approvals database schema is at version {current}, newer than this broker "
            f"knows ({LATEST}): run a broker of that version, or restore a backup of this one's"
        )


def _todo(current: int) -> list[Migration]:
    if current > LATEST:
        check(current)  # never "upgrade" a schema from the future
    return [m for m in MIGRATIONS if m.version > current]


# -- SQLite ---------------------------------------------------------------------------------

_SQLITE_TABLE = f"CREATE TABLE IF NOT EXISTS {TABLE} (version INTEGER PRIMARY KEY, name TEXT NOT NULL, applied_at REAL NOT NULL)"  # noqa: E501


def sqlite_version(db: sqlite3.Connection) -> int:
    exists = db.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?", (TABLE,)).fetchone()
    if not exists:
        return 0
    row = db.execute(f"SELECT COALESCE(MAX(version), 0) FROM {TABLE}").fetchone()  # noqa: S608
    return int(row[0])


def upgrade_sqlite(db: sqlite3.Connection) -> list[int]:
    """Apply what is missing, in one transaction; the versions applied. `db` is in autocommit."""
    db.execute("BEGIN IMMEDIATE")
    try:
        todo = _todo(sqlite_version(db))
        db.execute(_SQLITE_TABLE)
        for migration in todo:
            for statement in migration.sqlite:  # one by one: executescript would COMMIT first
                db.execute(statement)
            db.execute(
                f"INSERT INTO {TABLE} (version, name, applied_at) VALUES (?, ?, ?)",  # noqa: S608
                (migration.version, migration.name, time.time()),
            )
    except BaseException:
        db.execute("ROLLBACK")
        raise
    db.execute("COMMIT")
    return [m.version for m in todo]


# -- PostgreSQL (psycopg 3, async) ----------------------------------------------------------

_PG_TABLE = (
    f"CREATE TABLE IF NOT EXISTS {TABLE} "
    "(version INTEGER PRIMARY KEY, name TEXT NOT NULL, applied_at DOUBLE PRECISION NOT NULL)"
)


async def postgres_version(conn: Any) -> int:
    """The schema version in the connection's search path (0: none yet)."""
    cur = await conn.execute("SELECT to_regclass(%s) IS NOT NULL", (TABLE,))
    row = await cur.fetchone()
    if not row or not row[0]:
        return 0
    cur = await conn.execute(f"SELECT COALESCE(MAX(version), 0) FROM {TABLE}")  # noqa: S608
    row = await cur.fetchone()
    return int(row[0]) if row else 0


async def upgrade_postgres(conn: Any) -> list[int]:
    """Apply what is missing, in one transaction, under the upgrade lock; the versions applied."""
    async with conn.transaction():
        await conn.execute("SELECT pg_advisory_xact_lock(%s)", (_PG_UPGRADE_LOCK,))
        todo = _todo(await postgres_version(conn))
        await conn.execute(_PG_TABLE)
        for migration in todo:
            for statement in migration.postgres:
                await conn.execute(statement)
            await conn.execute(
                f"INSERT INTO {TABLE} (version, name, applied_at) VALUES (%s, %s, %s)",  # noqa: S608
                (migration.version, migration.name, time.time()),
            )
    return [m.version for m in todo]
