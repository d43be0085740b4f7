"""Real brokers on a real PostgreSQL (DESIGN §9): the schema checked at start, approvals shared
by replicas and consumed exactly once across them, and the database stopped and started
under a running broker (approvals fail closed with 503, audited; reads go on; no restart).

PostgreSQL is the run's throw-away cluster (a schema per test), or, for the test that stops
the server, a cluster of its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx2
import psycopg
import pytest

from broker.approvals.migrations import LATEST
from broker.master_key import create_master_key
from broker.testing import ROOT, Broker, make_broker
from tests.broker.pgtest import ThrowAwayCluster, fresh_schema
from tests.broker.support import (
    approver,
    call_modern,
    decide,
    open_http,
    rpc_reply,
    tool_status,
    unique,
    wait_for,
)

pytestmark = pytest.mark.anyio
PASSWORD = "hunter2-not-for-logs"  # trust auth ignores it; it must never show up anywhere


def with_password(url: str) -> str:
    return url.replace("postgresql://docbroker@", f"postgresql://docbroker:{PASSWORD}@", 1)


def db_command(broker: Broker, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "broker", "db", *args, "--json"],
        cwd=ROOT,
        env=broker.env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def save(broker: Broker, name: str, content: str) -> dict[str, Any]:
    with open_http(broker, broker.token()) as http:
        return tool_status(call_modern(http, "save_report", {"filename": name, "content": content}))


def search(broker: Broker) -> dict[str, Any]:
    with open_http(broker, broker.token()) as http:
        return tool_status(call_modern(http, "search_documents", {"query": "quarterly"}))


def no_secret_anywhere(broker: Broker) -> None:
    assert PASSWORD not in broker.logs()
    assert PASSWORD not in broker.audit_file.read_text()


@pytest.fixture
def database() -> Iterator[str]:
    with fresh_schema() as url:
        yield with_password(url)


def test_a_broker_waits_not_ready_for_its_schema_until_the_command_migrates_it(
    tmp_path: Path, database: str
) -> None:
    """On a cluster the schema is migrated by a Job of its own while the broker Pods start: a
    broker on an older schema stays alive and Not Ready, says why on /readyz, and starts
    serving once `docbroker db upgrade` has run, without a restart (it used to exit)."""
    broker = make_broker(tmp_path, env={"DOCBROKER_DATABASE_URL": database})
    broker.start()  # /healthz answers: alive (the kubelet's liveness probe passes)
    try:
        ready = httpx2.get(f"{broker.url}/readyz", headers=broker.ops_headers, timeout=5)
        assert ready.status_code == 503
        assert ready.json() == {
            "status": "not_ready",
            "checks": {"approvals_database": {
                "backend": "postgresql", "reachable": True,
                "schema": {"found": 0, "needed": LATEST, "state": "waiting"},
            }},
        }  # fmt: skip
        # without the operators' bearer: ready or not, nothing more
        assert httpx2.get(f"{broker.url}/readyz", timeout=5).json() == {"status": "not_ready"}
        assert httpx2.post(f"{broker.url}/mcp", json={}, timeout=5).status_code == 503
        assert "run `docbroker db upgrade`" in broker.logs()
        status = db_command(broker, "status")
        assert status.returncode == 1 and json.loads(status.stdout)["state"] == "needs upgrade"
        upgrade = db_command(broker, "upgrade")
        assert upgrade.returncode == 0, upgrade.stderr
        assert json.loads(upgrade.stdout) == {
            "backend": "postgresql", "schema_version": LATEST, "broker_version": LATEST, "state": "current",
            "applied": list(range(1, LATEST + 1)),
        }  # fmt: skip
        assert json.loads(db_command(broker, "upgrade").stdout)["applied"] == []  # idempotent
        assert PASSWORD not in upgrade.stdout + upgrade.stderr

        def ready_now() -> bool:
            with contextlib.suppress(httpx2.TransportError):
                return httpx2.get(f"{broker.url}/readyz", timeout=2).status_code == 200
            return False

        assert wait_for(ready_now, timeout=30), broker.logs()[-2000:]
        name = unique()
        waiting = save(broker, name, "kept in PostgreSQL")
        assert waiting["status"] == "waiting_approval"
        assert decide(broker, waiting["data"]["approval_id"]).status_code == 200
        assert save(broker, name, "kept in PostgreSQL")["status"] == "ok"
        assert (broker.reports("acme") / name).read_text() == "kept in PostgreSQL"
        with psycopg.connect(database) as conn:
            row = conn.execute("SELECT state FROM approvals WHERE id = %s", (waiting["data"]["approval_id"],))
            assert row.fetchone() == ("consumed",)
    finally:
        broker.stop()
    no_secret_anywhere(broker)


def test_two_replicas_race_to_consume_one_approval(tmp_path: Path, database: str) -> None:
    key = tmp_path / "master.key"
    create_master_key(key)
    replicas = [
        make_broker(
            tmp_path / name, env={"DOCBROKER_DATABASE_URL": database, "DOCBROKER_MASTER_KEY_FILE": str(key)}
        )
        for name in ("a", "b")
    ]
    assert db_command(replicas[0], "upgrade").returncode == 0
    for replica in replicas:
        replica.start()
    try:
        for replica in replicas:  # each replica's sandbox is up before the race
            assert search(replica)["status"] == "ok"
        name, content = unique("race"), "written once"
        pending = save(replicas[0], name, content)
        approval_id = pending["data"]["approval_id"]
        # approved through replica B, of a request made through replica A
        with approver(replicas[1]) as http:
            shown = http.get(f"/v1/approvals/{approval_id}")
            assert shown.status_code == 200 and shown.json()["content"] == content
        assert decide(replicas[1], approval_id).status_code == 200
        # Each UPDATE holds its row lock a while: the two consumptions really overlap.
        with psycopg.connect(database, autocommit=True) as conn:
            conn.execute(
                "CREATE FUNCTION slow() RETURNS trigger AS $$ BEGIN PERFORM pg_sleep(0.2); "
                "RETURN NEW; END $$ LANGUAGE plpgsql"
            )
            conn.execute(
                "CREATE TRIGGER slow BEFORE UPDATE ON approvals FOR EACH ROW EXECUTE FUNCTION slow()"
            )

        def attempt(replica: Broker) -> str:
            with open_http(replica, replica.token()) as http:
                response = call_modern(http, "save_report", {"filename": name, "content": content})
            if response.status_code == 503:  # the winner's claim, not yet final: retry later
                assert rpc_reply(response)["error"]["message"] == "Approvals unavailable, retry later"
                return "retry_later"
            return str(tool_status(response)["status"])

        async def race() -> list[str]:
            return list(await asyncio.gather(*(asyncio.to_thread(attempt, r) for r in replicas)))

        # The loser finds the approval taken: while the winner's claim is not final it is told
        # to retry later; once the write is on its way, a new approval is asked for.
        statuses = sorted(asyncio.run(race()))
        assert statuses in (["ok", "retry_later"], ["ok", "waiting_approval"]), statuses
        on_disk = [r.reports("acme") / name for r in replicas if (r.reports("acme") / name).exists()]
        assert len(on_disk) == 1 and on_disk[0].read_text() == content
        consumed = [
            e for r in replicas for e in r.audit_events()
            if e["event"] == "approval.consumed" and e.get("approval_id") == approval_id
        ]  # fmt: skip
        assert len(consumed) == 1
    finally:
        for replica in replicas:
            replica.stop()
    for replica in replicas:
        no_secret_anywhere(replica)


@pytest.fixture
def own_cluster() -> Iterator[ThrowAwayCluster]:
    cluster = ThrowAwayCluster()
    try:
        yield cluster
    finally:
        cluster.remove()


def test_database_down_approvals_fail_closed_reads_go_on_and_it_comes_back(
    tmp_path: Path, own_cluster: ThrowAwayCluster
) -> None:
    broker = make_broker(
        tmp_path,
        env={
            "DOCBROKER_DATABASE_URL": with_password(own_cluster.url),
            "DOCBROKER_DATABASE_POOL_TIMEOUT": "1",
            "DOCBROKER_DATABASE_STATEMENT_TIMEOUT": "1",
        },
    )
    (broker.sources("acme")).mkdir(parents=True, exist_ok=True)
    (broker.sources("acme") / "notes.md").write_text("quarterly numbers\n")
    assert db_command(broker, "upgrade").returncode == 0
    broker.start()
    try:
        assert search(broker)["status"] == "ok"
        name = unique("down")
        assert save(broker, name, "before")["status"] == "waiting_approval"
        pid = broker.proc.pid if broker.proc else None

        own_cluster.stop_server()
        started = time.monotonic()
        with open_http(broker, broker.token()) as http:
            response = call_modern(http, "save_report", {"filename": unique(), "content": "while down"})
        assert time.monotonic() - started < 10  # bounded: the pool timeout, not a hang
        assert response.status_code == 503
        assert rpc_reply(response)["error"] == {
            "code": -32001,
            "message": "Approvals unavailable, retry later",
        }
        with approver(broker) as http:
            listing = http.get("/v1/approvals")
        assert (listing.status_code, listing.json()) == (503, {"error": "approvals_unavailable"})
        # reads never touch the database
        assert search(broker)["status"] == "ok"
        with open_http(broker, broker.token()) as http:
            read = tool_status(call_modern(http, "read_document", {"filename": "notes.md"}))
        assert read["status"] == "ok"
        with open_http(broker) as http:  # reported, and the replica stays ready: reads go on
            ready = http.get("/readyz", headers=broker.ops_headers)
        assert ready.status_code == 200
        assert ready.json()["checks"]["approvals_database"] == {"backend": "postgresql", "reachable": False}
        reasons = [
            (e["event"], e["outcome"])
            for e in broker.audit_events()
            if e.get("reason") == "approval_store_unavailable"
        ]
        assert reasons == [("mcp.request", "error"), ("approval.viewed", "error")]

        # Down for longer than the pool's reconnect window (5 s): the store must still come
        # back by itself, on the next request, without a restart.
        time.sleep(max(0.0, 8 - (time.monotonic() - started)))
        own_cluster.start_server()

        def works_again() -> bool:
            with open_http(broker, broker.token()) as http:
                reply = call_modern(http, "save_report", {"filename": name, "content": "before"})
            return reply.status_code == 200

        assert wait_for(works_again, timeout=15)
        assert broker.proc is not None and broker.proc.pid == pid and broker.proc.poll() is None
        with approver(broker) as http:
            assert http.get("/v1/approvals").status_code == 200
        with open_http(broker) as http:
            ready = http.get("/readyz", headers=broker.ops_headers)
            assert ready.json()["checks"]["approvals_database"]["reachable"] is True
    finally:
        broker.stop()
    no_secret_anywhere(broker)
    logs = broker.logs()
    assert "approvals database unavailable" in logs and "approvals database reachable again" in logs
    assert str(own_cluster.dir) not in logs  # psycopg's texts (they name the socket) stay out
