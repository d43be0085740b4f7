"""The one `ApprovalStore` suite, run against both implementations: SQLite and PostgreSQL.

Every test that races runs its contenders on two store instances over the same database:
two replicas (PostgreSQL), or two processes of one host (SQLite). PostgreSQL is real (the
run's throw-away cluster, a schema per test); a missing database fails the run.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import sqlite3
import time
from collections.abc import AsyncIterator, Awaitable
from pathlib import Path
from typing import Any

import psycopg
import pytest

from broker.approvals import migrations
from broker.approvals.postgres_store import PostgresApprovalStore
from broker.approvals.sqlite_store import SqliteApprovalStore
from broker.approvals.store import (
    Approval,
    ApprovalStore,
    Claim,
    DecisionError,
    Draft,
    HeldClaim,
    SchemaMismatch,
    StoreUnavailable,
    TooManyPending,
    Vote,
)
from broker.settings import DatabaseSettings
from broker.types import ApprovalState, Person
from tests.broker.pgtest import fresh_schema

pytestmark = pytest.mark.anyio
TTL = 600.0


class Clock:
    def __init__(self) -> None:
        self.now = time.time()

    def __call__(self) -> float:
        return self.now


class Opener:
    """Opens another instance over the same database each time it is called."""

    def __init__(self, tmp_path: Path, clock: Clock, url: str | None) -> None:
        self.url = url  # None: SQLite
        self._path = tmp_path / "approvals.sqlite3"
        self._clock = clock
        self.opened: list[ApprovalStore] = []

    async def __call__(self) -> ApprovalStore:
        store: ApprovalStore
        if self.url is None:
            store = SqliteApprovalStore(self._path, clock=self._clock)
        else:
            store = await PostgresApprovalStore.open(pg_settings(self.url), clock=self._clock)
        self.opened.append(store)
        return store

    def widen_races(self) -> None:
        """PostgreSQL: every UPDATE holds its row lock a while before it commits, so racing
        statements really overlap (one's snapshot predates the other's commit). A test-only
        trigger in the test's own schema; SQLite's writers are serialized by the file lock."""
        if self.url is None:
            return
        with psycopg.connect(self.url, autocommit=True) as conn:
            conn.execute(
                "CREATE FUNCTION slow() RETURNS trigger AS $$ BEGIN PERFORM pg_sleep(0.05); "
                "RETURN NEW; END $$ LANGUAGE plpgsql"
            )
            conn.execute(
                "CREATE TRIGGER slow BEFORE UPDATE ON approvals FOR EACH ROW EXECUTE FUNCTION slow()"
            )


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture(params=["sqlite", "postgres"])
async def open_store(request: pytest.FixtureRequest, tmp_path: Path, clock: Clock) -> AsyncIterator[Opener]:
    database = fresh_schema() if request.param == "postgres" else contextlib.nullcontext(None)
    with database as url:
        if url is not None:
            await upgraded(url)
        opener = Opener(tmp_path, clock, url)
        try:
            yield opener
        finally:
            for store in opener.opened:
                await store.close()


def pg_settings(url: str, **kwargs: Any) -> DatabaseSettings:
    # Connections opened up front: racing calls really run at once, not queued on one.
    return DatabaseSettings(url=url, pool_min=8, pool_max=8, **kwargs)


async def upgraded(url: str) -> list[int]:
    store = await PostgresApprovalStore.open(pg_settings(url), check_schema=False)
    try:
        return await store.upgrade()
    finally:
        await store.close()


@pytest.fixture
async def store(open_store: Opener) -> ApprovalStore:
    return await open_store()


def draft(
    filename: str = "q3.md", content: str = "all good", tenant: str = "acme", who: str = "alice"
) -> Draft:
    data = content.encode()
    return Draft(tenant, Person(IDP, who), filename, content, hashlib.sha256(data).hexdigest(), len(data))


HASH = "a" * 64
IDP = "https://idp.example"


def vote(who: str, required: int = 1, policy_hash: str = HASH, issuer: str = IDP) -> Vote:
    return Vote(Person(issuer, who), ("legal",), ("reports:approve",), required, policy_hash)


async def decide(
    store: ApprovalStore, approval_id: str, *, tenant: str, vote: Vote, approve: bool, require_distinct: bool
) -> Approval | DecisionError:
    """An approver's decision, the record's content shown to them first (a yes counts only then)."""
    await store.viewed(approval_id, tenant, vote.approver)
    return await store.decide(
        approval_id, tenant=tenant, vote=vote, approve=approve, require_distinct=require_distinct
    )


async def approved(store: ApprovalStore, d: Draft) -> str:
    record, _ = await store.request(d, ttl=TTL, max_pending=100)
    decided = await decide(
        store, record.id, tenant=d.tenant, vote=vote("bob"), approve=True, require_distinct=False
    )
    assert not isinstance(decided, DecisionError)
    return record.id


ME = "a/1111"  # the claim owner of the broker under test: replica "a", one incarnation
HOLD = 60.0


def claim(owner: str = ME, until: float | None = None) -> Claim:
    return Claim(owner, until if until is not None else time.time() + 3600)


def consume(store: ApprovalStore, d: Draft, owner: str = ME, until: float | None = None) -> Awaitable[Any]:
    who = {"tenant": d.tenant, "requester": d.requester, "filename": d.filename, "sha256": d.sha256}
    return store.consume(**who, claim=claim(owner, until))


def answer(store: ApprovalStore, approval_id: str, tenant: str, who: str, approve: bool) -> Awaitable[Any]:
    return store.answer_in_band(approval_id, tenant=tenant, approver=who, approve=approve, claim=claim())


# -- records --------------------------------------------------------------------------------


async def test_one_open_record_per_report_with_its_content(store: ApprovalStore) -> None:
    d = draft(content="line\nwith ünïcode")
    first, created = await store.request(d, ttl=TTL, max_pending=10)
    again, created_again = await store.request(d, ttl=TTL, max_pending=10)
    assert (created, created_again, again.id) == (True, False, first.id)
    assert first.state is ApprovalState.PENDING and first.bytes == d.size
    detail = await store.detail(first.id, "acme")
    assert detail is not None and detail.content == d.content
    assert await store.get(first.id, "globex") is None  # another tenant's id: nothing
    assert await store.detail(first.id, "globex") is None


async def test_each_record_keeps_its_own_content_salt_for_the_audits_commitment(store: ApprovalStore) -> None:
    # Issue 37: the audit carries sha256(salt ‖ sha256(content)); the salt is the record's,
    # 32 random bytes, the same whenever the record is read or requested again.
    d = draft()
    first, _ = await store.request(d, ttl=TTL, max_pending=10)
    again, created = await store.request(draft(), ttl=TTL, max_pending=10)  # a new Draft, a new salt
    assert not created and again.salt == first.salt == d.salt
    assert len(bytes.fromhex(first.salt)) == 32
    read = await store.get(first.id, "acme")
    assert read is not None and read.salt == first.salt
    other, _ = await store.request(draft(filename="q4.md"), ttl=TTL, max_pending=10)
    in_band = draft(filename="q5.md")
    await store.record_in_band("b" * 32, in_band, ttl=TTL, max_pending=10)
    answered = await answer(store, "b" * 32, "acme", "alice", True)
    assert answered is not None and answered.salt == in_band.salt
    assert len({first.salt, other.salt, in_band.salt}) == 3


async def test_expired_records_read_as_expired_and_cannot_be_decided(
    store: ApprovalStore, clock: Clock
) -> None:
    record, _ = await store.request(draft(), ttl=60, max_pending=10)
    clock.now += 61
    current = await store.get(record.id, "acme")
    assert current is not None and current.state is ApprovalState.EXPIRED
    outcome = await decide(
        store, record.id, tenant="acme", vote=vote("bob"), approve=True, require_distinct=False
    )
    assert outcome is DecisionError.EXPIRED
    # and an expired record no longer counts against the cap, nor blocks a new request
    fresh, created = await store.request(draft(), ttl=60, max_pending=1)
    assert created and fresh.id != record.id


async def test_decision_errors(store: ApprovalStore) -> None:
    record, _ = await store.request(draft(), ttl=TTL, max_pending=10)
    same = await decide(
        store, record.id, tenant="acme", vote=vote("alice"), approve=True, require_distinct=True
    )
    assert same is DecisionError.SAME_PERSON
    foreign = await decide(
        store, record.id, tenant="globex", vote=vote("bob"), approve=True, require_distinct=False
    )
    assert foreign is DecisionError.NOT_FOUND
    ok = await decide(
        store, record.id, tenant="acme", vote=vote("alice"), approve=False, require_distinct=False
    )
    assert not isinstance(ok, DecisionError) and ok.state is ApprovalState.DENIED and ok.decided_by == "alice"
    again = await decide(
        store, record.id, tenant="acme", vote=vote("bob"), approve=True, require_distinct=False
    )
    assert again is DecisionError.NOT_PENDING
    # a "no" stands for that exact report until its expiry
    refused = await store.denied(draft())
    assert refused is not None and refused.id == record.id
    assert await store.denied(draft(content="something else")) is None


async def test_release_gives_back_one_consumption_once(store: ApprovalStore, clock: Clock) -> None:
    d = draft()
    approval_id = await approved(store, d)
    taken = await consume(store, d)
    assert taken is not None and taken.id == approval_id and taken.state is ApprovalState.CONSUMED
    assert await consume(store, d) is None
    at = taken.consumed_at
    assert await store.release(approval_id, "globex", ME, consumed_at=at) is False
    # another broker's: never
    assert await store.release(approval_id, "acme", "b/2222", consumed_at=at) is False
    assert await store.release(approval_id, "acme", ME, consumed_at=at) is True
    clock.now += 1
    again = await consume(store, d)
    assert again is not None and again.id == approval_id
    # only a consumption is undone, once: asked again (a retry whose first answer was lost),
    # the store says it was given back, and the later consumption stays taken
    assert await store.release(approval_id, "acme", ME, consumed_at=at) is True
    assert await consume(store, d) is None
    record = await store.get(approval_id, "acme")
    assert record is not None and record.state is ApprovalState.CONSUMED
    assert record.consumed_at == again.consumed_at
    # nobody else's release is taken for it: not another broker's, not another tenant's
    assert await store.release(approval_id, "acme", "b/2222", consumed_at=at) is False
    assert await store.release(approval_id, "globex", ME, consumed_at=at) is False


async def test_a_release_is_remembered_across_instances_and_purged_with_its_record(
    store: ApprovalStore, open_store: Opener, clock: Clock
) -> None:
    """The retry of a release may run on a new connection (PostgreSQL: the old one broke with
    the lost answer) or a new store instance: what it finds is in the database."""
    d = draft()
    approval_id = await approved(store, d)
    taken = await consume(store, d)
    assert taken is not None and taken.consumed_at is not None
    assert await store.release(approval_id, "acme", ME, consumed_at=taken.consumed_at) is True
    other = await open_store()
    assert await other.release(approval_id, "acme", ME, consumed_at=taken.consumed_at) is True
    record = await other.get(approval_id, "acme")
    assert record is not None and record.state is ApprovalState.APPROVED
    clock.now += TTL + 1
    assert await store.purge(closed_before=clock.now) == 1
    assert await other.release(approval_id, "acme", ME, consumed_at=taken.consumed_at) is False


async def test_a_consumption_is_a_claim_until_confirmed_and_only_an_unconfirmed_one_is_taken_back(
    store: ApprovalStore, clock: Clock
) -> None:
    d = draft()
    approval_id = await approved(store, d)
    until = clock.now + HOLD
    taken = await consume(store, d, until=until)
    assert taken is not None
    at = taken.consumed_at
    held = await store.claims("acme", limit=10)
    assert held == [HeldClaim(approval_id, "acme", ME, until)]
    assert await store.claims("globex", limit=10) == []
    assert await store.claims(None, limit=10) == held
    assert await store.held(d) == held and await store.held(draft(content="other")) == []
    # another broker's confirm cannot make it final; its owner's can, and again on a resend
    assert await store.confirm(approval_id, "acme", "b/2222", consumed_at=at) is False
    assert await store.confirm(approval_id, "acme", ME, consumed_at=at) is True
    assert await store.confirm(approval_id, "acme", ME, consumed_at=at) is True
    assert await store.claims(None, limit=10) == []  # confirmed: nothing left to take back
    assert await store.held(d) == []
    assert await store.revert(held[0]) is False  # the write may have happened: it stays spent
    record = await store.get(approval_id, "acme")
    assert record is not None and record.state is ApprovalState.CONSUMED


async def test_a_lost_claim_is_taken_back_once_and_its_owner_can_no_longer_confirm(
    store: ApprovalStore, open_store: Opener, clock: Clock
) -> None:
    d = draft()
    approval_id = await approved(store, d)
    lost = await consume(store, d, owner="dead/0000", until=clock.now + HOLD)
    assert lost is not None
    assert await consume(store, d) is None  # held: nobody else takes it
    [held] = await store.claims("acme", limit=10)
    other = await open_store()  # two brokers see the loss at once: one takes it back
    first, second = await asyncio.gather(store.revert(held), other.revert(held))
    assert sorted([first, second]) == [False, True]
    too_late = await store.confirm(approval_id, "acme", "dead/0000", consumed_at=lost.consumed_at)
    assert too_late is False  # too late to send
    retaken = await consume(store, d)
    assert retaken is not None and retaken.id == approval_id
    assert await store.revert(held) is False  # the old claim is gone; the new one is ME's


async def test_an_owner_confirms_or_gives_back_only_the_consumption_it_made(
    store: ApprovalStore, clock: Clock
) -> None:
    """A broker's claim taken back (its time up) and the record consumed again by the same
    broker for another request: the first request's late confirm or release (owed while the
    database was away) must not touch the second's consumption, which may be on its way."""
    d = draft()
    approval_id = await approved(store, d)
    first = await consume(store, d, until=clock.now - 1)
    assert first is not None
    [held] = await store.claims("acme", limit=10)
    assert await store.revert(held) is True
    clock.now += 1
    second = await consume(store, d)
    assert second is not None and second.consumed_at != first.consumed_at
    assert await store.release(approval_id, "acme", ME, consumed_at=first.consumed_at) is False
    assert await store.confirm(approval_id, "acme", ME, consumed_at=first.consumed_at) is False
    record = await store.get(approval_id, "acme")
    assert record is not None and record.state is ApprovalState.CONSUMED
    assert [h.approval_id for h in await store.held(d)] == [approval_id]
    assert await store.confirm(approval_id, "acme", ME, consumed_at=second.consumed_at) is True


async def test_an_in_band_approval_is_consumed_under_a_claim_a_denial_has_none(store: ApprovalStore) -> None:
    await store.record_in_band("c" * 32, draft(), ttl=TTL, max_pending=10)
    await answer(store, "c" * 32, "acme", "alice", True)
    await store.record_in_band("d" * 32, draft("other.md"), ttl=TTL, max_pending=10)
    await answer(store, "d" * 32, "acme", "alice", False)
    assert [h.approval_id for h in await store.claims("acme", limit=10)] == ["c" * 32]


async def test_in_band_answer_counts_once(store: ApprovalStore) -> None:
    await store.record_in_band("a" * 32, draft(), ttl=TTL, max_pending=10)
    answered = await answer(store, "a" * 32, "acme", "alice", True)
    assert answered is not None and answered.state is ApprovalState.CONSUMED
    assert await answer(store, "a" * 32, "acme", "alice", True) is None
    await store.record_in_band("b" * 32, draft("other.md"), ttl=TTL, max_pending=10)
    assert await answer(store, "b" * 32, "globex", "x", True) is None
    no = await answer(store, "b" * 32, "acme", "alice", False)
    assert no is not None and no.state is ApprovalState.DENIED


async def test_listing_is_filtered_by_state_and_paged_by_keyset(store: ApprovalStore, clock: Clock) -> None:
    ids = []
    for i in range(5):
        clock.now += 1
        record, _ = await store.request(draft(f"r{i}.md"), ttl=TTL, max_pending=10)
        ids.append(record.id)
    await store.request(draft("theirs.md", tenant="globex"), ttl=TTL, max_pending=10)
    await decide(store, ids[1], tenant="acme", vote=vote("bob"), approve=True, require_distinct=False)
    seen: list[str] = []
    after = None
    while True:
        page = await store.page("acme", None, limit=2, after=after)
        seen += [a.id for a in page.items]
        if page.next is None:
            break
        after = page.next
    assert seen == ids[::-1]  # newest first, every record once, no other tenant's
    pending = await store.page("acme", ApprovalState.PENDING, limit=10, after=None)
    assert [a.id for a in pending.items] == [i for i in ids[::-1] if i != ids[1]]
    only = await store.page("acme", ApprovalState.APPROVED, limit=10, after=None)
    assert [a.id for a in only.items] == [ids[1]] and only.next is None


async def test_pending_count_is_every_tenants_open_records(open_store: Opener) -> None:
    store = await open_store()
    await store.request(draft("a.md"), ttl=TTL, max_pending=10)
    await store.request(draft("b.md", tenant="globex"), ttl=TTL, max_pending=10)
    decided, _ = await store.request(draft("c.md"), ttl=TTL, max_pending=10)
    await decide(store, decided.id, tenant="acme", vote=vote("bob"), approve=True, require_distinct=False)
    # a new instance (another replica) counts what the first wrote
    assert (await open_store()).pending_count() == 2


# -- races, across two instances over one database --------------------------------------------


async def test_consumption_is_exactly_once_across_instances(open_store: Opener) -> None:
    one, two = await open_store(), await open_store()
    d = draft()
    await approved(one, d)
    open_store.widen_races()
    results = await asyncio.gather(*(consume(s, d) for _ in range(10) for s in (one, two)))
    winners = [r for r in results if r is not None]
    assert len(winners) == 1 and winners[0].state is ApprovalState.CONSUMED


async def test_decisions_are_first_wins_across_instances(open_store: Opener) -> None:
    one, two = await open_store(), await open_store()
    record, _ = await one.request(draft(), ttl=TTL, max_pending=10)
    open_store.widen_races()
    results = await asyncio.gather(
        *(
            decide(
                s, record.id, tenant="acme", vote=vote(f"u{i}"), approve=i % 2 == 0, require_distinct=False
            )
            for i in range(10)
            for s in (one, two)
        )
    )
    won = [r for r in results if not isinstance(r, DecisionError)]
    assert len(won) == 1
    assert all(r is DecisionError.NOT_PENDING for r in results if isinstance(r, DecisionError))
    final = await two.get(record.id, "acme")
    assert final is not None and (final.state, final.decided_by) == (won[0].state, won[0].decided_by)


async def test_two_person_rule_counts_distinct_approvers_and_one_no_denies(store: ApprovalStore) -> None:
    record, _ = await store.request(draft(), ttl=TTL, max_pending=10)
    first = await decide(
        store, record.id, tenant="acme", vote=vote("bob", 2), approve=True, require_distinct=False
    )
    assert not isinstance(first, DecisionError)
    assert (first.state, first.approvals, first.required, first.policy_hash) == (
        ApprovalState.PENDING,
        1,
        2,
        None,
    )
    assert await consume(store, draft()) is None  # one yes of two: nothing to write yet
    again = await decide(
        store, record.id, tenant="acme", vote=vote("bob", 2), approve=True, require_distinct=False
    )
    assert again is DecisionError.ALREADY_DECIDED  # the same approver twice is one approver
    second = await decide(
        store, record.id, tenant="acme", vote=vote("carol"), approve=True, require_distinct=False
    )
    assert not isinstance(second, DecisionError)
    # The most any yes asked for stands: carol's decision asking one does not lower it.
    assert (second.state, second.approvals, second.required) == (ApprovalState.APPROVED, 2, 2)
    assert second.policy_hash == HASH and second.public()["approvals"] == 2
    assert [v.approver.id for v in await store.votes(record.id, "acme")] == ["bob", "carol"]
    assert await store.votes(record.id, "globex") == []
    taken = await consume(store, draft())
    assert taken is not None and taken.id == record.id

    other, _ = await store.request(draft("q4.md"), ttl=TTL, max_pending=10)
    await decide(store, other.id, tenant="acme", vote=vote("bob", 2), approve=True, require_distinct=False)
    no = await decide(
        store, other.id, tenant="acme", vote=vote("dan", 2), approve=False, require_distinct=False
    )
    assert not isinstance(no, DecisionError) and no.state is ApprovalState.DENIED


async def test_a_reopened_consumption_keeps_only_the_votes_that_still_hold(store: ApprovalStore) -> None:
    record, _ = await store.request(draft(), ttl=TTL, max_pending=10)
    for who in ("bob", "carol"):
        await decide(store, record.id, tenant="acme", vote=vote(who, 2), approve=True, require_distinct=False)
    taken = await consume(store, draft())
    assert taken is not None and taken.consumed_at is not None
    assert not await store.reopen(record.id, "acme", "someone-else", consumed_at=taken.consumed_at,
                                  keep=[Person(IDP, "carol")], required=2)  # fmt: skip
    assert await store.reopen(
        record.id, "acme", ME, consumed_at=taken.consumed_at, keep=[Person(IDP, "carol")], required=2
    )
    now = await store.get(record.id, "acme")
    assert now is not None and (now.state, now.approvals, now.required, now.policy_hash) == (
        ApprovalState.PENDING, 1, 2, None,
    )  # fmt: skip
    assert [v.approver.id for v in await store.votes(record.id, "acme")] == ["carol"]
    # bob's vote went: he may decide again under the set in force.
    back = await decide(
        store, record.id, tenant="acme", vote=vote("bob", 2), approve=True, require_distinct=False
    )
    assert not isinstance(back, DecisionError) and back.state is ApprovalState.APPROVED


async def test_a_reopened_record_needs_the_count_the_reopen_asked_for(store: ApprovalStore) -> None:
    """Reopened needing 3 with carol's yes kept (cast when 2 were asked): a yes asking fewer
    does not lower it, nor does carol's old count; a count the reopen lowers stands too."""
    record, _ = await store.request(draft(), ttl=TTL, max_pending=10)
    for who in ("bob", "carol"):
        await decide(store, record.id, tenant="acme", vote=vote(who, 2), approve=True, require_distinct=False)
    taken = await consume(store, draft())
    assert taken is not None and taken.consumed_at is not None
    assert await store.reopen(
        record.id, "acme", ME, consumed_at=taken.consumed_at, keep=[Person(IDP, "carol")], required=3
    )
    second = await decide(
        store, record.id, tenant="acme", vote=vote("dan", 1), approve=True, require_distinct=False
    )
    assert not isinstance(second, DecisionError)
    assert (second.state, second.approvals, second.required) == (ApprovalState.PENDING, 2, 3)
    assert await consume(store, draft()) is None  # two yeses of three: nothing to write
    third = await decide(
        store, record.id, tenant="acme", vote=vote("erin", 1), approve=True, require_distinct=False
    )
    assert not isinstance(third, DecisionError)
    assert (third.state, third.approvals, third.required) == (ApprovalState.APPROVED, 3, 3)

    # Lowered: carol's yes asked 3 when cast; the set in force asks 1 of her, so one yes is enough.
    other, _ = await store.request(draft("q4.md"), ttl=TTL, max_pending=10)
    for who in ("bob", "carol"):
        await decide(store, other.id, tenant="acme", vote=vote(who, 3), approve=True, require_distinct=False)
    await decide(store, other.id, tenant="acme", vote=vote("dan", 3), approve=True, require_distinct=False)
    again = await consume(store, draft("q4.md"))
    assert again is not None and again.consumed_at is not None
    assert await store.reopen(
        other.id, "acme", ME, consumed_at=again.consumed_at, keep=[Person(IDP, "carol")], required=2
    )
    last = await decide(
        store, other.id, tenant="acme", vote=vote("erin", 2), approve=True, require_distinct=False
    )
    assert not isinstance(last, DecisionError)
    assert (last.state, last.approvals, last.required) == (ApprovalState.APPROVED, 2, 2)


async def test_two_approvers_at_once_on_two_instances_make_two(open_store: Opener) -> None:
    """Two approvers decide at the same moment on two replicas: each counts the other's yes
    (the record's row lock), so the record is approved with both, never left at one."""
    one, two = await open_store(), await open_store()
    for round_ in range(5):
        record, _ = await one.request(draft(f"r{round_}.md"), ttl=TTL, max_pending=10)
        if round_ == 0:
            open_store.widen_races()
        results = await asyncio.gather(
            decide(one, record.id, tenant="acme", vote=vote("bob", 2), approve=True, require_distinct=False),
            decide(
                two, record.id, tenant="acme", vote=vote("carol", 2), approve=True, require_distinct=False
            ),
        )
        assert sorted((r.state.value, r.approvals) for r in results if not isinstance(r, DecisionError)) == [
            ("approved", 2), ("pending", 1),
        ]  # fmt: skip
        final = await two.get(record.id, "acme")
        assert final is not None and (final.state, final.approvals) == (ApprovalState.APPROVED, 2)


async def test_pending_cap_holds_across_instances_for_both_kinds(open_store: Opener) -> None:
    one, two = await open_store(), await open_store()

    async def ask(i: int) -> bool:
        s = (one, two)[i % 2]
        try:
            if i % 3 == 0:
                await s.record_in_band(f"{i:032x}", draft(f"in{i}.md"), ttl=TTL, max_pending=3)
            else:
                await s.request(draft(f"out{i}.md"), ttl=TTL, max_pending=3)
        except TooManyPending:
            return False
        return True

    created = await asyncio.gather(*(ask(i) for i in range(24)))
    assert sum(created) == 3
    assert len((await one.page("acme", ApprovalState.PENDING, limit=50, after=None)).items) == 3
    # the cap is per tenant
    await two.request(draft(tenant="globex"), ttl=TTL, max_pending=3)


async def test_one_record_per_report_across_instances(open_store: Opener) -> None:
    one, two = await open_store(), await open_store()
    results = await asyncio.gather(
        *(s.request(draft(), ttl=TTL, max_pending=50) for _ in range(5) for s in (one, two))
    )
    assert len({r.id for r, _ in results}) == 1 and sum(created for _, created in results) == 1


async def test_retention_purges_closed_records_once_across_instances(
    open_store: Opener, clock: Clock
) -> None:
    one, two = await open_store(), await open_store()
    closed = 0
    for i in range(30):
        d = draft(f"c{i}.md")
        await approved(one, d)
        await consume(one, d)
        closed += 1
    await one.request(draft("expiring.md"), ttl=60, max_pending=100)
    closed += 1
    clock.now += 120
    open_record, _ = await one.request(draft("open.md"), ttl=TTL, max_pending=100)
    counts = await asyncio.gather(
        one.purge(closed_before=clock.now - 30), two.purge(closed_before=clock.now - 30)
    )
    assert sum(counts) == closed
    left = await two.page("acme", None, limit=100, after=None)
    assert [a.id for a in left.items] == [open_record.id]  # open records are never purged


# -- schema versions ------------------------------------------------------------------------


async def test_sqlite_adopts_a_file_from_before_versioning_and_refuses_a_newer_one(tmp_path: Path) -> None:
    path = tmp_path / "approvals.sqlite3"
    legacy = sqlite3.connect(path)
    legacy.execute(migrations.MIGRATIONS[0].sqlite[0])
    legacy.execute(
        "INSERT INTO approvals VALUES "
        "('x', 'acme', 'a', 'f.md', 's', 1, 'c', 'pending', 1, 9e9, NULL, NULL, NULL)"
    )
    legacy.commit()
    legacy.close()
    store = SqliteApprovalStore(path)
    assert await store.get("x", "acme") is not None
    await store.close()
    db = sqlite3.connect(path)
    assert migrations.sqlite_version(db) == migrations.LATEST
    db.execute("INSERT INTO docbroker_schema VALUES (?, 'future', 0)", (migrations.LATEST + 1,))
    db.commit()
    db.close()
    with pytest.raises(SchemaMismatch, match="newer than this broker"):
        SqliteApprovalStore(path)


async def test_postgres_refuses_an_older_or_newer_schema_and_names_the_command() -> None:
    with fresh_schema() as url:
        with pytest.raises(SchemaMismatch) as older:
            await PostgresApprovalStore.open(pg_settings(url))
        assert str(older.value) == (
            f"the approvals database schema is at version 0, this broker needs {migrations.LATEST}: "
            "run `docbroker db upgrade`"
        )
        # concurrent upgrades (replicas' jobs) apply each migration once
        applied = await asyncio.gather(*(upgraded(url) for _ in range(3)))
        assert sorted(applied) == [[], [], list(range(1, migrations.LATEST + 1))]
        store = await PostgresApprovalStore.open(pg_settings(url))
        await store.close()
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("INSERT INTO docbroker_schema VALUES (%s, 'future', 0)", (migrations.LATEST + 1,))
        with pytest.raises(SchemaMismatch, match="newer than this broker"):
            await PostgresApprovalStore.open(pg_settings(url))


# -- PostgreSQL's failure behaviour -----------------------------------------------------------


async def test_a_statement_timeout_bounds_every_query() -> None:
    with fresh_schema() as url:
        await upgraded(url)
        store = await PostgresApprovalStore.open(pg_settings(url, statement_timeout_seconds=0.5))
        try:
            # Another session holds the tenant's cap lock and never lets go.
            with psycopg.connect(url) as holder:
                holder.execute(
                    "SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))", ("docbroker/approvals/acme",)
                )
                started = time.monotonic()
                with pytest.raises(StoreUnavailable) as exc:
                    await store.request(draft(), ttl=TTL, max_pending=10)
                assert time.monotonic() - started < 3
                assert str(exc.value) == "the approvals database cannot be reached or did not answer in time"
                holder.rollback()
            # and the store goes on once the lock is gone
            _, created = await store.request(draft(), ttl=TTL, max_pending=10)
            assert created
        finally:
            await store.close()


async def test_an_unreachable_database_fails_with_a_fixed_message(tmp_path: Path) -> None:
    url = f"postgresql://docbroker:s3cret-password@/docbroker_test?host={tmp_path}/nowhere"
    started = time.monotonic()
    with pytest.raises(StoreUnavailable) as exc:
        await PostgresApprovalStore.open(pg_settings(url, pool_timeout_seconds=0.5))
    assert time.monotonic() - started < 10
    assert "s3cret" not in str(exc.value) and "nowhere" not in str(exc.value)


# -- settings -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (
            {"DOCBROKER_DATABASE_URL": "mysql://root:s3cret@db/x"},
            "DOCBROKER_DATABASE_URL must be a postgresql:// URL",
        ),
        (
            {"DOCBROKER_DATABASE_URL": "postgresql://u:s3cret@h/db?sslmode=%zz"},
            "is not a valid PostgreSQL URL",
        ),
        ({"DOCBROKER_DATABASE_POOL_MIN": "5", "DOCBROKER_DATABASE_POOL_MAX": "2"}, "must not exceed"),
        (
            {"DOCBROKER_DATABASE_STATEMENT_TIMEOUT": "0"},
            "DOCBROKER_DATABASE_STATEMENT_TIMEOUT must be between",
        ),
    ],
)
def test_database_settings_name_the_variable_never_the_value(extra: dict[str, str], message: str) -> None:
    from broker.settings import Settings, SettingsError

    env = {
        "DOCBROKER_AUTH_ISSUER": "i",
        "DOCBROKER_AUTH_AUDIENCE": "a",
        "DOCBROKER_AUTH_JWKS_FILE": "/x",
        **extra,
    }
    with pytest.raises(SettingsError, match=message) as exc:
        Settings.from_env(env)
    assert "s3cret" not in str(exc.value)


def test_the_database_url_is_not_in_the_settings_repr() -> None:
    settings = DatabaseSettings(url="postgresql://u:s3cret@h/db?sslmode=verify-full")
    assert "s3cret" not in repr(settings)
