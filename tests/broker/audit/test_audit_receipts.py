"""Receipts (DESIGN §16): one approval's story, proven line by line, checked offline.

Two replicas write real, signed logs (one of them rotated) with the lines a two-person approval
leaves (requested on one, a yes on each, consumed and written on the other), mixed with another
approval's lines and ordinary traffic. The receipt made from those files must verify with the
two public keys and the report, pass an RFC 6962 check written here (not the code under test),
and every tampering — each field changed, a line swapped for another approval's, a proof
against another log, a checkpoint signed by another key, a report off by one byte, a decision
dropped — must be refused with its reason.
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
import secrets
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from test_audit_evidence import ROOT, Replica

from broker.audit import AuditLog
from broker.audit.checkpoint import Keyring, create_signing_key, load_public_key, load_signing_key, public_pem
from broker.audit.log import Evidence
from broker.audit.notary import Notary
from broker.audit.receipt_check import check_receipt
from broker.audit.receipts import ApprovalFacts, make_receipt
from broker.audit.sink import FileSink, rotated_files
from tests.broker.audit.audit_helpers import request_fields

pytestmark = pytest.mark.anyio

TENANT, IDP = "acme", "https://idp.example"
REPORT = b"Q3 numbers: all fine.\n"
POLICY_HASH = "ab" * 32


def commitment(salt: str, content: bytes) -> str:
    # Written out here, not imported: sha256(salt ‖ sha256(content)), raw bytes.
    return hashlib.sha256(bytes.fromhex(salt) + hashlib.sha256(content).digest()).hexdigest()


def approval_lines(
    approval_id: str, salt: str, content: bytes, approvers: list[str], given_back: bool = False
) -> list[dict[str, Any]]:
    """The approval's lines, in the order a two-person approval writes them (as the flow and
    the REST API do: broker/approvals/flow.py, broker/web/api.py)."""
    c: dict[str, Any] = {
        "content_commitment": commitment(salt, content),
        "approval_id": approval_id,
        "tenant": TENANT,
    }
    alice = {"subject": "alice", "issuer": IDP}
    out = [dict(event="approval.requested", outcome="waiting_approval", request_id="r1", **alice, **c)]
    for who in approvers:
        out.append(dict(
            event="approval.decided", outcome="ok", decision="approved", subject=who, issuer=IDP,
            method="approvals", status=200, reason="decided", policy_hash=POLICY_HASH,
            policy_ids=["two-approvers"], approvers_required=len(approvers), request_id="r2", **c,
        ))  # fmt: skip
    if given_back:  # a first consumption whose write was never sent: given back, then the retry's
        out.append(dict(event="approval.consumed", outcome="ok", request_id="r3", **alice, **c))
        out.append(dict(event="approval.released", outcome="ok", request_id="r3", **alice, **c))
    out.append(dict(event="approval.consumed", outcome="ok", request_id="r4", **alice, **c))
    write = {
        **request_fields(9),
        "tool": "save_report",
        "arg_names": ["content", "filename"],
        "subject": "alice",
    }
    out.append(dict(write, event="mcp.request", approval_id=approval_id, tenant=TENANT))
    return out


async def write_story(
    tmp_path: Path, approvers: list[str], given_back: bool = False
) -> tuple[list[Replica], ApprovalFacts, str]:
    """Two replicas' logs holding approval A's story (and approval B's, and traffic)."""
    r1, r2 = Replica(tmp_path / "r1", "r1"), Replica(tmp_path / "r2", "r2")
    salt, other_salt = secrets.token_hex(32), secrets.token_hex(32)
    a, b = "a" * 32, "b" * 32
    story = approval_lines(a, salt, REPORT, approvers, given_back)
    other = approval_lines(b, other_salt, b"other", approvers, given_back)
    # r1 rotates every few hundred bytes: the receipt must follow the lineage across files.
    create_signing_key(r1.key_file)
    evidence = Evidence(notary=Notary(r1.signer, "r1", time.time_ns), checkpoint_every=4, rotate_bytes=4096)
    rotating = await AuditLog.with_sink(FileSink(r1.log), evidence=evidence, replica="r1")
    async with rotating as log1, await AuditLog.open(r2.settings(every=4)) as log2:
        logs = [log1, log2]
        for i, (mine, theirs) in enumerate(zip(story, other, strict=True)):
            for n in range(3):
                await logs[n % 2].emit("mcp.request", **request_fields(i * 10 + n))
            await logs[i % 2].emit(mine.pop("event"), **mine)
            await logs[(i + 1) % 2].emit(theirs.pop("event"), **theirs)
        for n in range(8):  # a checkpoint after the last line of each
            await logs[n % 2].emit("mcp.request", **request_fields(900 + n))
    assert rotated_files(r1.log), "the test meant r1's log to rotate"
    facts = ApprovalFacts(
        a, TENANT, "q3.md", len(REPORT), hashlib.sha256(REPORT).hexdigest(), salt, IDP, "alice"
    )
    return [r1, r2], facts, other_salt


def files(replicas: list[Replica]) -> list[Path]:
    return [p for r in replicas for p in sorted(r.dir.glob("audit.jsonl*"))]


def keyring(replicas: list[Replica]) -> Keyring:
    return Keyring([load_public_key(str(r.public)) for r in replicas])


def cli(*args: str | Path, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(
        [sys.executable, "-m", "broker", "audit", *map(str, args)],
        cwd=ROOT,
        env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PYTHONPATH": str(ROOT)},
        input=stdin, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert "Traceback" not in result.stderr, result.stderr
    return result


# -- an RFC 6962 inclusion check written from the RFC, independent of broker/audit/merkle.py --


def _rfc_leaf(data: bytes) -> bytes:
    return hashlib.sha256(b"\x00" + data).digest()


def _rfc_node(left: bytes, right: bytes) -> bytes:
    return hashlib.sha256(b"\x01" + left + right).digest()


def rfc6962_root_from_path(m: int, n: int, leaf: bytes, path: list[bytes]) -> bytes:
    """Walk RFC 6962 §2.1.1's PATH(m, D[n]) recursion: the path lists siblings from the leaf up,
    and the recursion splits at k (the largest power of two < n) from the top down."""
    if n == 1:
        assert not path, "a one-leaf tree has an empty path"
        return leaf
    k = 1
    while k * 2 < n:
        k *= 2
    sibling, rest = path[-1], path[:-1]
    if m < k:
        return _rfc_node(rfc6962_root_from_path(m, k, leaf, rest), sibling)
    return _rfc_node(sibling, rfc6962_root_from_path(m - k, n - k, leaf, rest))


def independent_check(receipt: dict[str, Any]) -> None:
    for proof in receipt["proofs"]:
        body = proof["checkpoint"]
        root = rfc6962_root_from_path(
            proof["index"],
            body["size"],
            _rfc_leaf(proof["line"].encode()),
            [bytes.fromhex(h) for h in proof["path"]],
        )
        assert root.hex() == body["root"]
    approval = receipt["approval"]
    assert commitment(approval["salt"], REPORT) == approval["content_commitment"]
    assert all(
        json.loads(p["line"]).get("content_commitment", approval["content_commitment"])
        == approval["content_commitment"]
        for p in receipt["proofs"]
    )


# -- the receipt holds --------------------------------------------------------------------


async def test_a_two_person_approval_through_two_replicas_verifies_offline(tmp_path: Path) -> None:
    replicas, facts, _ = await write_story(tmp_path, ["bob", "carol"])
    receipt = make_receipt(facts, files(replicas))
    assert [json.loads(p["line"])["event"] for p in receipt["proofs"]] == [
        "approval.requested", "approval.decided", "approval.decided", "approval.consumed", "mcp.request",
    ]  # fmt: skip
    assert {p["checkpoint"]["replica"] for p in receipt["proofs"]} == {"r1", "r2"}
    assert sorted(d["approver"]["subject"] for d in receipt["decisions"]) == ["bob", "carol"]
    assert {d["approver"]["issuer"] for d in receipt["decisions"]} == {IDP}
    assert receipt["approval"]["required"] == 2 and receipt["write"]["outcome"] == "ok"
    independent_check(receipt)
    # The audit lines carry the commitment, never the file name nor the content's hash.
    for path in files(replicas):
        data = path.read_bytes()
        assert b"q3.md" not in data and facts.sha256.encode() not in data

    out = tmp_path / "receipt.json"
    out.write_text(json.dumps(receipt))
    report = tmp_path / "q3.md"
    report.write_bytes(REPORT)
    keys = [a for r in replicas for a in ("--key", r.public)]
    ok = cli("verify-receipt", out, *keys, "--report", report)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert ok.stdout.startswith("receipt OK\n") and "approved" in ok.stdout and "bob" in ok.stdout
    assert "byte for byte" in ok.stdout
    as_json = json.loads(cli("verify-receipt", out, *keys, "--json").stdout)
    assert as_json["ok"] is True and as_json["report_checked"] is False
    # Only one replica's key: the other's checkpoints cannot be checked.
    one = cli("verify-receipt", out, "--key", replicas[0].public)
    assert one.returncode == 1 and one.stdout.startswith("receipt BROKEN: line ")
    assert cli("verify-receipt", out, "--key", "nonsense").returncode == 2
    assert cli("verify-receipt", "-", *keys, stdin="{").returncode == 2


async def test_a_ten_decision_receipt_is_under_64_kib(tmp_path: Path) -> None:
    replicas, facts, _ = await write_story(tmp_path, [f"approver-{i}" for i in range(10)])
    receipt = make_receipt(facts, files(replicas))
    size = len(json.dumps(receipt, sort_keys=True, indent=1))
    assert len(receipt["decisions"]) == 10 and size < 64 * 1024, size
    assert check_receipt(receipt, keyring(replicas), REPORT, "q3.md").ok


async def test_a_consumption_given_back_is_not_the_story_the_retry_is(tmp_path: Path) -> None:
    replicas, facts, _ = await write_story(tmp_path, ["bob", "carol"], given_back=True)
    receipt = make_receipt(facts, files(replicas))
    consumed = json.loads(receipt["proofs"][receipt["consumption"]["line"]]["line"])
    assert consumed["request_id"] == "r4" and len(receipt["proofs"]) == 5
    assert check_receipt(receipt, keyring(replicas), REPORT, "q3.md").ok


# -- every tampering is refused -----------------------------------------------------------


def leaves(value: Any, at: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    if isinstance(value, dict):
        return [p for k, v in value.items() for p in leaves(v, (*at, k))]
    if isinstance(value, list):
        return [p for i, v in enumerate(value) for p in leaves(v, (*at, i))] or [at]
    return [at]


def changed(value: Any) -> Any:
    if isinstance(value, bool):
        return not value
    if isinstance(value, int):
        return value + 1
    if isinstance(value, str):
        if len(value) == 64 and all(c in "0123456789abcdef" for c in value):
            return ("0" if value[0] != "0" else "1") + value[1:]
        return value[:-1] + ("x" if not value.endswith("x") else "y") if value else "x"
    if isinstance(value, list):
        return ["x"]
    return "x"


def set_at(document: Any, at: tuple[Any, ...], value: Any) -> Any:
    out = copy.deepcopy(document)
    holder = out
    for key in at[:-1]:
        holder = holder[key]
    holder[at[-1]] = value
    return out


def get_at(document: Any, at: tuple[Any, ...]) -> Any:
    for key in at:
        document = document[key]
    return document


async def test_every_field_changed_one_at_a_time_is_refused(tmp_path: Path) -> None:
    replicas, facts, _ = await write_story(tmp_path, ["bob", "carol"])
    receipt, keys = make_receipt(facts, files(replicas)), keyring(replicas)
    paths = leaves(receipt)
    assert len(paths) > 60
    for at in paths:
        forged = set_at(receipt, at, changed(get_at(receipt, at)))
        verdict = check_receipt(forged, keys, REPORT, "q3.md")
        assert not verdict.ok and verdict.problem, at
    # A field removed, too.
    for key in ("salt", "content_commitment", "requester", "required", "filename"):
        forged = copy.deepcopy(receipt)
        del forged["approval"][key]
        assert not check_receipt(forged, keys, REPORT, "q3.md").ok, key


async def test_the_named_tamperings_are_refused_with_their_reason(tmp_path: Path) -> None:
    replicas, facts, other_salt = await write_story(tmp_path, ["bob", "carol"])
    keys = keyring(replicas)
    receipt = make_receipt(facts, files(replicas))
    assert check_receipt(receipt, keys, REPORT, "q3.md").ok

    # A line swapped for one of another approval (with its own, valid proof).
    other = make_receipt(
        ApprovalFacts(
            "b" * 32, TENANT, "o.md", 5, hashlib.sha256(b"other").hexdigest(), other_salt, IDP, "alice"
        ),
        files(replicas),
    )
    swapped = copy.deepcopy(receipt)
    swapped["proofs"][1] = other["proofs"][1]
    assert "another approval" in str(check_receipt(swapped, keys).problem)

    # A proof against another log: the line's path and checkpoint from the other replica.
    moved = copy.deepcopy(receipt)
    theirs = next(
        p for p in receipt["proofs"] if p["checkpoint"]["log"] != moved["proofs"][0]["checkpoint"]["log"]
    )
    moved["proofs"][0] = {**moved["proofs"][0], "checkpoint": theirs["checkpoint"], "sig": theirs["sig"]}
    assert "NOT in the log" in str(check_receipt(moved, keys).problem)

    # A checkpoint signed by another key (the body re-signed by someone without the replica's key).
    intruder = tmp_path / "intruder.key"
    create_signing_key(intruder)
    signer = load_signing_key(intruder)
    from broker.audit.checkpoint import CHECKPOINT_LABEL

    resigned = copy.deepcopy(receipt)
    body = {**resigned["proofs"][0]["checkpoint"], "key": signer.key_id}
    resigned["proofs"][0]["checkpoint"], resigned["proofs"][0]["sig"] = (
        body,
        signer.sign(CHECKPOINT_LABEL, body),
    )
    assert not check_receipt(resigned, keys).ok
    intruder_pem = tmp_path / "intruder.pem"
    intruder_pem.write_text(public_pem(signer.private.public_key()))
    with_only_intruder = Keyring([load_public_key(str(intruder_pem))])
    assert not check_receipt(receipt, with_only_intruder).ok

    # A report with one byte changed.
    off = bytes([REPORT[0] ^ 1]) + REPORT[1:]
    assert "NOT the approved" in str(check_receipt(receipt, keys, off, "q3.md").problem)
    assert "file name" in str(check_receipt(receipt, keys, REPORT, "other.md").problem)

    # A decision dropped from a two-person approval: its line and its entry.
    dropped = copy.deepcopy(receipt)
    line = dropped["decisions"][1]["line"]
    del dropped["decisions"][1]
    del dropped["proofs"][line]
    for entry in [dropped["requested"], *dropped["decisions"], dropped["consumption"], dropped["write"]]:
        entry["line"] -= entry["line"] > line
    assert "asked for 2 approvers" in str(check_receipt(dropped, keys).problem)
    # ... and the same person's yes given twice does not make two.
    doubled = copy.deepcopy(receipt)
    doubled["proofs"][2] = doubled["proofs"][1]
    assert "given twice" in str(check_receipt(doubled, keys).problem)
