"""The audit log of a real broker (DESIGN §6): one terminal event per request, a hash chain that
`docbroker audit verify` checks (and that points at the line an attacker changed), and a
broker that refuses calls when the log cannot be written.

The failing-sink tests own their broker: one writes its log to /dev/full (every write fails
from the start), the other to a small tmpfs that the test fills while the broker runs.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from broker.audit import verify_file
from broker.testing import ROOT, Broker, make_broker, structured
from tests.broker.support import (
    LegacySession,
    approver,
    call_modern,
    decide,
    events_since,
    last_seq,
    modern_body,
    modern_headers,
    open_http,
    open_mcp,
    post_modern,
    rpc_reply,
    unique,
)

pytestmark = pytest.mark.anyio


def verify_cli(path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "broker", "audit", "verify", str(path)],
        cwd=ROOT,
        env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


# -- one terminal event per request -------------------------------------------------------------


def test_every_request_gets_exactly_one_terminal_event(broker: Broker) -> None:
    before = last_seq(broker)
    token = broker.token()
    requests = 0
    with open_http(broker, token) as http:
        for send in (
            lambda: post_modern(http, "tools/list"),  # ok
            lambda: call_modern(http, "read_document", {"filename": "nope.md"}),  # tool rejected
            lambda: call_modern(http, "no_such_tool", {}),  # policy denied
            lambda: call_modern(http, "save_report", {"filename": unique(), "content": "x"}),  # waiting
            lambda: post_modern(http, "resources/list"),  # method not allowed
            lambda: http.post("/mcp", json=[modern_body("tools/list")], headers=modern_headers("tools/list")),
            lambda: http.post("/mcp", content=b"{", headers={"content-type": "application/json"}),
            lambda: http.post("/mcp", content=b"{}", headers={"content-type": "text/plain"}),
            lambda: http.put("/mcp"),
            lambda: http.get("/mcp"),
            lambda: http.post(
                "/mcp",
                json=modern_body("tools/list"),
                headers={**modern_headers("tools/list"), "mcp-session-id": "f" * 32},
            ),
        ):
            send()
            requests += 1
        session = LegacySession(http)  # initialize + notifications/initialized
        requests += 2
        session.call("read_document", {"filename": "nope.md"})
        http.delete("/mcp", headers=session.headers())
        requests += 2
    with open_http(broker, "not-a-token") as http:
        post_modern(http, "tools/list")
        requests += 1
    events = events_since(broker, before)
    terminal = [e for e in events if e["event"] in ("mcp.request", "auth.denied", "policy.denied")]
    assert len(terminal) == requests, [(e["event"], e.get("method"), e["reason"]) for e in terminal]
    assert len({e["request_id"] for e in terminal}) == requests
    # approval events belong to a request that also has its terminal event
    ids = {e["request_id"] for e in terminal}
    assert all(e["request_id"] in ids for e in events if e["event"].startswith("approval."))
    assert all({"v", "seq", "ts", "prev", "event", "outcome"} <= e.keys() for e in events)
    # every request refused after authentication names who sent it
    authenticated = [e for e in terminal if e["event"] != "auth.denied" and e["status"] != 405]
    incomplete = [e for e in authenticated if not {"tenant", "subject", "reason", "duration_ms"} <= e.keys()]
    assert incomplete == []


# -- verification -------------------------------------------------------------------------------


@pytest.fixture
def audit_copy(broker: Broker, tmp_path: Path) -> Iterator[tuple[Path, list[bytes]]]:
    with open_http(broker, "x") as http:  # a few more auth.denied lines, so the log has a middle
        for _ in range(3):
            post_modern(http, "tools/list")
    copy = tmp_path / "audit.jsonl"
    copy.write_bytes(broker.audit_file.read_bytes())
    lines = copy.read_bytes().splitlines(keepends=True)
    assert len(lines) >= 8
    yield copy, lines


def test_live_audit_log_verifies(broker: Broker) -> None:
    report = verify_file(broker.audit_file)
    assert report.ok and report.lines == len(broker.audit_events())
    result = verify_cli(broker.audit_file)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.startswith("audit log OK:")


def middle_denial(lines: list[bytes]) -> int:
    """1-based number of an auth.denied line with lines after it."""
    for index in range(len(lines) - 3, 0, -1):
        if json.loads(lines[index])["event"] == "auth.denied":
            return index + 1
    raise AssertionError("no auth.denied line in the middle of the log")


def rewrite(path: Path, lines: list[bytes]) -> None:
    path.write_bytes(b"".join(lines))


def test_altered_line_is_reported_at_its_line(audit_copy: tuple[Path, list[bytes]]) -> None:
    path, lines = audit_copy
    n = middle_denial(lines)
    # hide a denial: the edited line is still valid, canonical JSON
    lines[n - 1] = lines[n - 1].replace(b'"outcome":"denied"', b'"outcome":"ok"')
    rewrite(path, lines)
    report = verify_file(path)
    assert (report.ok, report.first_bad_line) == (False, n)
    result = verify_cli(path)
    assert result.returncode == 1
    assert result.stdout.startswith(f"audit log BROKEN at line {n} of {len(lines)}:"), result.stdout


@pytest.mark.parametrize("attack", ["delete", "swap", "duplicate", "truncate-last", "non-canonical"])
def test_other_tampering_is_reported_at_its_line(audit_copy: tuple[Path, list[bytes]], attack: str) -> None:
    path, lines = audit_copy
    n = middle_denial(lines)
    if attack == "delete":
        del lines[n - 1]
    elif attack == "swap":
        lines[n - 1], lines[n] = lines[n], lines[n - 1]
    elif attack == "duplicate":
        lines.insert(n, lines[n - 1])
        n += 1
    elif attack == "truncate-last":
        lines[-1] = lines[-1][:-10]
        n = len(lines)
    else:
        lines[n - 1] = json.dumps(json.loads(lines[n - 1]), indent=1).replace("\n", "").encode() + b"\n"
    rewrite(path, lines)
    report = verify_file(path)
    assert (report.ok, report.first_bad_line) == (False, n)
    result = verify_cli(path)
    assert result.returncode == 1 and f"BROKEN at line {n} " in result.stdout


def test_verify_cli_exit_codes(tmp_path: Path) -> None:
    empty = tmp_path / "empty.jsonl"
    empty.write_bytes(b"")
    assert verify_cli(empty).returncode == 0
    missing = verify_cli(tmp_path / "missing.jsonl")
    assert missing.returncode == 1 and "cannot read" in missing.stdout
    garbage = tmp_path / "garbage.jsonl"
    garbage.write_text("not json\n")
    result = verify_cli(garbage)
    assert result.returncode == 1 and "BROKEN at line 1 of 1" in result.stdout
    usage = subprocess.run(
        [sys.executable, "-m", "broker", "audit", "verify"],
        cwd=ROOT,
        capture_output=True,
        env={"PATH": os.environ.get("PATH", ""), "PYTHONPATH": str(ROOT)},
        check=False,
    )
    assert usage.returncode == 2


# -- a sink that cannot be written --------------------------------------------------------------


def assert_audit_refusal(response_status: int, body: dict) -> None:
    assert response_status == 503, body
    assert body["error"] == {"code": -32004, "message": "Audit log unavailable; request refused"}


def test_dev_full_sink_refuses_every_call(tmp_path: Path) -> None:
    broker = make_broker(tmp_path, env={"DOCBROKER_AUDIT_LOG": "/dev/full"})
    broker.start()
    try:
        with open_http(broker, broker.token()) as http:
            # the first write fails inside the request (starting the sandbox), later ones at once
            for _ in range(3):
                response = post_modern(http, "tools/list")
                assert_audit_refusal(response.status_code, response.json())
            name = unique("dev-full")
            response = call_modern(http, "save_report", {"filename": name, "content": "never"})
            assert_audit_refusal(response.status_code, response.json())
        with approver(broker) as http:
            # reading approvals is audited too, so it is refused like everything else
            assert http.get("/v1/approvals").status_code == 503
            assert http.post(f"/v1/approvals/{'0' * 32}/approve").status_code == 503
        with open_http(broker, "bad") as http:
            response = post_modern(http, "tools/list")
            assert_audit_refusal(response.status_code, response.json())
        assert open_http(broker).get("/readyz").status_code == 503
        assert not (broker.reports("acme") / name).exists()
        assert "Exception in ASGI application" not in broker.logs()
    finally:
        broker.stop()


@contextlib.contextmanager
def small_tmpfs(where: Path, size: str = "256k") -> Iterator[Path]:
    where.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size},mode=0700", "tmpfs", str(where)], check=True)
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


def fill(folder: Path) -> Path:
    filler = folder / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        with contextlib.suppress(OSError):
            while True:
                os.write(fd, b"\0" * 4096)
        with contextlib.suppress(OSError):
            while True:
                os.write(fd, b"\0")
    finally:
        os.close(fd)
    return filler


async def test_full_disk_refuses_calls_and_an_approved_save_never_lands_unaudited(tmp_path: Path) -> None:
    with small_tmpfs(tmp_path / "audit-fs") as mnt:
        broker = make_broker(tmp_path / "b", env={"DOCBROKER_AUDIT_LOG": str(mnt / "audit.jsonl")})
        broker.start()
        try:
            audit = mnt / "audit.jsonl"
            broker.sources("acme").mkdir(parents=True, exist_ok=True)
            (broker.sources("acme") / "doc.md").write_text("readable while audited")
            name, content = unique("full-disk"), "approved before the disk filled"
            with open_http(broker, broker.token()) as http:
                waiting = rpc_reply(call_modern(http, "save_report", {"filename": name, "content": content}))
                approval_id = waiting["result"]["structuredContent"]["data"]["approval_id"]
            assert decide(broker, approval_id).status_code == 200
            created_before = broker.logs().count("save_report: created")

            filler = fill(mnt)
            # Requests that never reach a sandbox, until one of their audit lines no longer fits.
            with open_http(broker, "bad-token") as http:
                statuses = [post_modern(http, "tools/list").status_code for _ in range(60)]
            assert 503 in statuses, statuses
            assert statuses[statuses.index(503) :] == [503] * (len(statuses) - statuses.index(503))
            assert open_http(broker).get("/readyz").status_code == 503

            with open_http(broker, broker.token()) as http:
                for _ in range(2):  # the approved save: refused, twice
                    response = call_modern(http, "save_report", {"filename": name, "content": content})
                    assert_audit_refusal(response.status_code, response.json())
                response = call_modern(http, "read_document", {"filename": "doc.md"})
                assert_audit_refusal(response.status_code, response.json())
                assert "readable while audited" not in response.text
            assert decide(broker, approval_id, approve=False).status_code == 503  # no unaudited decision
            assert not (broker.reports("acme") / name).exists()
            assert broker.logs().count("save_report: created") == created_before
            with approver(broker) as http:
                assert http.get(f"/v1/approvals/{approval_id}").status_code in (200, 503)

            # Space again: the broker recovers, the chain continues, and the approval was not
            # used up by the refused calls.
            filler.unlink()
            # The refused request that finds the space again brings the log back (its own
            # terminal event is the first line written after the reopen).
            with open_http(broker, "bad-token") as http:
                post_modern(http, "tools/list")
            async with open_mcp(broker, broker.token(), mode="legacy") as client:
                done = structured(
                    await client.call_tool("save_report", {"filename": name, "content": content})
                )
            assert done["status"] == "ok", done
            assert (broker.reports("acme") / name).read_text() == content
            assert open_http(broker).get("/readyz").status_code == 200
            report = verify_file(audit)
            assert report.ok, report
            events = [json.loads(line) for line in audit.read_text().splitlines()]
            trail = [e["event"] for e in events if e.get("approval_id") == approval_id]
            assert trail.count("approval.consumed") == 1
        finally:
            broker.stop()
