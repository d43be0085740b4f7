"""`docbroker db upgrade|status`: the approvals database's schema (broker/approvals/migrations.py).

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
