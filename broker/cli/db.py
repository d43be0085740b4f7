"""`docbroker db upgrade|status|backup`: the approvals database's schema
(broker/approvals/migrations.py), and a consistent copy of the SQLite one while brokers run.

Reads only the data dir and the database settings: an operator's shell has no DOCBROKER_AUTH_*
to set. Exit 0 when the schema is the one this broker needs, 1 otherwise (or when the database
cannot be reached), 2 on a configuration error.
"""

from __future__ import annotations

import argparse

from broker.cli.base import CliError, Subparsers, UsageError, json_flag, print_fields, print_json
from broker.settings import SettingsError, StoreSettings


def register(sub: Subparsers) -> None:
    db = sub.add_parser("db", help="the approvals database's schema").add_subparsers(
        dest="db_command", required=True, metavar="COMMAND"
    )
    upgrade = db.add_parser("upgrade", help="apply the schema migrations this broker needs")
    status = db.add_parser("status", help="the schema version found and the one this broker needs")
    for parser in (upgrade, status):
        json_flag(parser)
        parser.set_defaults(func=cmd_db)
    backup = db.add_parser(
        "backup", help="copy the SQLite approvals database, consistent while brokers use it"
    )
    backup.add_argument("target", metavar="FILE", help="the copy (a new file; never overwritten)")
    json_flag(backup)
    backup.set_defaults(func=cmd_backup)


def cmd_backup(args: argparse.Namespace) -> int:
    import os
    import sqlite3
    from pathlib import Path

    from broker.settings import store_from_env

    try:
        settings = store_from_env()
    except SettingsError as exc:
        raise UsageError(f"configuration error: {exc}") from None
    if settings.database.url is not None:
        # PostgreSQL has its own tools for a consistent copy of a live database.
        raise UsageError("the approvals are in PostgreSQL: back them up with pg_dump")
    if not settings.approvals_db.is_file():
        raise CliError("no approvals database in the data dir")
    target = Path(args.target)
    try:
        # A new file only, closed to others: it holds the tenants' pending drafts.
        os.close(os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600))
    except OSError as exc:
        raise UsageError(f"the backup file cannot be created ({type(exc).__name__})") from None
    # SQLite's online backup: a consistent copy while brokers write (WAL included), page by page.
    source = sqlite3.connect(settings.approvals_db)
    copy = sqlite3.connect(target)
    try:
        source.backup(copy)
    finally:
        copy.close()
        source.close()
    result = {"backend": "sqlite", "bytes": target.stat().st_size}
    if args.json:
        print_json(result)
    else:
        print_fields(list(result.items()))
    return 0


def cmd_db(args: argparse.Namespace) -> int:
    import asyncio

    from broker.approvals.migrations import LATEST
    from broker.approvals.store import StoreError
    from broker.settings import store_from_env

    try:
        settings = store_from_env()
    except SettingsError as exc:
        raise UsageError(f"configuration error: {exc}") from None
    try:
        before, applied = asyncio.run(_db(settings, upgrade=args.db_command == "upgrade"))
    except StoreError as exc:  # fixed texts: never the database URL
        raise CliError(str(exc)) from None
    backend = "postgresql" if settings.database.url else "sqlite"
    now = applied[-1] if applied else before
    state = "current" if now == LATEST else ("needs upgrade" if now < LATEST else "newer than this broker")
    report: dict[str, object] = {
        "backend": backend,
        "schema_version": now,
        "broker_version": LATEST,
        "state": state,
    }
    if args.db_command == "upgrade":
        report["applied"] = applied
    if args.json:
        print_json(report)
    else:
        print_fields([(k, ", ".join(map(str, v)) if isinstance(v, list) else v) for k, v in report.items()])
    return 0 if now == LATEST else 1


async def _db(settings: StoreSettings, *, upgrade: bool) -> tuple[int, list[int]]:
    """(version found, versions applied)."""
    if settings.database.url is not None:
        from broker.approvals.postgres_store import PostgresApprovalStore

        store = await PostgresApprovalStore.open(settings.database, check_schema=False)
        try:
            before = await store.schema_version()
            return before, (await store.upgrade() if upgrade else [])
        finally:
            await store.close()
    import sqlite3

    from broker.approvals import migrations

    if not upgrade and not settings.approvals_db.exists():
        return 0, []
    settings.data_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    db = sqlite3.connect(settings.approvals_db, isolation_level=None)
    try:
        before = migrations.sqlite_version(db)
        return before, (migrations.upgrade_sqlite(db) if upgrade else [])
    finally:
        db.close()
