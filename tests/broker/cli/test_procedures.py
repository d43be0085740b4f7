"""docs/operations.md's procedures, each run once against a real broker (issue 29 item 4):
a backup taken while the broker runs restores into a new data dir with its open approvals
decidable and its audit chain going on; the audit signing key and the operators' tokens
rotate as written; the master key rotates and the tenant is served under the new one; an
upgrade is `db status`, `db upgrade`, restart, with the chain verified across it."""

from __future__ import annotations

import secrets
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx2
import pytest

from broker.testing import Broker, make_broker
from tests.broker.cli.cli_helpers import cli, json_out, token_file
from tests.broker.support import (
    APPROVER_SCOPE,
    READ_SCOPE,
    WRITE_SCOPE,
    call_modern,
    open_http,
    rpc_reply,
    tool_status,
    unique,
)


@pytest.fixture
def brokers() -> Iterator[list[Broker]]:
    started: list[Broker] = []
    yield started
    for broker in started:
        broker.stop()


def _read(broker: Broker) -> None:
    with open_http(broker, broker.token(tenant="acme", scope=READ_SCOPE)) as http:
        reply = rpc_reply(call_modern(http, "search_documents", {"query": "x"}))
    assert "result" in reply, reply


def _verify(broker: Broker, files: list[Path], *keys: Path) -> subprocess.CompletedProcess[str]:
    args = [str(f) for f in files]
    for key in keys:
        args += ["--key", str(key)]
    return cli(broker.env, "audit", "verify", *args)


def _public_key(broker: Broker, path: Path) -> Path:
    result = cli(broker.env, "audit", "key")
    assert result.returncode == 0, result.stderr
    path.write_text(result.stdout)
    return path


def test_backup_while_running_and_restore(tmp_path: Path, brokers: list[Broker]) -> None:
    first = make_broker(tmp_path / "first")
    brokers.append(first)
    first.start()
    _read(first)
    with open_http(first, first.token(tenant="acme", subject="alice", scope=WRITE_SCOPE)) as http:
        waiting = tool_status(call_modern(http, "save_report", {"filename": unique("b"), "content": "draft"}))
    approval_id = waiting["data"]["approval_id"]

    backup = tmp_path / "backup"
    backup.mkdir(mode=0o700)
    copied = json_out(cli(first.env, "db", "backup", str(backup / "approvals.sqlite3"), "--json"))
    assert copied["bytes"] > 0 and (backup / "approvals.sqlite3").stat().st_mode & 0o077 == 0
    again = cli(first.env, "db", "backup", str(backup / "approvals.sqlite3"))
    assert again.returncode == 2  # never over an existing file
    for name in ("audit.jsonl", "audit-witness.jsonl", "master.key", "audit-signing.key"):
        shutil.copy2(first.data_dir / name, backup / name)
    pub = _public_key(first, backup / "audit.pub")
    assert _verify(first, [backup / "audit.jsonl"], pub).returncode == 0
    first.stop()

    restored = make_broker(tmp_path / "restored")
    brokers.append(restored)
    restored.data_dir.mkdir(mode=0o700)
    for name in (
        "approvals.sqlite3",
        "audit.jsonl",
        "audit-witness.jsonl",
        "master.key",
        "audit-signing.key",
    ):
        shutil.copy2(backup / name, restored.data_dir / name)
    restored.start()
    carol = token_file(tmp_path, restored.token(tenant="acme", subject="carol", scope=APPROVER_SCOPE))
    url = ["--url", restored.url, "--token-file", str(carol)]
    listed = json_out(cli(restored.env, "approvals", "list", "--json", *url))
    assert approval_id in [a["approval_id"] for a in listed["approvals"]]
    read = next(a["sha256"] for a in listed["approvals"] if a["approval_id"] == approval_id)
    decided = json_out(
        cli(restored.env, "approvals", "approve", approval_id, "--sha256", read, "--json", *url)
    )
    assert decided["state"] == "approved"
    restored.stop()  # its last checkpoint, signed with the restored key
    assert _verify(restored, [restored.audit_file], pub).returncode == 0  # old lines and new: one chain


def test_rotating_the_audit_key_the_ops_token_and_the_master_key(
    tmp_path: Path, brokers: list[Broker]
) -> None:
    broker = make_broker(tmp_path)
    brokers.append(broker)
    broker.start()
    _read(broker)
    old_pub = _public_key(broker, tmp_path / "old.pub")
    old_secret = (broker.data_dir / "secrets" / "acme.key").read_text()
    broker.stop()

    # The audit signing key: moved away, a new one made (`audit keygen`, its public key printed).
    (broker.data_dir / "audit-signing.key").rename(tmp_path / "retired-audit-signing.key")
    made = cli(broker.env, "audit", "keygen")
    assert made.returncode == 0, made.stderr
    # The ops token: a second line while rotating.
    ops_file = Path(broker.env["DOCBROKER_OPS_TOKEN_FILE"])
    old_ops, new_ops = broker.ops_token, secrets.token_urlsafe(32)
    ops_file.write_text(f"{old_ops}\n{new_ops}\n")
    # The master key: replaced; the running sandbox (it holds the old secret) restarted.
    (broker.data_dir / "master.key").write_text(secrets.token_hex(32) + "\n")
    assert cli(broker.env, "sandbox", "restart", "acme").returncode == 0
    broker.start()
    _read(broker)  # served under the new master key
    assert (broker.data_dir / "secrets" / "acme.key").read_text() != old_secret
    for token in (old_ops, new_ops):
        assert (
            httpx2.get(f"{broker.url}/metrics", headers={"authorization": f"Bearer {token}"}).status_code
            == 200
        )
    new_pub = _public_key(broker, tmp_path / "new.pub")
    assert new_pub.read_text() == made.stdout != old_pub.read_text()  # the key it signs with
    broker.stop()

    ops_file.write_text(f"{new_ops}\n")
    broker.start()
    assert (
        httpx2.get(f"{broker.url}/metrics", headers={"authorization": f"Bearer {old_ops}"}).status_code == 401
    )
    assert (
        httpx2.get(f"{broker.url}/metrics", headers={"authorization": f"Bearer {new_ops}"}).status_code == 200
    )
    broker.stop()

    assert _verify(broker, [broker.audit_file], old_pub, new_pub).returncode == 0
    assert _verify(broker, [broker.audit_file], new_pub).returncode == 1  # why the old key is kept


def test_upgrade_is_db_status_db_upgrade_and_a_restart(tmp_path: Path, brokers: list[Broker]) -> None:
    broker = make_broker(tmp_path)
    brokers.append(broker)
    status = cli(broker.env, "db", "status", "--json")
    assert (
        status.returncode == 1 and json_out(cli(broker.env, "db", "upgrade", "--json"))["state"] == "current"
    )
    assert cli(broker.env, "db", "status").returncode == 0
    broker.start()
    _read(broker)
    pub = _public_key(broker, tmp_path / "audit.pub")
    broker.stop()
    broker.start()  # the new release
    _read(broker)
    broker.stop()
    assert _verify(broker, [broker.audit_file], pub).returncode == 0
