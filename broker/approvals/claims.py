"""This broker's claims on the approvals it consumes, and when another broker's claim is lost.

A consumption is a claim until it is confirmed, just before the write is sent (see
`broker.approvals.store`). A claim is lost, and any broker may take it back, when its owner is
known to be dead: a replica of this host's data dir whose lock is free, or held by a later
incarnation (restarted under the same id; see `broker.runtime.host_replicas`). An owner known to be
alive (this broker, or a replica of this host whose lock its incarnation holds) keeps its
claim however long it holds it: it gives it back itself. Owners this host cannot see (a
replica on another node) are trusted until their time is up: the hold is longer than a
sandbox start plus a call, so a live owner has confirmed or released by then.

A claim this broker could not give back (the database away when the write was refused) is
owed: kept here and given back as soon as the store answers again, by the next save of that
tenant or by `recover_forever`, whichever comes first. Until then its draft's retries are
answered "retry later", never with a second approval (`ApprovalFlow`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from broker.approvals.store import ApprovalStore, Claim, HeldClaim, StoreUnavailable
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
# While this broker owes a release, how often it tries the store again: the human's approval
# is back for the retry within about this long of the database's return.
OWED_RETRY_SECONDS = 1.0


@dataclass(frozen=True)
class Unsent:
    """One consumption of this broker whose write was never sent, to give back; `ids` are the
    request's (request_id, tenant, subject), for the audit line that says it was given back."""

    approval_id: str
    consumed_at: float
    ids: dict[str, str]

    @property
    def tenant(self) -> str:
        return self.ids["tenant"]


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
        have stopped, False if it is known to run, None if this host cannot tell."""
        self.owner = owner
        self._hold = hold_seconds
        self._owner_dead = owner_dead
        self._clock = clock
        self._owed: dict[str, Unsent] = {}  # approval id → its consumption to give back
        self._owing = asyncio.Event()  # set while something is owed: wakes `recover_forever`

    def new(self) -> Claim:
        return Claim(self.owner, self._clock() + self._hold)

    def lost(self, held: HeldClaim) -> bool:
        """May `held` be taken back? Never while its owner, this broker included, may still
        send its write: its time counts only for an owner this host cannot see."""
        if held.owner == self.owner:  # alive, and gives back its own (at once, or owed)
            return False
        dead = self._owner_dead(held.owner)
        return dead is True or (dead is None and held.until <= self._clock())

    # -- releases owed while the store was away ----------------------------------------------

    def owe(self, unsent: Unsent) -> None:
        self._owed[unsent.approval_id] = unsent
        self._owing.set()

    def owed(self) -> int:
        return len(self._owed)

    def take_owed(self, tenant: str | None) -> list[Unsent]:
        # Taken out while being given back, so two tasks never give back one consumption at once.
        taken = [u for u in self._owed.values() if tenant is None or u.tenant == tenant]
        for unsent in taken:
            del self._owed[unsent.approval_id]
        if not self._owed:
            self._owing.clear()
        return taken

    async def wait_owing(self, seconds: float) -> None:
        """Wait `seconds`, or less if a release becomes owed meanwhile."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._owing.wait(), seconds)


async def give_back(store: ApprovalStore, claims: Claims, unsent: Unsent, audit: AuditFn) -> bool:
    """Give back one consumption whose write was never sent (→ approved), audited
    `approval.released` (`not_forwarded`). False if it was no longer this broker's to give.
    Raises StoreUnavailable; the caller keeps it owed. `store.release` is idempotent: a retry
    of a release whose commit landed but whose answer (or audit line) was lost is True again,
    so the line is written by the attempt that gets through, exactly once."""
    released = await store.release(
        unsent.approval_id, unsent.tenant, claims.owner, consumed_at=unsent.consumed_at
    )
    if released:
        await audit(AuditEvent.APPROVAL_RELEASED, approval_id=unsent.approval_id, outcome="ok",
                    reason="not_forwarded", **unsent.ids)  # fmt: skip
    return released


async def give_back_owed(store: ApprovalStore, claims: Claims, audit: AuditFn, tenant: str | None) -> int:
    """Give back what this broker owes (of one tenant, or all); how many went back. Raises
    StoreUnavailable (all that was not given back stays owed)."""
    done = 0
    pending = claims.take_owed(tenant)
    try:
        while pending:
            await give_back(store, claims, pending[0], audit)
            pending.pop(0)
            done += 1
    finally:  # the store went away again, or the audit log failed: try again later
        for unsent in pending:
            claims.owe(unsent)
    return done


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
    owed_retry_seconds: float = OWED_RETRY_SECONDS,
) -> None:
    """Take back lost claims now, then every `interval_seconds`; give back what this broker
    owes as soon as it owes it, then every `owed_retry_seconds` until the store takes it.
    Until cancelled."""
    loop = asyncio.get_running_loop()
    next_recovery = loop.time()
    while True:
        try:
            audit_ready()  # nothing changes while the change cannot be recorded
            if claims.owed():
                await give_back_owed(store, claims, audit, None)
            if loop.time() >= next_recovery:
                next_recovery = loop.time() + interval_seconds
                await recover_claims(store, claims, audit, None)
        except AuditSinkError:
            log.warning("approval claims: the audit log cannot be written")
        except StoreUnavailable:
            pass  # the store logs its own going away and coming back
        except Exception as exc:  # the loop must outlive one bad round
            log.warning("approval claims recovery failed", extra={"error": type(exc).__name__})
        if claims.owed():
            await asyncio.sleep(owed_retry_seconds)
        else:
            await claims.wait_owing(max(0.0, next_recovery - loop.time()))
