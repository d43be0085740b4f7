"""This broker's claims on the approvals it consumes, and when another broker's claim is lost.

A consumption is a claim until it is confirmed, just before the write is sent (see
`broker.approvals.store`). A claim is lost, and any broker may take it back, when its time
is up or when its owner is known to be dead: a replica of this host's data dir whose lock is
free, or held by a later incarnation (restarted under the same id; see
`broker.runtime.shared`). Owners this host cannot see (a replica on another node) are trusted
until their time is up: the hold is longer than a sandbox start plus a call, so a live owner
has confirmed or released by then.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from broker.approvals.store import ApprovalStore, Claim, HeldClaim
from broker.audit import AuditFn, AuditSinkError
from broker.audit.schema import AuditEvent

log = logging.getLogger("docbroker")

# Beyond a sandbox start and the contract listing before the write is sent.
HOLD_MARGIN_SECONDS = 10.0
# Lost claims taken back in one pass: more wait for the next (a save's, or the periodic one).
PER_RECOVERY = 100
# How often every broker looks for lost claims of any tenant, so a dead broker's unsent
# approval reads as approved again without waiting for its requester's retry.
RECOVERY_INTERVAL_SECONDS = 30.0



class Claims:
    def __init__(
        self,
        *,
        owner: str,
        hold_seconds: float,
        owner_dead: Callable[[str], bool | None],
        clock: Callable[[], float] = time.time,
    ) -> None:
        """`owner` names this process; `owner_dead(owner)`: True if that process is known to
        have stopped, None if this host cannot tell."""
        self.owner = owner
        self._hold = hold_seconds
        self._owner_dead = owner_dead
        self._clock = clock

    def new(self) -> Claim:
        return Claim(self.owner, self._clock() + self._hold)

    def lost(self, held: HeldClaim) -> bool:
        """May `held` be taken back? Never while its owner, this broker included, may still
        send its write."""
        return held.until <= self._clock() or self._owner_dead(held.owner) is True


async def recover_claims(store: ApprovalStore, claims: Claims, audit: AuditFn, tenant: str | None) -> int:
    """Take back lost claims (of one tenant, or all): each is audited `approval.released`
    with the reason `claim_lost`. How many were taken back."""
    taken = 0
    for held in await store.claims(tenant, limit=PER_RECOVERY):
        if claims.lost(held) and await store.revert(held):
            taken += 1
            await audit(AuditEvent.APPROVAL_RELEASED, approval_id=held.approval_id, tenant=held.tenant,
                        outcome="ok", reason="claim_lost")  # fmt: skip
    return taken


async def recover_forever(
    store: ApprovalStore,
    claims: Claims,
    audit: AuditFn,
    audit_ready: Callable[[], None],
    interval_seconds: float = RECOVERY_INTERVAL_SECONDS,
) -> None:
    """Take back lost claims now, then every `interval_seconds`, until cancelled."""
    while True:
        try:
            audit_ready()  # nothing changes while the change cannot be recorded
            await recover_claims(store, claims, audit, None)
        except AuditSinkError:
            log.warning("approval claims: the audit log cannot be written")
        except Exception as exc:  # the loop must outlive one bad round (the database away)
            log.warning("approval claims recovery failed", extra={"error": type(exc).__name__})
        await asyncio.sleep(interval_seconds)
