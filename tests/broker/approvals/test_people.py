"""A person is (issuer, id) in the approvals store too (issue 34 item 1), on both stores.

Two people whose providers gave them the same id are two approvers; the requester is its
person, so an approver of another issuer with the requester's id is not the requester; a
record from before issuers were stored (migration 6) keeps an unknown issuer, which refuses
self-approval whatever the approver's issuer and still lets its requester's save take it.
"""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path

import psycopg
import pytest

from broker.approvals import migrations
from broker.approvals.sqlite_store import SqliteApprovalStore
from broker.approvals.store import ApprovalStore, DecisionError
from broker.types import ApprovalState, Person
from tests.broker.approvals.test_store import (  # noqa: F401 (fixtures)
    IDP,
    TTL,
    Opener,
    clock,
    consume,
    decide,
    draft,
    open_store,
    pg_settings,
    store,
    vote,
)
from tests.broker.pgtest import fresh_schema

pytestmark = pytest.mark.anyio
OTHER = "https://other-idp.example"


async def test_one_id_at_two_issuers_is_two_approvers(store: ApprovalStore) -> None:  # noqa: F811
    record, _ = await store.request(draft(), ttl=TTL, max_pending=10)
    first = await decide(
        store, record.id, tenant="acme", vote=vote("bob", required=2), approve=True, require_distinct=True
    )
    assert not isinstance(first, DecisionError) and first.state is ApprovalState.PENDING
    other_bob = vote("bob", required=2, issuer=OTHER)
    second = await decide(
        store, record.id, tenant="acme", vote=other_bob, approve=True, require_distinct=True
    )
    assert not isinstance(second, DecisionError), second  # was: already_decided
    assert (second.state, second.approvals) == (ApprovalState.APPROVED, 2)
    assert {v.approver for v in await store.votes(record.id, "acme")} == {
        Person(IDP, "bob"),
        Person(OTHER, "bob"),
    }
    again = await decide(
        store, record.id, tenant="acme", vote=vote("bob", issuer=OTHER), approve=True, require_distinct=True
    )
    assert again is DecisionError.NOT_PENDING


async def test_the_requester_is_a_person(store: ApprovalStore) -> None:  # noqa: F811
    record, _ = await store.request(draft(who="alice"), ttl=TTL, max_pending=10)
    assert record.requester == Person(IDP, "alice")
    assert record.public()["requester_issuer"] == IDP
    same = await decide(
        store, record.id, tenant="acme", vote=vote("alice"), approve=True, require_distinct=True
    )
    assert same is DecisionError.SAME_PERSON
    # another issuer's "alice" is someone else
    other = await decide(
        store, record.id, tenant="acme", vote=vote("alice", issuer=OTHER), approve=True, require_distinct=True
    )
    assert not isinstance(other, DecisionError) and other.state is ApprovalState.APPROVED
    # a save is its requester's: the same id at another issuer does not take the approval
    mine = draft(who="alice")
    stranger = type(mine)(
        mine.tenant, Person(OTHER, "alice"), mine.filename, mine.content, mine.sha256, mine.size
    )
    assert await consume(store, stranger) is None
    taken = await consume(store, mine)
    assert taken is not None and taken.id == record.id


# -- records from before issuers were stored (migration 6) -----------------------------------

_V5_ROWS = (
    "INSERT INTO approvals (id, tenant, requester, filename, sha256, bytes, content, state, created_at, "
    "expires_at, approvals, required) VALUES ({p}, 'acme', 'alice', {p}, {p}, {p}, {p}, 'pending', {p}, {p}, "
    "0, 2)",
    "INSERT INTO approval_votes (approval_id, approver, issuer, groups, scopes, approve, required, "
    "policy_hash, decided_at) VALUES ({p}, 'carol', {p}, '[]', '[\"reports:approve\"]', {t}, 2, {p}, {p})",
)


def _v5_params(approval_id: str) -> list[tuple[object, ...]]:
    d, now = draft(who="alice"), time.time()
    return [
        (approval_id, d.filename, d.sha256, d.size, d.content, now, now + TTL),
        (approval_id, IDP, "a" * 64, now),
    ]


async def _check_legacy(opened: ApprovalStore, approval_id: str) -> None:
    store = opened  # noqa: F811
    record = await store.get(approval_id, "acme")
    assert record is not None and record.requester == Person("", "alice")
    # Its requester's issuer is unknown: an "alice" of any issuer is refused as the requester.
    for issuer in (IDP, OTHER):
        alice = vote("alice", required=2, issuer=issuer)
        refused = await decide(
            store, approval_id, tenant="acme", vote=alice, approve=True, require_distinct=True
        )
        assert refused is DecisionError.SAME_PERSON
    # The vote cast before counts as its person's: carol of IDP again is already counted.
    assert (
        await decide(
            store,
            approval_id,
            tenant="acme",
            vote=vote("carol", required=2),
            approve=True,
            require_distinct=True,
        )
        is DecisionError.ALREADY_DECIDED
    )
    decided = await decide(
        store, approval_id, tenant="acme", vote=vote("dave", required=2), approve=True, require_distinct=True
    )
    assert not isinstance(decided, DecisionError) and decided.state is ApprovalState.APPROVED
    taken = await consume(store, draft(who="alice"))  # the requester's save still takes it
    assert taken is not None and taken.id == approval_id


async def test_sqlite_records_from_before_people_migrate(tmp_path: Path) -> None:
    path = tmp_path / "approvals.sqlite3"
    db = sqlite3.connect(path, isolation_level=None)
    db.execute("PRAGMA foreign_keys=ON")
    db.execute(migrations._SQLITE_TABLE)
    for migration in migrations.MIGRATIONS[:5]:
        for statement in migration.sqlite:
            db.execute(statement)
        db.execute("INSERT INTO docbroker_schema VALUES (?, ?, 0)", (migration.version, migration.name))
    for statement, params in zip(_V5_ROWS, _v5_params("b" * 32), strict=True):
        db.execute(statement.format(p="?", t="1"), params)
    db.close()
    opened = SqliteApprovalStore(path)
    try:
        await _check_legacy(opened, "b" * 32)
    finally:
        await opened.close()


async def test_postgres_records_from_before_people_migrate() -> None:
    from broker.approvals.postgres_store import PostgresApprovalStore

    with fresh_schema() as url:
        with psycopg.connect(url, autocommit=True) as conn, conn.transaction():
            conn.execute(migrations._PG_TABLE)
            for migration in migrations.MIGRATIONS[:5]:
                for statement in migration.postgres:
                    conn.execute(statement)
                conn.execute(
                    "INSERT INTO docbroker_schema VALUES (%s, %s, 0)", (migration.version, migration.name)
                )
            for statement, params in zip(_V5_ROWS, _v5_params("c" * 32), strict=True):
                conn.execute(statement.format(p="%s", t="true"), params)
        upgrader = await PostgresApprovalStore.open(pg_settings(url), check_schema=False)
        try:
            assert await upgrader.upgrade() == list(range(6, migrations.LATEST + 1))
        finally:
            await upgrader.close()
        opened = await PostgresApprovalStore.open(pg_settings(url))
        try:
            await _check_legacy(opened, "c" * 32)
        finally:
            await opened.close()


# -- the content is seen before it is approved (issue 34 item 9) -------------------------------


async def test_a_yes_counts_only_from_a_person_the_content_was_shown_to(store: ApprovalStore) -> None:  # noqa: F811
    record, _ = await store.request(draft(), ttl=TTL, max_pending=10)
    unseen = await store.decide(
        record.id, tenant="acme", vote=vote("bob"), approve=True, require_distinct=False
    )
    assert unseen is DecisionError.CONTENT_NOT_VIEWED
    await store.viewed(record.id, "globex", Person(IDP, "bob"))  # another tenant's view: none
    await store.viewed(record.id, "acme", Person(OTHER, "bob"))  # another person's view
    assert (
        await store.decide(record.id, tenant="acme", vote=vote("bob"), approve=True, require_distinct=False)
        is DecisionError.CONTENT_NOT_VIEWED
    )
    await store.viewed(record.id, "acme", Person(IDP, "bob"))
    await store.viewed(record.id, "acme", Person(IDP, "bob"))  # again: still one view
    seen = await store.decide(
        record.id, tenant="acme", vote=vote("bob"), approve=True, require_distinct=False
    )
    assert not isinstance(seen, DecisionError) and seen.state is ApprovalState.APPROVED
    # a "no" needs no reading: refusing what one has not read is always safe
    other, _ = await store.request(draft("other.md"), ttl=TTL, max_pending=10)
    no = await store.decide(other.id, tenant="acme", vote=vote("bob"), approve=False, require_distinct=False)
    assert not isinstance(no, DecisionError) and no.state is ApprovalState.DENIED
