"""The approvals store the settings name, opened: PostgreSQL or SQLite (`serve` opens its own here)."""

from __future__ import annotations

from broker.approvals.sqlite_store import SqliteApprovalStore
from broker.approvals.store import ApprovalStore
from broker.settings import Settings


async def open_store(settings: Settings) -> ApprovalStore:
    """The approvals store the settings name: PostgreSQL when DOCBROKER_DATABASE_URL is set
    (shared by replicas; its schema must be exactly this broker's), else SQLite in the data
    dir. Raises StoreError (StoreUnavailable, SchemaMismatch) with a one-line message."""
    if settings.database.url is not None:
        from broker.approvals.postgres_store import PostgresApprovalStore

        return await PostgresApprovalStore.open(settings.database)
    return SqliteApprovalStore(settings.approvals_db)
