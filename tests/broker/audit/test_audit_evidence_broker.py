"""A real broker's evidence, seen from the security team's side: its key, its checkpoints (also at
shutdown), its witness copy, a proof of one call, stdout for a log collector, the gap record after
a full disk — and no value in any of them.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from test_audit_integration import fill, small_tmpfs

from broker.testing import ROOT, Broker, make_broker
from tests.broker.audit.audit_helpers import docbroker as run_docbroker
from tests.broker.support import call_modern, modern_body, modern_headers, open_http, post_modern

pytestmark = pytest.mark.anyio


def docbroker(
    broker: Broker, *args: str | Path, stdin: str | None = None
) -> subprocess.CompletedProcess[str]:
    return run_docbroker(*args, env=broker.env, stdin=stdin)


def public_key(broker: Broker, tmp_path: Path) -> Path:
    result = docbroker(broker, "audit", "key")
    assert result.returncode == 0 and result.stdout.startswith("-----BEGIN PUBLIC KEY-----"), result.stderr
    path = tmp_path / "broker.pub.pem"
    path.write_text(result.stdout)
    return path


def canary_calls(broker: Broker, canary: str) -> None:
    with open_http(broker, broker.token(subject=f"alice-{canary}")) as http:
        post_modern(http, "tools/list")
        body = modern_body("tools/call", {"name": "read_document", "arguments": {"filename": f"{canary}.md"}})
        headers = {**modern_headers("tools/call", "read_document"), f"x-{canary}": canary}
        http.post("/mcp", json=body, headers=headers)
        call_modern(http, "search_documents", {"query": canary, canary: canary})
    with open_http(broker, f"bad-{canary}") as http:
        post_modern(http, "tools/list")


def lines_of(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_bytes().splitlines()]


def test_broker_signs_its_log_and_the_team_verifies_and_proves_it(tmp_path: Path) -> None:
    # A replica id of its own: the key and witness are named by it (the log is named here, so
    # that the harness's `audit_file` finds it).
    env = {
        "DOCBROKER_AUDIT_CHECKPOINT_EVERY": "3",
        "DOCBROKER_REPLICA_ID": "broker-a",
        "DOCBROKER_AUDIT_LOG": str(tmp_path / "data" / "audit.jsonl"),
    }
    broker = make_broker(tmp_path, env=env)
    canary = f"cnry{secrets.token_hex(6)}"
    broker.start()
    try:
        key_file = broker.data_dir / "audit-signing-broker-a.key"
        assert key_file.stat().st_mode & 0o777 == 0o600
        assert key_file.read_bytes() != (broker.data_dir / "master.key").read_bytes()
        pem = public_key(broker, tmp_path)
        canary_calls(broker, canary)
    finally:
        broker.stop()
    log, witness = broker.audit_file, broker.data_dir / "audit-witness-broker-a.jsonl"
    events = lines_of(log)
    assert events[-1]["event"] == "audit.checkpoint"  # written at shutdown, over every line before it
    assert events[-1]["checkpoint"]["size"] == len(events) - 1
    assert {e["checkpoint"]["replica"] for e in events if e["event"] == "audit.checkpoint"} == {"broker-a"}
    assert '"event":' not in broker.logs()  # no audit line on stdout unless asked for

    result = docbroker(broker, "audit", "verify", log, "--key", pem, "--witness", witness)
    assert result.returncode == 0 and result.stdout.startswith("audit log OK:"), result.stdout

    seq = next(e["seq"] for e in events if e.get("tool") == "read_document")
    proof = docbroker(broker, "audit", "prove", log, "--seq", str(seq))
    assert proof.returncode == 0, proof.stderr
    checked = docbroker(broker, "audit", "verify-proof", "-", "--key", pem, stdin=proof.stdout)
    assert checked.returncode == 0, checked.stdout
    consistency = docbroker(broker, "audit", "prove", log, "--from", "2")
    assert (
        docbroker(broker, "audit", "verify-proof", "-", "--key", pem, stdin=consistency.stdout).returncode
        == 0
    )

    # canaries went through (the subject is the one value the audit is meant to hold) ...
    assert any(e.get("subject") == f"alice-{canary}" for e in events)
    evidence = [json.dumps(e) for e in events if e["event"].startswith("audit.")]
    for text in (*evidence, witness.read_text(), consistency.stdout):
        assert canary not in text
    # ... and the proof carries its one event, which holds names only
    assert canary not in json.loads(proof.stdout)["line"].replace(f"alice-{canary}", "")

    # The tail cut back behind the shutdown checkpoint, which the witness holds.
    lines = log.read_bytes().splitlines(keepends=True)
    log.write_bytes(b"".join(lines[:-2]))
    assert docbroker(broker, "audit", "verify", log, "--key", pem).returncode == 0
    cut = docbroker(broker, "audit", "verify", log, "--key", pem, "--witness", witness)
    assert cut.returncode == 1 and "cut back" in cut.stdout


def test_stdout_carries_every_audit_line_and_stderr_none(tmp_path: Path) -> None:
    broker = make_broker(tmp_path, env={"DOCBROKER_AUDIT_STDOUT": "1"})
    out, err = tmp_path / "stdout", tmp_path / "stderr"
    with out.open("wb") as stdout, err.open("wb") as stderr:
        proc = subprocess.Popen(
            [sys.executable, "-m", "broker", "serve"],
            cwd=ROOT,
            env=broker.env,
            stdout=stdout,
            stderr=stderr,
            stdin=subprocess.DEVNULL,
        )
        try:
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                try:
                    if open_http(broker).get("/healthz").status_code == 200:
                        break
                except Exception:
                    time.sleep(0.1)
            canary_calls(broker, "cnryout")
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=20)
    assert out.read_bytes() == broker.audit_file.read_bytes()  # the same lines, byte for byte
    assert len(out.read_bytes().splitlines()) >= 5
    assert b'"event":' not in err.read_bytes()  # the broker's own logs go to stderr, and no audit line
    assert b"created a new audit signing key" in err.read_bytes()


async def test_full_disk_leaves_a_signed_gap_record(tmp_path: Path) -> None:
    with small_tmpfs(tmp_path / "audit-fs") as mnt:
        audit = mnt / "audit.jsonl"
        broker = make_broker(tmp_path / "b", env={"DOCBROKER_AUDIT_LOG": str(audit)})
        broker.start()
        try:
            pem = public_key(broker, tmp_path)
            with open_http(broker, "bad-token") as http:
                post_modern(http, "tools/list")
            filler = fill(mnt)
            with open_http(broker, "bad-token") as http:
                statuses = [post_modern(http, "tools/list").status_code for _ in range(40)]
            refused = len(statuses) - statuses.index(503)
            assert refused >= 2, statuses
            filler.unlink()
            with open_http(broker, "bad-token") as http:
                assert post_modern(http, "tools/list").status_code == 401  # the log is back
        finally:
            broker.stop()
        gaps = [e for e in lines_of(audit) if e["event"] == "audit.gap"]
        assert len(gaps) == 1 and gaps[0]["gap"]["refused"] + gaps[0]["gap"]["lost"] >= refused
        witness = broker.data_dir / "audit-witness.jsonl"
        result = docbroker(broker, "audit", "verify", audit, "--key", pem, "--witness", witness)
        assert result.returncode == 0 and "gap: " in result.stdout, result.stdout
        assert os.path.getsize(witness) > 0
