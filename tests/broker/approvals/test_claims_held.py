"""An approval a human gave, held by a live broker's claim (issue 24 item 9, DESIGN §9).

Two real replicas on one host, one real PostgreSQL. The tenant's sandbox start waits on a
marker file, so a replica that has consumed an approval is held between the two phases (claim
taken, write not sent) until the test lets it go; the claim's owner is paused with SIGSTOP
where the test needs it alive but still (its lock stays held: it is a live replica).

- The database stops while a holds the claim: the client gets a clean 503; the retry on b once
  the database is back is told to retry later (503), never asked for a second approval; a gives
  the claim back by itself as soon as it can reach the database (no request, no 100 s hold),
  and the retry writes with the human's one approval.
- b holds a claim past its time and is alive on the same host: a never takes it back.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import signal
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx2
import psycopg
import pytest

from broker.testing.replicas import Replica, running_replicas
from tests.broker.pgtest import ThrowAwayCluster, fresh_schema
from tests.broker.support import call_modern, rpc_reply, tool_status, wait_for

NAME, CONTENT = "held-claim.md", "approved once, written once\n"
ARGS = {"filename": NAME, "content": CONTENT}


def held_start_env(marker: Path, **more: str) -> dict[str, str]:
    """The tenant's server starts only once `marker` is gone."""
    wrapper = f'while [ -e {shlex.quote(str(marker))} ]; do sleep 0.05; done; exec "$0" -m server "$@"'
    return {"DOCBROKER_LOCAL_SERVER_COMMAND": shlex.join(["/bin/sh", "-c", wrapper, sys.executable]), **more}


def save(replica: Replica, token: str) -> httpx2.Response:
    with replica.http(token) as http:
        return call_modern(http, "save_report", ARGS)


def approved_save_in_flight(
    owner: Replica, other: Replica, token: str, approver: str
) -> tuple[str, threading.Thread, list[httpx2.Response]]:
    """A save proposed on `owner`, approved on `other`, then sent again to `owner` in a thread
    of its own (it stalls there, its approval consumed, while the sandbox cannot start)."""
    first = tool_status(save(owner, token))
    assert first["status"] == "waiting_approval", first
    approval_id = first["data"]["approval_id"]
    with other.http(approver) as http:
        assert http.get(f"/v1/approvals/{approval_id}").status_code == 200  # read first
        assert http.post(f"/v1/approvals/{approval_id}/approve").status_code == 200
    answers: list[httpx2.Response] = []

    def in_flight() -> None:
        with (
            contextlib.suppress(httpx2.TransportError),
            httpx2.Client(
                base_url=owner.url, headers={"authorization": f"Bearer {token}"}, timeout=120
            ) as http,
        ):
            answers.append(call_modern(http, "save_report", ARGS))

    caller = threading.Thread(target=in_flight, daemon=True)
    caller.start()
    assert wait_for(lambda: consumed_by(owner, approval_id), timeout=20)
    return approval_id, caller, answers


def consumed_by(replica: Replica, approval_id: str) -> bool:
    return any(
        e["event"] == "approval.consumed" and e.get("approval_id") == approval_id
        for e in replica.audit_events()
    )


def last_reason(replica: Replica) -> str | None:
    ends = [e for e in replica.audit_events() if e["event"] == "mcp.request"]
    return ends[-1].get("reason") if ends else None


def trail(replicas: Any, approval_id: str) -> list[tuple[str, str, str | None]]:
    return [
        (e["replica"], e["event"], e.get("reason"))
        for r in replicas
        for e in r.audit_events()
        if e.get("approval_id") == approval_id and e["event"].startswith("approval.")
        and e["event"] not in ("approval.decided", "approval.viewed")
    ]  # fmt: skip


def record(url: str, approval_id: str) -> tuple[str, str | None, float | None]:
    with psycopg.connect(url) as conn:
        row = conn.execute(
            "SELECT state, claimed_by, claim_until FROM approvals WHERE id = %s", (approval_id,)
        ).fetchone()
    assert row is not None
    return row[0], row[1], row[2]


def records_for_the_report(url: str) -> int:
    with psycopg.connect(url) as conn:
        row = conn.execute("SELECT COUNT(*) FROM approvals WHERE filename = %s", (NAME,)).fetchone()
    assert row is not None
    return int(row[0])


@contextlib.contextmanager
def paused(replica: Replica) -> Iterator[None]:
    """SIGSTOP: the replica runs nothing, yet is alive (its process and its lock stay)."""
    assert replica.proc is not None
    pid = replica.proc.pid
    os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(pid, signal.SIGCONT)


def retry_later(replica: Replica, token: str) -> str | None:
    """The client's retry: it must be refused with 503, never answered with a new approval."""
    response = save(replica, token)
    assert response.status_code == 503, response.text
    assert rpc_reply(response)["error"]["message"] == "Approvals unavailable, retry later"
    return last_reason(replica)


@pytest.fixture
def own_cluster() -> Iterator[ThrowAwayCluster]:
    cluster = ThrowAwayCluster()
    try:
        yield cluster
    finally:
        cluster.remove()


def test_an_approval_claimed_when_the_database_went_away_is_used_by_the_retry_not_asked_again(
    tmp_path: Path, own_cluster: ThrowAwayCluster
) -> None:
    marker = tmp_path / "hold-sandbox-start"
    marker.touch()
    # A hold of 60 + 30 + 10 s: any release seen before then is the owner's own, not a timeout.
    env = held_start_env(
        marker,
        DOCBROKER_START_TIMEOUT="60",
        DOCBROKER_DATABASE_POOL_TIMEOUT="1",
        DOCBROKER_DATABASE_STATEMENT_TIMEOUT="1",
    )
    url = own_cluster.url
    with running_replicas(tmp_path, 2, env=env, database_url=url) as replicas:
        a, b = replicas
        token = a.token()
        approver = b.token(subject="carol", scope="reports:approve")
        approval_id, caller, answers = approved_save_in_flight(a, b, token, approver)

        # a holds the claim, waiting for the sandbox: the database goes away before the claim
        # can be made final
        own_cluster.stop_server()
        marker.unlink()
        caller.join(60)
        assert len(answers) == 1 and answers[0].status_code == 503, answers
        assert rpc_reply(answers[0])["error"]["message"] == "Approvals unavailable, retry later"
        assert last_reason(a) == "approval_store_unavailable"
        assert "an unsent approval could not be given back" in a.logs()  # the race was entered

        # The database is back while a cannot act yet: a's claim is live, so b's retry is told
        # to retry later, never given a second approval for the report.
        with paused(a):
            own_cluster.start_server()
            reasons: list[str | None] = []

            def told_to_retry_for_the_claim() -> bool:
                reasons.append(retry_later(b, token))
                return reasons[-1] == "approval_claim_held"

            assert wait_for(told_to_retry_for_the_claim, timeout=20)
            assert set(reasons) <= {"approval_store_unavailable", "approval_claim_held"}, reasons
            state, owner, until = record(url, approval_id)
            assert state == "consumed" and owner is not None and owner.split("/")[1] == "a"
            assert until is not None  # a's claim, not made final
            assert records_for_the_report(url) == 1

        # a gives its claim back by itself, as soon as it reaches the database again
        def released_by_a() -> bool:
            return ("a", "approval.released", "not_forwarded") in trail([a], approval_id)

        assert wait_for(released_by_a, timeout=20)
        assert record(url, approval_id) == ("approved", None, None)

        saved = tool_status(save(b, token))
        assert saved["status"] == "ok", saved
        assert (b.reports("acme") / NAME).read_text() == CONTENT
        assert trail(replicas, approval_id) == [
            ("a", "approval.requested", None),
            ("a", "approval.consumed", None),
            ("a", "approval.released", "not_forwarded"),
            ("b", "approval.consumed", None),
        ]
        assert records_for_the_report(url) == 1  # the human was asked once
        state, owner, until = record(url, approval_id)
        assert (state, owner is not None and owner.split("/")[1], until) == ("consumed", "b", None)


def test_a_live_replica_on_the_same_host_keeps_its_claim_past_its_time(tmp_path: Path) -> None:
    marker = tmp_path / "hold-sandbox-start"
    marker.touch()
    # The shortest hold the settings allow with a call that can still write: 3 + 5 + 10 s.
    env = held_start_env(marker, DOCBROKER_START_TIMEOUT="3", DOCBROKER_CALL_TIMEOUT="5")
    with fresh_schema() as url, running_replicas(tmp_path, 2, env=env, database_url=url) as replicas:
        a, b = replicas
        token = a.token()
        approver = a.token(subject="carol", scope="reports:approve")
        approval_id, caller, _ = approved_save_in_flight(b, a, token, approver)
        with paused(b):
            state, owner, until = record(url, approval_id)
            # b is stopped holding its claim: taken, not made final, not given back
            assert (state, owner is not None and owner.split("/")[1]) == ("consumed", "b")
            assert until is not None
            marker.unlink()  # a could start the sandbox and write, if it took the claim
            assert wait_for(lambda: time.time() > until + 0.5, timeout=30)  # b's time is up

            try:
                assert retry_later(a, token) == "approval_claim_held"
            finally:  # whatever a answered (or not), it must not have taken the claim
                assert ("a", "approval.released", "claim_lost") not in trail([a], approval_id)
            assert record(url, approval_id) == (state, owner, until)  # still b's
        caller.join(60)

        def written() -> bool:
            if (a.reports("acme") / NAME).exists():
                return True
            response = save(a, token)
            return response.status_code == 200 and tool_status(response)["status"] == "ok"

        assert wait_for(written, timeout=30)
        assert (a.reports("acme") / NAME).read_text() == CONTENT
        assert all(reason != "claim_lost" for _, _, reason in trail(replicas, approval_id))
        assert records_for_the_report(url) == 1
        assert record(url, approval_id)[0] == "consumed"
