"""Replicas behind a load balancer without affinity (DESIGN §9), audit and limits (issue 17 items
4 and 5): each replica writes its own chain, named by its id, with the id on every line; every
request gets exactly one terminal event, on the replica that served it; `audit verify` over both
replicas' files reports each; a second broker on one chain refuses to start, in one line; a
tenant's limits hold across replicas within the bound docs/operations.md, "Replicas" states.

Real brokers (broker/testing/replicas.py): two `python -m broker serve` processes sharing a data
dir, master key and identity provider, requests spread by a round-robin client.
"""

from __future__ import annotations

import contextlib
import json
import math
import secrets
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx2
import pytest

from broker.policy import Policies, Share, Slot, TenantLimiter, TenantPolicy
from broker.settings import Settings, SettingsError
from broker.testing import ROOT, Broker
from broker.testing.replicas import Replica, RoundRobin, make_replicas
from tests.broker.pgtest import fresh_schema
from tests.broker.support import (
    TERMINAL_EVENTS,
    LegacySession,
    modern_body,
    modern_headers,
    open_http,
    rpc_reply,
    wait_for,
)


def call(lb: RoundRobin, token: str, tool: str, arguments: dict[str, Any]) -> Any:
    body = modern_body("tools/call", {"name": tool, "arguments": arguments})
    return lb.post(token, "/mcp", json=body, headers=modern_headers("tools/call", tool))


def docbroker(broker: Broker, *args: str | Path) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(
        [sys.executable, "-m", "broker", *map(str, args)],
        cwd=ROOT,
        env=broker.env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert "Traceback" not in result.stderr, result.stderr
    return result


def events(replica: Replica) -> list[dict[str, Any]]:
    return replica.audit_events()


# -- item 5: audit across replicas ---------------------------------------------------------------


def test_each_replica_writes_its_own_chain_with_one_terminal_event_per_request_it_served(
    tmp_path: Path,
) -> None:
    # No audit paths given: each replica names its own files by its DOCBROKER_REPLICA_ID.
    replicas = make_replicas(tmp_path, 2, explicit_audit_paths=False)
    a, b = replicas
    with replicas:
        lb = RoundRobin(replicas)
        good, bad = a.token(), "not-a-token"
        for i in range(21):  # an odd count: the replicas serve different numbers
            if i % 3 == 2:
                assert call(lb, bad, "search_documents", {"query": "q"}).status_code == 401
            else:
                reply = rpc_reply(call(lb, good, "search_documents", {"query": "q"}))
                assert reply["result"]["structuredContent"]["status"] == "ok", reply
        assert sorted(lb.served) == [10, 11]
        lb.close()
        pems = [public_key(r, tmp_path) for r in replicas]
    data = a.data_dir
    assert a.audit_file == data / "audit-a.jsonl" and b.audit_file == data / "audit-b.jsonl"
    assert not (data / "audit.jsonl").exists()
    for replica, served in zip(replicas, lb.served, strict=True):
        lines = events(replica)
        assert {e["replica"] for e in lines} == {replica.replica_id}  # every line, checkpoints too
        terminal = [e for e in lines if e["event"] in TERMINAL_EVENTS]
        assert len(terminal) == served
        assert len({e["request_id"] for e in terminal}) == served
    ids = [{e["request_id"] for e in events(r) if e["event"] in TERMINAL_EVENTS} for r in replicas]
    assert not ids[0] & ids[1]  # no request has its terminal event on both

    files = [r.audit_file for r in replicas]
    witnesses = [r.data_dir / f"audit-witness-{r.replica_id}.jsonl" for r in replicas]
    keys = [arg for pem in pems for arg in ("--key", pem)]
    given = [arg for w in witnesses for arg in ("--witness", w)]
    text = docbroker(a, "audit", "verify", *files, *keys, *given)
    assert text.returncode == 0, text.stdout
    per_file = [line for line in text.stdout.splitlines() if line.startswith("audit log OK")]
    assert len(per_file) == 2
    assert any("replica a," in line and str(files[0]) in line for line in per_file)
    assert any("replica b," in line and str(files[1]) in line for line in per_file)
    report = json.loads(docbroker(a, "audit", "verify", *files, *keys, *given, "--json").stdout)
    assert report["ok"] and report["signatures_checked"]
    assert sorted(f["replica"] for f in report["files"]) == ["a", "b"]
    for replica in replicas:  # the OCSF export names the replica as the destination
        export = docbroker(a, "audit", "export", "--format", "ocsf", replica.audit_file)
        exported = [json.loads(line) for line in export.stdout.splitlines()]
        assert len(exported) == len([e for e in events(replica) if not e["event"].startswith("audit.")])
        assert {e["dst_endpoint"]["uid"] for e in exported} == {replica.replica_id}
        assert all(e["metadata"]["uid"].startswith(f"{replica.replica_id}:") for e in exported)


def test_a_second_broker_on_the_same_audit_log_refuses_to_start_in_one_line(tmp_path: Path) -> None:
    # Neither names a replica id: both would write the data dir's one audit.jsonl.
    replicas = make_replicas(tmp_path, 2, explicit_audit_paths=False, env={"DOCBROKER_REPLICA_ID": ""})
    a, b = replicas
    a.audit_path = b.audit_path = a.data_dir / "audit.jsonl"
    a.start()
    try:
        with pytest.raises(RuntimeError, match="broker exited early"):
            b.start()
        said = [line for line in b.logs().splitlines() if line.startswith("docbroker:")]
        assert said == [
            "docbroker: cannot start: the audit log is held by another running broker; give each "
            "replica its own DOCBROKER_REPLICA_ID (its log: audit-<id>.jsonl) or DOCBROKER_AUDIT_LOG"
        ]
        assert "Traceback" not in b.logs()
        lb = RoundRobin([a])
        assert call(lb, "not-a-token", "search_documents", {}).status_code == 401  # a serves on
        lb.close()
    finally:
        replicas.stop()
    assert verify_one(a).returncode == 0  # and its chain is whole: b never wrote into it


def test_replica_id_names_the_audit_files_only_when_given(tmp_path: Path) -> None:
    base = {
        "DOCBROKER_DATA_DIR": str(tmp_path),
        "DOCBROKER_AUTH_ISSUER": "https://idp.test.invalid",
        "DOCBROKER_AUTH_AUDIENCE": "x",
        "DOCBROKER_AUTH_JWKS_FILE": str(tmp_path / "jwks.json"),
    }
    one = Settings.from_env(base).audit
    assert (one.path, one.key_file, one.witness_file) == (
        tmp_path / "audit.jsonl", tmp_path / "audit-signing.key", tmp_path / "audit-witness.jsonl",
    )  # fmt: skip
    named = Settings.from_env(base | {"DOCBROKER_REPLICA_ID": "broker-2"}).audit
    assert (named.path, named.key_file, named.witness_file, named.replica) == (
        tmp_path / "audit-broker-2.jsonl",
        tmp_path / "audit-signing-broker-2.key",
        tmp_path / "audit-witness-broker-2.jsonl",
        "broker-2",
    )
    given = Settings.from_env(
        base | {"DOCBROKER_REPLICA_ID": "broker-2", "DOCBROKER_AUDIT_LOG": str(tmp_path / "x.jsonl")}
    )
    assert given.audit.path == tmp_path / "x.jsonl"
    for bad in ("../../etc/x", "a/b"):
        with pytest.raises(SettingsError, match="DOCBROKER_REPLICA_ID") as err:
            Settings.from_env(base | {"DOCBROKER_REPLICA_ID": bad})
        assert bad not in str(err.value)
    assert Settings.from_env(base).server.replicas == 1
    shared = {"DOCBROKER_DATABASE_URL": "postgresql://docbroker@/docbroker"}  # replicas need one
    assert Settings.from_env(base | shared | {"DOCBROKER_REPLICAS": "3"}).server.replicas == 3
    for bad in ("0", "two", "-1"):
        with pytest.raises(SettingsError, match="DOCBROKER_REPLICAS") as err:
            Settings.from_env(base | shared | {"DOCBROKER_REPLICAS": bad})


def test_a_replica_killed_and_restarted_under_load_fails_no_request(tmp_path: Path) -> None:
    # Each replica with a sandbox of its own (the sandboxes they share are item 3's tests).
    replicas = make_replicas(tmp_path, 2, share_data_dir=False)
    a, b = replicas
    for replica in replicas:
        replica.sources("acme").mkdir(parents=True, exist_ok=True)
        (replica.sources("acme") / "notes.md").write_text("quarterly numbers\n")
    with replicas:
        lb = RoundRobin(replicas)
        token = a.token()
        stop, failures, calls = threading.Event(), [], [0]

        def client() -> None:
            while not stop.is_set():
                try:
                    reply = rpc_reply(call(lb, token, "read_document", {"filename": "notes.md"}))
                    if reply.get("result", {}).get("structuredContent", {}).get("status") != "ok":
                        failures.append(str(reply)[:200])
                except Exception as exc:  # every failure is what the test counts
                    failures.append(type(exc).__name__)
                calls[0] += 1
            lb.close()

        threads = [threading.Thread(target=client) for _ in range(4)]
        for thread in threads:
            thread.start()
        try:
            assert wait_for(lambda: min(lb.served) >= 10, timeout=30)  # under load, on both
            b.kill()
            served_before = lb.served[1]
            b.start()
            assert wait_for(lambda: lb.served[1] >= served_before + 10, timeout=30)  # b serves again
        finally:
            stop.set()
            for thread in threads:
                thread.join()
    assert failures == [] and calls[0] > 20
    assert lb.retries >= 1  # calls b could not answer went to a
    assert lb.served[1] > served_before  # and b serves again after its restart


def test_replicas_on_one_database_share_approvals_and_each_audits_what_it_served(tmp_path: Path) -> None:
    with fresh_schema() as url:
        replicas = make_replicas(tmp_path, 2, database_url=url)
        a, b = replicas
        with replicas:  # `docbroker db upgrade` first, then both
            lb = RoundRobin(replicas)
            token, name = a.token(), f"shared-{secrets.token_hex(4)}.md"
            first = rpc_reply(call(lb, token, "save_report", {"filename": name, "content": "once"}))
            waiting = first["result"]["structuredContent"]
            assert waiting["status"] == "waiting_approval"
            approver = b.token(subject="carol", scope="reports:approve")
            approval = f"/v1/approvals/{waiting['data']['approval_id']}"
            assert lb.get(approver, approval).status_code == 200  # read first (on either replica)
            decided = lb.post(approver, f"{approval}/approve")
            assert decided.status_code == 200
            second = rpc_reply(call(lb, token, "save_report", {"filename": name, "content": "once"}))
            assert second["result"]["structuredContent"]["status"] == "ok"
            lb.close()
        # a proposed (call 1), b showed the content (call 2), a decided (call 3), b consumed
        # (call 4): each in its own log
        assert (a.reports("acme") / name).read_text() == "once"
        mine = {r.replica_id: [e["event"] for e in events(r) if e.get("approval_id")] for r in replicas}
        assert mine == {
            "a": ["approval.requested", "mcp.request", "approval.decided"],
            "b": ["approval.viewed", "approval.consumed", "mcp.request"],
        }


# -- item 4: limits across replicas ----------------------------------------------------------------

RATE, BURST = 6, 4  # per minute; at once
METERED = f"[limits]\nrate_per_minute = {RATE}\nburst = {BURST}\n"


def admitted(lb: RoundRobin, token: str, count: int) -> int:
    """How many of `count` calls the limiter let through (a tool no policy allows: the policy
    refuses it right after the limiter, so no sandbox is involved)."""
    statuses = [call(lb, token, "no_such_tool", {}).status_code for _ in range(count)]
    assert set(statuses) <= {400, 429}, statuses  # 400: the unknown tool's -32602 at 2026-07-28
    return statuses.count(400)


@pytest.fixture
def shared_database() -> Iterator[str]:
    """DOCBROKER_REPLICAS above 1 runs on a shared database only (SQLite is refused, issue 38)."""
    with fresh_schema() as url:
        yield url


def test_a_tenants_limit_holds_across_two_replicas_within_the_stated_bound(
    tmp_path: Path, shared_database: str
) -> None:
    replicas = make_replicas(
        tmp_path,
        2,
        env={"DOCBROKER_REPLICAS": "2"},
        tenants=("metered", "pinned"),
        limits=METERED,
        database_url=shared_database,
    )
    a = replicas[0]
    with replicas:
        started = time.monotonic()
        spread = RoundRobin(replicas)
        got = admitted(spread, a.token(tenant="metered"), 16)
        # All of one tenant's traffic on one replica: 1/N of the limit.
        pinned = RoundRobin([a])
        got_pinned = admitted(pinned, a.token(tenant="pinned"), 8)
        elapsed = time.monotonic() - started
        spread.close()
        pinned.close()
    # docs/operations.md, "Replicas": at most burst + rate x time (+ N - 1 of rounding) across N replicas.
    share_burst, share_rate = math.ceil(BURST / 2), math.ceil(RATE / 2) / 60
    refill = math.floor(elapsed * share_rate) + 1  # a token may come due during the run, per replica
    assert 2 * share_burst <= got <= 2 * (share_burst + refill), (got, elapsed)
    assert got <= BURST + 1 + 2 * refill  # the tenant's own burst, within rounding and refill
    assert share_burst <= got_pinned <= share_burst + refill, (got_pinned, elapsed)
    # and each replica's audit says the same: its denials are its own
    limited = [
        e for r in replicas for e in events(r)
        if e["event"] in TERMINAL_EVENTS and e.get("reason") == "rate_limited"
    ]  # fmt: skip
    assert len(limited) == (16 - got) + (8 - got_pinned)


def test_a_tenants_stream_cap_is_shared_out_across_two_replicas(tmp_path: Path, shared_database: str) -> None:
    # max_streams = 2 over 2 replicas: one standing GET stream on each, two in all. (A data dir
    # each: a sandbox of its own, so this does not depend on the sandboxes replicas share.) The
    # request cap is shared out by the same Share.of (its unit test below).
    limits = "[limits]\nrate_per_minute = 100000\nburst = 10000\nmax_streams = 2\n"
    replicas = make_replicas(
        tmp_path,
        2,
        env={"DOCBROKER_REPLICAS": "2"},
        limits=limits,
        share_data_dir=False,
        database_url=shared_database,
    )
    listing = {"jsonrpc": "2.0", "id": 5, "method": "tools/list"}
    with replicas, contextlib.ExitStack() as stack:
        sessions = [LegacySession(stack.enter_context(open_http(r, r.token()))) for r in replicas]
        others = [stack.enter_context(open_http(r, r.token())) for r in replicas]

        def stream(k: int, client: httpx2.Client) -> int:
            """Replica k's standing GET stream for its session, held until the test ends."""
            headers = {**sessions[k].headers(), "accept": "text/event-stream"}
            return stack.enter_context(client.stream("GET", "/mcp", headers=headers)).status_code

        def hold(k: int) -> None:
            assert stream(k, stack.enter_context(open_http(replicas[k], replicas[k].token()))) == 200

        assert [s.post(listing).status_code for s in sessions] == [200, 200]
        hold(0)
        assert stream(0, others[0]) == 429  # a's share (1) is in use
        hold(1)  # b's is not
        assert stream(1, stack.enter_context(open_http(replicas[1], replicas[1].token()))) == 429
        assert [s.post(listing).status_code for s in sessions] == [200, 200]  # streams only


def policies_of(**limits: int) -> Policies:
    return Policies({"t": TenantPolicy(tenant="t", **limits)})


def test_share_is_the_ceiling_of_each_limit_over_the_replicas_and_never_zero() -> None:
    policy = TenantPolicy(tenant="t", rate_per_minute=601, burst=60, max_concurrent=1, max_streams=9)
    assert Share.of(policy, 1) == Share(601, 60, 1, 9)
    assert Share.of(policy, 2) == Share(301, 30, 1, 5)
    assert Share.of(policy, 7) == Share(86, 9, 1, 2)
    assert Share.of(policy, 1000) == Share(1, 1, 1, 1)


def test_each_replica_admits_its_share_of_burst_concurrency_and_streams() -> None:
    now = [0.0]
    limiter = TenantLimiter(
        policies_of(rate_per_minute=60, burst=10, max_concurrent=4, max_streams=7), lambda: now[0], replicas=3
    )
    assert [limiter.take("t") for _ in range(5)][:4] == [0.0] * 4  # ceil(10 / 3) = 4
    assert limiter.take("t") > 0
    now[0] += 3.0  # ceil(60 / 3) = 20 a minute: one token every 3 s
    assert limiter.take("t") == 0.0 and limiter.take("t") > 0
    assert [limiter.enter("t") for _ in range(3)] == [True, True, False]  # ceil(4 / 3) = 2
    limiter.leave("t")
    assert limiter.enter("t")
    # streams have their own cap: the requests' slots, all held, do not count against it
    assert [limiter.enter("t", Slot.STREAM) for _ in range(4)] == [True, True, True, False]  # ceil(7 / 3)
    limiter.leave("t", Slot.STREAM)
    assert limiter.enter("t", Slot.STREAM) and not limiter.enter("t")
    with pytest.raises(ValueError):
        TenantLimiter(policies_of(), replicas=0)


# -- helpers ------------------------------------------------------------------------------------


def public_key(replica: Replica, tmp_path: Path) -> Path:
    result = docbroker(replica, "audit", "key")
    assert result.returncode == 0 and result.stdout.startswith("-----BEGIN PUBLIC KEY-----"), result.stderr
    path = tmp_path / f"{replica.replica_id}.pub.pem"
    path.write_text(result.stdout)
    return path


def verify_one(replica: Replica) -> subprocess.CompletedProcess[str]:
    return docbroker(replica, "audit", "verify", replica.audit_file)
