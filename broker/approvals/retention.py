"""Retention: closed approval records are deleted after a configurable age (DESIGN §4).

Records hold reports' full contents; kept forever they grow the data dir without bound and
keep every tenant's drafts around. The purge runs at start-up and then periodically, and
each purge that deletes anything leaves one audit line with the count (no ids, no names).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from broker.approvals.store import ApprovalStore
from broker.audit import AuditFn, AuditSinkError
from broker.audit.schema import AuditEvent

log = logging.getLogger("docbroker")

INTERVAL_SECONDS = 600.0  # a purge is one indexed scan; often enough that the age is kept to the hour


async def purge_once(
    store: ApprovalStore,
    *,
    retention_seconds: float,
    audit: AuditFn,
    audit_ready: Callable[[], None],
    clock: Callable[[], float] = time.time,
) -> int:
    """Delete what closed more than `retention_seconds` ago; returns how many records went."""
    audit_ready()  # raises AuditSinkError: nothing is deleted while the deletion cannot be recorded
    count = await store.purge(closed_before=clock() - retention_seconds)
    if count:
        await audit(AuditEvent.APPROVAL_PURGED, outcome="ok", reason="retention", count=count)
    return count


async def purge_forever(
    store: ApprovalStore,
    *,
    retention_seconds: float,
    audit: AuditFn,
    audit_ready: Callable[[], None],
    interval_seconds: float = INTERVAL_SECONDS,
) -> None:
    """Purge now, then every `interval_seconds`, until cancelled. A failed round is retried."""
    while True:
        try:
            await purge_once(store, retention_seconds=retention_seconds, audit=audit, audit_ready=audit_ready)
        except AuditSinkError:
            log.warning("approval purge: the audit log cannot be written")
        except Exception as exc:  # the loop must outlive one bad round
            log.warning("approval purge failed", extra={"error": type(exc).__name__})
        await asyncio.sleep(interval_seconds)
