"""Replicas share one sandbox per tenant and never fight over it (issue 17 item 3, DESIGN §9).

Two or three real brokers (`python -m broker serve`) on one host share a data dir and a master
key, on the local runtime (the fast path: a sandbox is a process found by its pid file). Each
test watches what an operator would: the tenant's server processes, each replica's own audit
file, and what clients get back.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx2
import psycopg

from broker.testing import free_port, make_broker
from broker.testing.replicas import Replica, RoundRobin, running_replicas
from tests.broker.pgtest import fresh_schema
from tests.broker.support import (
    LegacySession,
    call_modern,
    gone,
    modern_body,
    modern_headers,
    server_pids,
    tool_status,
    wait_for,
)

SEARCH = ("search_documents", {"query": "shared"})


def seed(replica: Replica, tenant: str = "acme") -> None:
    sources = replica.sources(tenant)
    sources.mkdir(parents=True, exist_ok=True)
    (sources / "notes.md").write_text("a shared sandbox\n")


def search(replica: Replica, token: str) -> dict[str, Any]:
    with replica.http(token) as http:
        return tool_status(call_modern(http, *SEARCH))


def events(replica: Replica, name: str, tenant: str = "acme") -> list[dict[str, Any]]:
    return [e for e in replica.audit_events() if e["event"] == name and e.get("tenant") == tenant]


def only_pid(replica: Replica, tenant: str = "acme") -> int:
    pids = server_pids(replica, tenant)
    assert len(pids) == 1, pids
    return pids[0]


def sandboxes_running(replica: Replica) -> int:
    """The replica's own count of running sandboxes, as its /metrics shows it."""
    with replica.http() as http:
        text = http.get("/metrics", headers=replica.ops_headers).text
    (line,) = [x for x in text.splitlines() if x.startswith("docbroker_sandboxes_running ")]
    return int(float(line.split()[1]))


def test_a_create_race_ends_with_one_sandbox_both_serving(tmp_path: Path) -> None:
    with running_replicas(tmp_path, 3) as replicas:
        seed(replicas[0])
        token = replicas[0].token()
        start = threading.Barrier(6)

        def first_call(replica: Replica) -> dict[str, Any]:
            start.wait()
            return search(replica, token)

        # Every replica's first call for the tenant at once, two each: all of them start it.
        with ThreadPoolExecutor(6) as pool:
            results = list(pool.map(first_call, [r for r in replicas for _ in range(2)]))
        assert [r["status"] for r in results] == ["ok"] * 6, results
        pid = only_pid(replicas[0])
        started = [e for r in replicas for e in events(r, "sandbox.started")]
        assert len(started) == 1, started
        # And every replica keeps serving from that one.
        for replica in replicas:
            assert search(replica, token)["status"] == "ok"
        assert server_pids(replicas[0], "acme") == [pid]


def test_an_idle_replica_does_not_reap_the_sandbox_another_is_busy_with(tmp_path: Path) -> None:
    with running_replicas(tmp_path, 2, env={"DOCBROKER_IDLE_TIMEOUT": "2"}) as replicas:
        a, b = replicas
        seed(a)
        token = a.token()
        assert search(a, token)["status"] == "ok"  # a starts it, then sits idle
        pid = only_pid(a)
        # b keeps it busy for three idle timeouts (and holds a long call's lease meanwhile).
        deadline = time.monotonic() + 6.5
        while time.monotonic() < deadline:
            assert search(b, token)["status"] == "ok"
            assert server_pids(a, "acme") == [pid]
            time.sleep(0.3)
        assert events(a, "sandbox.stopped") == [] and events(b, "sandbox.stopped") == []
        # Once nobody uses it, it is reaped all the same (by whichever replica sees it first).
        assert wait_for(lambda: gone(pid), timeout=15)

        def stopped() -> list[str]:
            return [e["reason"] for r in replicas for e in events(r, "sandbox.stopped")]

        assert wait_for(lambda: stopped() != [], timeout=5)
        # Both reapers have had their turn on it: each replica has let it go (one stopped it,
        # the other found it gone), and only one audited a stop.
        assert wait_for(lambda: all(sandboxes_running(r) == 0 for r in replicas), timeout=15)
        assert stopped() == ["idle"]


def test_a_replica_killed_and_restarted_adopts_and_loses_nothing(tmp_path: Path) -> None:
    with running_replicas(tmp_path, 2) as replicas:
        a, b = replicas
        seed(a)
        token = a.token()
        assert search(a, token)["status"] == "ok"
        pid = only_pid(a)
        failures: list[str] = []
        served = [0]
        stop = threading.Event()

        def load() -> None:
            lb = RoundRobin(replicas)
            while not stop.is_set():
                try:
                    reply = tool_status(
                        lb.post(
                            token,
                            "/mcp",
                            json=modern_body("tools/call", {"name": SEARCH[0], "arguments": SEARCH[1]}),
                            headers=modern_headers("tools/call", SEARCH[0]),
                        )
                    )
                    served[0] += 1
                    if reply["status"] != "ok":
                        failures.append(str(reply["status"]))
                except Exception as exc:  # every failure is one the test counts
                    failures.append(type(exc).__name__)
            lb.close()

        clients = [threading.Thread(target=load, daemon=True) for _ in range(4)]
        for client in clients:
            client.start()

        def served_by_a() -> int:
            return len([e for e in a.audit_events() if e["event"] == "mcp.request"])

        try:
            assert wait_for(lambda: served[0] >= 10 and served_by_a() >= 5, timeout=30)  # under load
            a.kill()  # mid-load: calls in flight on a are retried on b by the load balancer
            mark = served[0]
            assert wait_for(lambda: served[0] >= mark + 10, timeout=30)  # b alone serves meanwhile
            assert server_pids(a, "acme") == [pid]  # the sandbox outlives the replica that started it
            a.start()  # its start-up adopts the sandbox b is using; it removes nothing
            mark = served_by_a()
            assert wait_for(lambda: served_by_a() >= mark + 5, timeout=30)  # and a serves again
        finally:
            stop.set()
            for client in clients:
                client.join()
        assert failures == [], failures
        assert served[0] > 20
        assert server_pids(a, "acme") == [pid]
        assert search(a, token)["status"] == "ok" and search(b, token)["status"] == "ok"
        assert server_pids(a, "acme") == [pid]
        assert len([e for r in replicas for e in events(r, "sandbox.started")]) == 1
        assert [e for r in replicas for e in events(r, "sandbox.stopped")] == []


def test_a_legacy_session_continues_through_another_replica(tmp_path: Path) -> None:
    with running_replicas(tmp_path, 2) as replicas:
        a, b = replicas
        seed(a)
        token = a.token()
        with a.http(token) as http_a, b.http(token) as http_b:
            session = LegacySession(http_a)  # the handshake on a
            assert tool_status(session.call(*SEARCH))["status"] == "ok"
            pid = only_pid(a)
            # The next requests of that session reach b: the same sandbox serves them.
            for _ in range(3):
                assert tool_status(session.call(*SEARCH, http=http_b))["status"] == "ok"
            assert server_pids(a, "acme") == [pid]
        # On b still bound to its principal: another subject of the tenant gets 404.
        with b.http(a.token(subject="mallory")) as other:
            assert session.call(*SEARCH, http=other).status_code == 404


def test_a_clean_shutdown_leaves_the_shared_sandbox_to_the_replica_still_running(tmp_path: Path) -> None:
    with running_replicas(tmp_path, 2) as replicas:
        a, b = replicas
        seed(a)
        token = a.token()
        assert search(a, token)["status"] == "ok"
        pid = only_pid(a)
        a.stop()  # SIGTERM: a peer still runs, so the sandbox stays
        assert server_pids(b, "acme") == [pid]
        assert search(b, token)["status"] == "ok"
        b.stop()  # the last one out stops it, though it never started it
        assert wait_for(lambda: gone(pid), timeout=10)


def test_a_second_broker_with_the_same_replica_id_refuses_to_start(tmp_path: Path) -> None:
    with running_replicas(tmp_path, 1) as replicas:
        first = replicas[0]
        port = free_port()
        twin = Replica(
            url=f"http://127.0.0.1:{port}",
            data_dir=first.data_dir,
            log_file=tmp_path / "twin.log",
            # Its own audit files: what refuses it is the replica lock, not the audit log's.
            env={
                **first.env,
                "DOCBROKER_PORT": str(port),
                "DOCBROKER_AUDIT_LOG": str(tmp_path / "twin-audit.jsonl"),
                "DOCBROKER_AUDIT_KEY_FILE": str(tmp_path / "twin.key"),
                "DOCBROKER_AUDIT_WITNESS_FILE": str(tmp_path / "twin-witness.jsonl"),
            },
            private_key=first.private_key,
            kid=first.kid,
            replica_id=first.replica_id,
        )
        try:
            twin.start()
        except RuntimeError:
            log = twin.logs()
            assert "another broker with this DOCBROKER_REPLICA_ID runs on this data dir" in log
            assert "Traceback" not in log
        else:
            twin.stop()
            raise AssertionError("a second broker with the same replica id started")
        assert search(first, first.token())["status"] == "ok"


def approved_save_in_flight(
    a: Replica, b: Replica, token: str, approver: str, args: dict[str, str]
) -> tuple[str, threading.Thread]:
    """A save proposed on a and approved on b, then sent again to a in a thread of its own
    (a is about to be killed: the client sees its connection end)."""
    with a.http(token) as http:
        first = tool_status(call_modern(http, "save_report", args))
    assert first["status"] == "waiting_approval"
    approval_id = first["data"]["approval_id"]
    with b.http(approver) as http:
        assert http.get(f"/v1/approvals/{approval_id}").status_code == 200  # read first
        assert http.post(f"/v1/approvals/{approval_id}/approve").status_code == 200

    def doomed_save() -> None:
        with contextlib.suppress(httpx2.TransportError), a.http(token) as http:
            call_modern(http, "save_report", args)

    caller = threading.Thread(target=doomed_save, daemon=True)
    caller.start()
    return approval_id, caller


def test_a_replica_killed_mid_save_the_retry_on_another_works_and_the_approval_is_spent_once(
    tmp_path: Path,
) -> None:
    """A save in flight on a when a is SIGKILLed: the approval it consumed is spent (once, by a,
    never again by b); the retry on b asks for a new approval and, approved, is saved; the bytes
    the killed call left in the drop-box are quarantined, never accepted unverified."""
    hostile = Path(__file__).resolve().parents[3] / "tests" / "fixtures" / "hostile_server.py"
    env = {
        "DOCBROKER_LOCAL_SERVER_COMMAND": shlex.join([sys.executable, str(hostile)]),
        "DOCBROKER_CALL_TIMEOUT": "60",
    }
    with (
        fresh_schema() as url,
        running_replicas(tmp_path, 2, tenants=("planting",), env=env, database_url=url) as replicas,
    ):
        a, b = replicas
        token = a.token("planting")
        name, content = "midsave-q3.md", "written, never answered\n"
        args = {"filename": name, "content": content}
        approval_id, caller = approved_save_in_flight(a, b, token, token, args)
        dropbox = a.data_dir / "tenants" / "planting" / "docs" / "reports"
        assert wait_for(
            lambda: dropbox.is_dir() and name in os.listdir(dropbox), timeout=20
        )  # written; now it stalls
        a.kill()
        caller.join(10)

        with b.http(token) as http:  # the client's retry, on the other replica
            retry = tool_status(call_modern(http, "save_report", args))
        assert retry["status"] == "waiting_approval", retry
        assert retry["data"]["approval_id"] != approval_id
        consumed = [e for r in replicas for e in r.audit_events() if e["event"] == "approval.consumed"]
        assert [(e["approval_id"], e["replica"]) for e in consumed] == [(approval_id, "a")], consumed
        with psycopg.connect(url) as conn:
            state = conn.execute("SELECT state FROM approvals WHERE id = %s", (approval_id,)).fetchone()
        assert state == ("consumed",)

        with b.http(token) as http:
            assert http.get(f"/v1/approvals/{retry['data']['approval_id']}").status_code == 200  # read first
            assert http.post(f"/v1/approvals/{retry['data']['approval_id']}/approve").status_code == 200
            saved = tool_status(call_modern(http, "save_report", args))
        assert saved["status"] == "ok", saved
        assert (b.reports("planting") / name).read_text() == content
        quarantine = b.data_dir / "tenants" / "planting" / "quarantine"
        assert [p.name.rsplit(".", 1)[0] for p in quarantine.iterdir()] == [name]
        assert os.listdir(dropbox) == []


def test_a_replica_killed_after_consuming_an_approval_before_sending_the_write_loses_nothing(
    tmp_path: Path,
) -> None:
    """Consumption has two phases (DESIGN §9): a is SIGKILLed while it holds a consumed approval
    and waits for the tenant's sandbox to start, so no byte of the write has left. b's retry
    takes the dead replica's claim back (audited `approval.released`, `claim_lost`) and writes
    the report with the human's one approval: nothing asked twice, nothing written twice."""
    held, waiting = tmp_path / "hold-sandbox-start", tmp_path / "sandbox-start-held"
    held.touch()
    # The tenant's server starts only once the marker is gone: a stalls between the two phases.
    # `waiting` shows the start has begun and is held.
    wrapper = (
        f": > {shlex.quote(str(waiting))}; while [ -e {shlex.quote(str(held))} ]; do sleep 0.05; done; "
        'exec "$0" -m server "$@"'
    )
    env = {
        "DOCBROKER_LOCAL_SERVER_COMMAND": shlex.join(["/bin/sh", "-c", wrapper, sys.executable]),
        "DOCBROKER_START_TIMEOUT": "60",
    }
    with (
        fresh_schema() as url,
        running_replicas(tmp_path, 2, env=env, database_url=url) as replicas,
    ):
        a, b = replicas
        token = a.token()
        name, content = "two-phase.md", "approved once, written once\n"
        args = {"filename": name, "content": content}
        approver = b.token(subject="carol", scope="reports:approve")
        approval_id, caller = approved_save_in_flight(a, b, token, approver, args)
        assert wait_for(lambda: any(e["event"] == "approval.consumed" for e in a.audit_events()), timeout=20)
        # a holds the consumed approval and waits for the sandbox, whose start is held: the
        # write cannot have been sent (the race is entered).
        assert wait_for(waiting.exists, timeout=20)
        assert not any(e["event"] == "sandbox.started" for e in a.audit_events())
        a.kill()
        caller.join(10)
        held.unlink()

        with b.http(token) as http:  # the client's retry, on the other replica
            retry = tool_status(call_modern(http, "save_report", args))
        assert retry["status"] == "ok", retry
        assert (b.reports("acme") / name).read_text() == content
        trail = [
            (e["replica"], e["event"], e.get("reason"))
            for r in replicas
            for e in r.audit_events()
            if e.get("approval_id") == approval_id and e["event"].startswith("approval.")
            and e["event"] not in ("approval.decided", "approval.viewed")
        ]  # fmt: skip
        assert trail == [
            ("a", "approval.requested", None),
            ("a", "approval.consumed", None),
            ("b", "approval.released", "claim_lost"),
            ("b", "approval.consumed", None),
        ], trail
        with psycopg.connect(url) as conn:
            query = "SELECT state, claimed_by, claim_until FROM approvals WHERE id = %s"
            state, owner, until = conn.execute(query, (approval_id,)).fetchone()
        assert (state, owner.split("/")[1], until) == ("consumed", "b", None)  # spent, by b, confirmed
        with b.http(token) as http:  # and the approval is not there for a third write
            again = tool_status(call_modern(http, "save_report", args))
        assert again["status"] == "rejected", again


def test_an_instance_name_that_is_no_dns_label_is_refused_in_one_line(tmp_path: Path) -> None:
    broker = make_broker(tmp_path, env={"DOCBROKER_INSTANCE": "Prod_1/../x"})
    try:
        broker.start()
    except RuntimeError:
        log = broker.logs()
        assert "DOCBROKER_INSTANCE must be 1-32 of a-z 0-9 -" in log
        assert "Traceback" not in log and "Prod_1" not in log
    else:
        broker.stop()
        raise AssertionError("a broker started with an instance name that is no DNS label")
