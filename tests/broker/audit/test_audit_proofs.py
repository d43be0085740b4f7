"""`docbroker audit prove` / `verify-proof`: one event handed to an auditor without the whole log.

The proofs are made from real logs by the CLI and checked by the CLI with only the public key;
a forged line, a doctored path, another replica's key or a rewritten log must all fail. The
Merkle code under them is checked against the published RFC 6962 vectors in test_audit_merkle.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from test_audit_evidence import records, rewrite_consistently

from broker.audit.checkpoint import create_signing_key, load_signing_key, public_pem
from tests.broker.audit.audit_helpers import Replica, docbroker, write_log

pytestmark = pytest.mark.anyio


def cli(*args: str | Path, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return docbroker("audit", *args, stdin=stdin)


def prove(replica: Replica, *args: str | Path) -> dict:
    result = cli("prove", *sorted(replica.dir.glob("audit.jsonl*")), *args)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def check(proof: dict, *keys: Path) -> subprocess.CompletedProcess[str]:
    args: list[str | Path] = []
    for key in keys:
        args += ["--key", key]
    return cli("verify-proof", "-", *args, stdin=json.dumps(proof))


async def test_inclusion_proof_round_trip_and_forgeries(tmp_path: Path) -> None:
    replica = await write_log(tmp_path, events=40, every=7)
    line = replica.lines()[11].rstrip(b"\n").decode()
    proof = prove(replica, "--seq", "12")
    assert proof["type"] == "inclusion" and proof["line"] == line and proof["index"] == 11
    ok = check(proof, replica.public)
    assert ok.returncode == 0 and ok.stdout.startswith("proof OK: line seq 12"), ok.stdout
    # under a chosen, earlier checkpoint
    earlier = prove(replica, "--seq", "12", "--checkpoint", "3")
    assert earlier["checkpoint"]["n"] == 3 and check(earlier, replica.public).returncode == 0

    forged = dict(proof, line=line.replace('"outcome":"ok"', '"outcome":"denied"'))
    assert check(forged, replica.public).returncode == 1
    moved = dict(proof, line=replica.lines()[12].rstrip(b"\n").decode(), index=12)
    assert check(moved, replica.public).returncode == 1  # another line, claimed at this path
    doctored = dict(proof, path=[proof["path"][0][::-1], *proof["path"][1:]])
    assert check(doctored, replica.public).returncode == 1
    grown = dict(proof, checkpoint={**proof["checkpoint"], "size": proof["checkpoint"]["size"] + 1})
    assert "bad signature" in check(grown, replica.public).stdout

    other = tmp_path / "other.key"
    create_signing_key(other)
    pem = tmp_path / "other.pem"
    pem.write_text(public_pem(load_signing_key(other).private.public_key()))
    assert check(proof, pem).returncode == 1
    assert cli("verify-proof", "-", "--key", "nonsense", stdin=json.dumps(proof)).returncode == 2
    assert cli("verify-proof", "-", "--key", replica.public, stdin="{").returncode == 2


async def test_consistency_proof_round_trip_and_a_log_rewritten_in_between(tmp_path: Path) -> None:
    replica = await write_log(tmp_path, events=40, every=7)
    proof = prove(replica, "--from", "2", "--to", "5")
    assert proof["type"] == "consistency" and proof["old"]["checkpoint"]["n"] == 2
    result = check(proof, replica.public)
    assert result.returncode == 0 and "extends checkpoint 2" in result.stdout, result.stdout
    latest = prove(replica, "--from", "1")  # to the last checkpoint; from the log's first (size 0)
    assert check(latest, replica.public).returncode == 0

    # An old checkpoint kept by the auditor, and a new one the attacker cannot produce honestly:
    # rewrite an early event and re-sign everything with their own key.
    attacker = tmp_path / "attacker.key"
    create_signing_key(attacker)
    recs = records(replica.lines())
    recs[3]["outcome"] = "denied"
    replica.log.write_bytes(b"".join(rewrite_consistently(recs, load_signing_key(attacker))))
    rewritten = prove(replica, "--from", "2", "--to", "5")
    spliced = dict(rewritten, old=proof["old"])  # auditor's genuine old checkpoint, attacker's path
    assert check(spliced, replica.public).returncode == 1
    # even given the attacker's key, the rewritten tree does not extend the genuine old head
    pem = tmp_path / "attacker.pem"
    pem.write_text(public_pem(load_signing_key(attacker).private.public_key()))
    assert check(spliced, replica.public, pem).returncode == 1
    assert "does NOT extend" in check(spliced, replica.public, pem).stdout


async def test_prove_refuses_what_it_cannot_prove(tmp_path: Path) -> None:
    replica = await write_log(tmp_path, events=5, every=100)
    files = sorted(replica.dir.glob("audit.jsonl*"))
    assert cli("prove", *files, "--seq", "999").returncode == 1
    assert cli("prove", *files, "--from", "99").returncode == 1
    assert cli("prove", *files).returncode == 2  # neither --seq nor --from
    two = await write_log(tmp_path, "r2", events=3)
    mixed = cli("prove", replica.log, two.log, "--seq", "2")
    assert mixed.returncode == 1 and "more than one log" in mixed.stderr


async def test_a_non_ascii_letter_in_the_proofs_line_is_broken_not_a_traceback(tmp_path: Path) -> None:
    """A proof's line edited with a letter no log line has (the writer escapes it): a verdict."""
    replica = await write_log(tmp_path, events=12, every=5)
    proof = prove(replica, "--seq", "3")
    line = json.loads(proof["line"])
    # A letter in the subject (any printable text) keeps the line an event; one in a name does not.
    for edited in (proof["line"].replace("alice", "alicé"), proof["line"].replace("acme", "acmé")):
        assert edited != proof["line"] and (json.loads(edited) != line)
        result = check({**proof, "line": edited}, replica.public)  # `cli` asserts: no Traceback
        assert result.returncode == 1 and result.stdout.startswith("proof BROKEN:"), result.stdout
        assert result.stderr == ""
