"""Signed checkpoints against an attacker who can write the log files but does not hold the key.

Each test writes a real log with the real writer (`AuditLog` over real files), attacks the files
the way someone with write access would, and runs `docbroker audit verify` as a security team
would: a subprocess, the public key, the witness file. Where a check is the only thing standing
between the attack and a passing verdict, the test also shows the attack passing without it
(no `--key`, no `--witness`): the check is what catches it.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from broker.audit import AuditLog
from broker.audit.chain import GENESIS
from broker.audit.checkpoint import (
    CHECKPOINT_LABEL,
    Signer,
    create_signing_key,
    load_signing_key,
    public_hex,
    public_pem,
    record_hash,
)
from broker.audit.log import Evidence
from broker.audit.merkle import Frontier
from broker.audit.notary import Notary
from broker.audit.processors import canonical
from broker.audit.sink import FileSink, rotated_files
from broker.audit.witness import FileCopy
from broker.settings import AuditSettings, SettingsError
from tests.broker.audit.audit_helpers import Replica, docbroker, plain, request_fields, write_log

pytestmark = pytest.mark.anyio
ROOT = Path(__file__).resolve().parents[3]


def verify(*args: str | Path) -> tuple[int, dict[str, Any]]:
    result = docbroker("audit", "verify", "--json", *args)
    return result.returncode, json.loads(result.stdout) if result.stdout else {}


def verify_text(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return docbroker("audit", "verify", *args)


def problem(document: dict[str, Any], index: int = 0) -> str:
    return str(document["files"][index]["problem"])


def records(lines: list[bytes]) -> list[dict[str, Any]]:
    return [json.loads(line) for line in lines]


def rewrite_consistently(recs: list[dict[str, Any]], signer: Signer | None = None) -> list[bytes]:
    """What an attacker with write access does: renumber, re-chain, recompute every tree head,
    frontier and checkpoint link so that everything but the signatures is right again; re-sign
    with `signer` (their own key) if given."""
    tree, head, last_checkpoint, out = Frontier(), GENESIS, GENESIS, []
    for seq, rec in enumerate(recs, 1):
        rec = json.loads(json.dumps(rec))
        rec["seq"], rec["prev"] = seq, head
        if rec["event"] == "audit.checkpoint":
            body = rec["checkpoint"]
            body.update(size=tree.size, root=tree.root().hex(), prev=last_checkpoint)
            if signer is not None:
                body["key"] = signer.key_id
                rec["sig"] = signer.sign(CHECKPOINT_LABEL, body)
            rec["frontier"] = [node.hex() for node in tree.nodes]
            last_checkpoint = record_hash(body)
        data = canonical(rec).encode("ascii")
        out.append(data + b"\n")
        tree.append(data)
        head = hashlib.sha256(data).hexdigest()
    return out


def first_event(recs: list[dict[str, Any]], event: str = "mcp.request", after: int = 0) -> int:
    return next(i for i, r in enumerate(recs) if r["event"] == event and i >= after)


# -- the writer -------------------------------------------------------------------------------------


async def test_checkpoints_are_written_into_the_log_and_the_witness(tmp_path: Path) -> None:
    replica = await write_log(tmp_path, events=22, every=5)
    recs = records(replica.lines())
    checkpoints = [r for r in recs if r["event"] == "audit.checkpoint"]
    assert recs[0]["event"] == "audit.checkpoint" and recs[0]["checkpoint"]["size"] == 0  # the log id
    assert [c["checkpoint"]["n"] for c in checkpoints] == list(range(1, len(checkpoints) + 1))
    assert len(checkpoints) >= 22 // 5 + 1
    assert recs[-1]["event"] == "audit.checkpoint"  # at close, over every line before it
    for c in checkpoints:
        assert c["checkpoint"]["size"] == c["seq"] - 1 and c["checkpoint"]["replica"] == "r1"
    shipped = records(replica.witness.read_bytes().splitlines())
    assert shipped == [{"checkpoint": c["checkpoint"], "sig": c["sig"]} for c in checkpoints]
    assert os.stat(replica.key_file).st_mode & 0o777 == 0o600
    assert os.stat(replica.witness).st_mode & 0o777 == 0o600
    code, report = verify(replica.log, "--key", replica.public, "--witness", replica.witness)
    assert code == 0 and report["ok"], report


async def test_restart_continues_the_tree_and_the_checkpoint_sequence(tmp_path: Path) -> None:
    replica = await write_log(tmp_path, events=7, every=5)
    for round_ in range(2):
        async with await AuditLog.open(replica.settings(every=5)) as log:
            for i in range(4 + round_):
                await log.emit("mcp.request", **request_fields(i))
    recs = records(replica.lines())
    numbers = [r["checkpoint"]["n"] for r in recs if r["event"] == "audit.checkpoint"]
    assert numbers == list(range(1, len(numbers) + 1))
    assert len({r["checkpoint"]["log"] for r in recs if r["event"] == "audit.checkpoint"}) == 1
    assert verify(replica.log, "--key", replica.public, "--witness", replica.witness)[0] == 0


async def test_a_tampered_frontier_makes_the_writer_refuse_to_continue(tmp_path: Path) -> None:
    replica = await write_log(tmp_path, events=3, every=100)
    recs = records(replica.lines())
    recs[-1]["frontier"] = [hashlib.sha256(b"x").hexdigest()] * len(recs[-1]["frontier"])
    replica.log.write_bytes(b"".join(canonical(r).encode() + b"\n" for r in recs))
    from broker.audit import AuditSinkError

    with pytest.raises(AuditSinkError) as err:
        await AuditLog.open(replica.settings())
    assert err.value.code == "history_invalid"


async def test_checkpoint_timer_signs_an_idle_tail(tmp_path: Path) -> None:
    replica = Replica(tmp_path / "r1", "r1")
    settings = AuditSettings(
        path=replica.log,
        key_file=replica.key_file,
        witness_file=None,
        replica="r1",
        checkpoint_every=1000,
        checkpoint_interval_seconds=0.1,
    )
    async with await AuditLog.open(settings) as log:
        await log.emit("mcp.request", **request_fields(1))
        deadline = time.monotonic() + 5
        while log.stats.checkpoints < 2 and time.monotonic() < deadline:
            await _sleep(0.05)
        assert log.stats.checkpoints == 2  # the first line's, and the timer's over the event
        await _sleep(0.3)
        assert log.stats.checkpoints == 2  # nothing new: no empty checkpoints


async def _sleep(seconds: float) -> None:
    import anyio

    await anyio.sleep(seconds)


# -- tampering --------------------------------------------------------------------------------------


@pytest.mark.parametrize("attack", ["edit", "delete", "reorder", "insert"])
async def test_line_tampering_is_reported_at_its_line(tmp_path: Path, attack: str) -> None:
    replica = await write_log(tmp_path)
    lines = replica.lines()
    k = first_event(records(lines), after=8)
    if attack == "edit":
        lines[k] = lines[k].replace(b'"outcome":"ok"', b'"outcome":"denied"')
    elif attack == "delete":
        del lines[k]
    elif attack == "reorder":
        lines[k], lines[k + 1] = lines[k + 1], lines[k]
    else:
        lines.insert(k, lines[k])
        k += 1
    replica.log.write_bytes(b"".join(lines))
    code, report = verify(replica.log, "--key", replica.public)
    assert code == 1 and report["files"][0]["first_bad_line"] == k + 1, report


async def test_chain_rewritten_consistently_without_the_key(tmp_path: Path) -> None:
    replica = await write_log(tmp_path)
    recs = records(replica.lines())
    k = first_event(recs, after=3)
    recs[k]["outcome"], recs[k]["reason"] = "denied", "policy"  # hide what happened
    replica.log.write_bytes(b"".join(rewrite_consistently(recs)))
    # chain, tree heads, frontiers and links all consistent again: only the signature knows
    assert verify(replica.log)[0] == 0
    code, report = verify(replica.log, "--key", replica.public)
    assert code == 1 and "bad signature" in problem(report), report


async def test_chain_rewritten_and_signed_with_another_key(tmp_path: Path) -> None:
    replica = await write_log(tmp_path)
    attacker = tmp_path / "attacker.key"
    create_signing_key(attacker)
    recs = records(replica.lines())
    del recs[first_event(recs, after=3)]  # remove an event, then re-sign everything
    replica.log.write_bytes(b"".join(rewrite_consistently(recs, load_signing_key(attacker))))
    assert verify(replica.log)[0] == 0
    code, report = verify(replica.log, "--key", replica.public)
    assert code == 1 and "key that was not given" in problem(report), report
    assert report["files"][0]["first_bad_line"] == 1


async def test_checkpoint_signed_with_another_key_under_our_key_id(tmp_path: Path) -> None:
    replica = await write_log(tmp_path)
    attacker = tmp_path / "attacker.key"
    create_signing_key(attacker)
    recs = records(replica.lines())
    k = first_event(recs, "audit.checkpoint", after=1)
    recs[k]["sig"] = load_signing_key(attacker).sign(CHECKPOINT_LABEL, recs[k]["checkpoint"])
    replica.log.write_bytes(b"".join(rewrite_consistently(recs)))
    code, report = verify(replica.log, "--key", replica.public)
    assert code == 1 and "bad signature" in problem(report) and report["files"][0]["first_bad_line"] == k + 1


async def test_tail_cut_behind_a_shipped_checkpoint(tmp_path: Path) -> None:
    replica = await write_log(tmp_path, events=22, every=5)
    lines = replica.lines()
    recs = records(lines)
    # Cut back to just before the third checkpoint: what is left is a valid, signed log.
    cut = [i for i, r in enumerate(recs) if r["event"] == "audit.checkpoint"][2]
    replica.log.write_bytes(b"".join(lines[:cut]))
    assert verify(replica.log, "--key", replica.public)[0] == 0  # without the witness: unnoticed
    code, report = verify(replica.log, "--key", replica.public, "--witness", replica.witness)
    assert code == 1 and "cut back" in problem(report), report


async def test_tail_rewritten_under_a_shipped_checkpoint_size(tmp_path: Path) -> None:
    replica = await write_log(tmp_path, events=22, every=5)
    recs = records(replica.lines())
    checkpoints = [i for i, r in enumerate(recs) if r["event"] == "audit.checkpoint"]
    last = checkpoints[-1]
    k = first_event(recs, after=checkpoints[-2])
    recs[k]["outcome"] = "failed"
    # Rewritten consistently and the last checkpoint dropped, so no signature in the log breaks.
    rewritten = rewrite_consistently(recs[:last])
    replica.log.write_bytes(b"".join(rewritten))
    assert verify(replica.log, "--key", replica.public)[0] == 0
    code, report = verify(replica.log, "--key", replica.public, "--witness", replica.witness)
    assert code == 1, report
    assert "cut back" in problem(report) or "witness checkpoint disagrees" in problem(report)


async def test_event_edited_and_chain_relinked_under_genuine_checkpoints(tmp_path: Path) -> None:
    replica = await write_log(tmp_path)
    recs = records(replica.lines())
    k = first_event(recs, after=3)
    recs[k]["outcome"] = "denied"
    # The chain is whole again and every checkpoint is the genuine, signed one: only the tree
    # head, recomputed over the lines, disagrees with what was signed.
    code, report = verify_rewritten(replica, recs)
    assert code == 1 and "tree head does not match" in problem(report), report
    later = next(i for i, r in enumerate(recs) if r["event"] == "audit.checkpoint" and i > k)
    assert report["files"][0]["first_bad_line"] == later + 1


async def test_replayed_old_checkpoint(tmp_path: Path) -> None:
    replica = await write_log(tmp_path)
    recs = records(replica.lines())
    old = recs[first_event(recs, "audit.checkpoint", after=1)]
    recs.insert(len(recs) - 1, old)  # an old, genuinely signed checkpoint, re-chained in later
    code, report = verify_rewritten(replica, recs)
    assert code == 1 and "replayed" in problem(report), report


def verify_rewritten(replica: Replica, recs: list[dict[str, Any]]) -> tuple[int, dict[str, Any]]:
    # Only the chain is redone (the attacker cannot re-sign): checkpoint bodies stay as signed.
    head, out = GENESIS, []
    for seq, rec in enumerate(recs, 1):
        rec = {**rec, "seq": seq, "prev": head}
        data = canonical(rec).encode("ascii")
        out.append(data + b"\n")
        head = hashlib.sha256(data).hexdigest()
    replica.log.write_bytes(b"".join(out))
    return verify(replica.log, "--key", replica.public)


async def test_checkpoint_copied_from_another_replica(tmp_path: Path) -> None:
    one = await write_log(tmp_path, "r1")
    two = await write_log(tmp_path, "r2")
    recs = records(one.lines())
    theirs = records(two.lines())
    recs.insert(len(recs) - 1, theirs[first_event(theirs, "audit.checkpoint", after=1)])
    head, out = GENESIS, []
    for seq, rec in enumerate(recs, 1):
        data = canonical({**rec, "seq": seq, "prev": head}).encode("ascii")
        out.append(data + b"\n")
        head = hashlib.sha256(data).hexdigest()
    one.log.write_bytes(b"".join(out))
    code, report = verify(one.log, "--key", one.public)
    assert code == 1 and "key that was not given" in problem(report)
    code, report = verify(one.log, "--key", one.public, "--key", two.public)
    assert code == 1 and "another log" in problem(report), report


async def test_two_replicas_files_swapped(tmp_path: Path) -> None:
    one = await write_log(tmp_path, "r1")
    two = await write_log(tmp_path, "r2", events=9)
    code, report = verify(one.log, two.log, "--key", one.public, "--key", two.public)
    assert code == 0 and {f["replica"] for f in report["files"]} == {"r1", "r2"}  # both at once
    a, b = one.log.read_bytes(), two.log.read_bytes()
    one.log.write_bytes(b)
    two.log.write_bytes(a)
    # r1's log, checked as r1's: signed by the other replica's key, or claiming the other replica
    code, report = verify(one.log, "--key", one.public, "--witness", one.witness)
    assert code == 1 and "key that was not given" in problem(report)
    code, report = verify(one.log, "--key", one.public, "--key", two.public, "--replica", "r1")
    assert code == 1 and "another replica" in problem(report), report
    # and r1's witness knows a log of r1 that the file at r1's place does not continue
    code, report = verify(one.log, "--key", one.public, "--key", two.public, "--witness", one.witness)
    assert code == 1 and not report["witnesses"][0]["ok"], report


async def test_rotation_keeps_the_chain_and_a_missing_middle_file_is_found(tmp_path: Path) -> None:
    replica = Replica(tmp_path / "r1", "r1")
    create_signing_key(replica.key_file)
    evidence = Evidence(
        notary=Notary(replica.signer, "r1", time.time_ns),
        witness=FileCopy(replica.witness),
        checkpoint_every=4,
        rotate_bytes=3000,
    )
    async with await AuditLog.with_sink(FileSink(replica.log), evidence=evidence) as log:
        for i in range(40):
            await log.emit("mcp.request", **request_fields(i))
        assert log.stats.rotations >= 3
    files = [*rotated_files(replica.log), replica.log]
    assert len(files) >= 4
    for path in files:  # every file starts with a checkpoint (log id, or where the last one ended)
        first = json.loads(path.read_bytes().splitlines()[0])
        assert first["event"] == "audit.checkpoint" and first["checkpoint"]["size"] == first["seq"] - 1
    seqs = [json.loads(line)["seq"] for path in files for line in path.read_bytes().splitlines()]
    assert seqs == list(range(1, len(seqs) + 1))  # one chain across the files
    code, report = verify(*reversed(files), "--key", replica.public, "--witness", replica.witness)
    assert code == 0 and len(report["files"]) == len(files), report
    files[1].unlink()
    rest = [f for f in files if f.exists()]
    code, report = verify(*rest, "--key", replica.public, "--witness", replica.witness)
    assert code == 1 and "rotated file is missing" in problem(report, 1), report
    assert report["files"][1]["first_bad_line"] == 1
    assert [f["ok"] for f in report["files"]] == [True, False, *([True] * (len(rest) - 2))]


async def test_retention_keeps_the_newest_rotated_files_and_what_is_left_verifies(tmp_path: Path) -> None:
    """DOCBROKER_AUDIT_KEEP_FILES: the log stays inside its volume ((keep + 1) x the rotation
    size); nothing removed them before, and a Pod's volume filled until it was evicted."""
    replica = Replica(tmp_path / "r1", "r1")
    create_signing_key(replica.key_file)
    evidence = Evidence(
        notary=Notary(replica.signer, "r1", time.time_ns),
        witness=FileCopy(replica.witness),
        checkpoint_every=4,
        rotate_bytes=3000,
        keep_files=2,
    )
    async with await AuditLog.with_sink(FileSink(replica.log), evidence=evidence) as log:
        for i in range(80):
            await log.emit("mcp.request", **request_fields(i))
        assert log.stats.rotations >= 6
    rotated = rotated_files(replica.log)
    # the two newest only: numbers keep growing, the oldest went first
    assert [int(p.name.rsplit(".", 1)[1]) for p in rotated] == [log.stats.rotations - 1, log.stats.rotations]
    files = [*rotated, replica.log]
    seqs = [json.loads(line)["seq"] for path in files for line in path.read_bytes().splitlines()]
    assert seqs == list(range(seqs[0], seqs[0] + len(seqs))) and seqs[0] > 1  # one chain, its start gone
    code, report = verify(*files, "--key", replica.public)
    assert code == 0, report
    assert "earlier files not given" in str(report["files"][0]["notes"])


def test_keep_files_needs_rotation() -> None:
    with pytest.raises(SettingsError, match="DOCBROKER_AUDIT_KEEP_FILES needs DOCBROKER_AUDIT_ROTATE_MB"):
        AuditSettings(path=Path("a"), key_file=None, witness_file=None, rotate_bytes=0, keep_files=3)


# -- the CLI ---------------------------------------------------------------------------------------


async def test_verdict_lines_and_exit_codes(tmp_path: Path) -> None:
    replica = await write_log(tmp_path)
    result = verify_text(replica.log, "--key", public_hex(replica.signer.private.public_key()))
    assert result.returncode == 0 and result.stdout.startswith("audit log OK:"), result.stdout
    assert len(result.stdout.splitlines()) == 1
    unsigned = verify_text(replica.log)
    assert unsigned.returncode == 0 and "signatures NOT checked" in unsigned.stdout
    assert verify_text(replica.log, "--key", "not-a-key").returncode == 2
    assert verify_text(replica.log, "--key", replica.public, "--witness", tmp_path / "nope").returncode == 2
    assert verify_text(tmp_path / "missing.jsonl", "--key", replica.public).returncode == 1
    lines = replica.lines()
    lines[4] = lines[4].replace(b'"outcome":"ok"', b'"outcome":"denied"')
    replica.log.write_bytes(b"".join(lines))
    broken = verify_text(replica.log, "--key", replica.public)
    assert broken.returncode == 1 and broken.stdout.startswith("audit log BROKEN at line 5 of")


async def test_a_plain_log_fails_once_keys_are_required(tmp_path: Path) -> None:
    path = tmp_path / "plain.jsonl"
    async with await AuditLog.open(plain(path)) as log:
        await log.emit("mcp.request", **request_fields(1))
    create_signing_key(tmp_path / "k")
    pem = tmp_path / "k.pem"
    pem.write_text(public_pem(load_signing_key(tmp_path / "k").private.public_key()))
    assert verify(path)[0] == 0
    code, report = verify(path, "--key", pem)
    assert code == 1 and "no signed checkpoint" in problem(report)


# -- gaps ------------------------------------------------------------------------------------------


class FlakyDisk(FileSink):
    """A real file whose writes fail while `full` is set, like a disk that filled up."""

    full = False

    def write(self, data: bytes) -> None:
        if self.full:
            raise OSError(28, "No space left on device")
        super().write(data)


async def gap_log(tmp_path: Path) -> tuple[Replica, AuditLog, FlakyDisk]:
    replica = Replica(tmp_path / "r1", "r1")
    create_signing_key(replica.key_file)
    sink = FlakyDisk(replica.log)
    evidence = Evidence(notary=Notary(replica.signer, "r1", time.time_ns), witness=FileCopy(replica.witness))
    return replica, await AuditLog.with_sink(sink, evidence=evidence), sink


async def test_recovery_writes_a_signed_gap_record(tmp_path: Path) -> None:
    from broker.audit import AuditSinkError

    replica, log, sink = await gap_log(tmp_path)
    async with log:
        await log.emit("mcp.request", **request_fields(1))
        sink.full = True
        with pytest.raises(AuditSinkError):
            await log.emit("mcp.request", **request_fields(2))  # lost
        for _ in range(3):  # the requests refused meanwhile
            with pytest.raises(AuditSinkError):
                log.check()
        sink.full = False
        await log.emit("mcp.request", **request_fields(3))
        log.check()
        assert log.stats.gaps == 1
    recs = records(replica.lines())
    gaps = [r for r in recs if r["event"] == "audit.gap"]
    assert len(gaps) == 1
    gap = gaps[0]["gap"]
    assert (gap["refused"], gap["lost"], gap["replica"]) == (3, 1, "r1") and gap["from"] <= gap["to"]
    assert recs[recs.index(gaps[0]) + 1]["request_id"] == "req-000003"  # before the event that recovered
    assert {"gap": gap, "sig": gaps[0]["sig"]} in records(replica.witness.read_bytes().splitlines())
    code, report = verify(replica.log, "--key", replica.public, "--witness", replica.witness)
    assert code == 0 and report["files"][0]["gaps"] == [
        {"from": gap["from"], "to": gap["to"], "refused": 3, "lost": 1}
    ]
    result = verify_text(replica.log, "--key", replica.public)
    assert "gap: 3 refused, 1 lost" in result.stdout

    # Making the outage look smaller breaks the gap record's signature.
    lines = replica.lines()
    k = recs.index(gaps[0])
    recs[k]["gap"]["refused"] = 0
    lines[k] = canonical(recs[k]).encode() + b"\n"
    replica.log.write_bytes(b"".join(lines))
    code, report = verify_rewritten(replica, records(lines))
    assert code == 1 and "bad signature" in problem(report), report


# -- the key and the copies -------------------------------------------------------------------------


async def test_a_key_readable_by_others_is_refused(tmp_path: Path) -> None:
    from broker.audit import AuditSinkError

    replica = await write_log(tmp_path, events=1)
    replica.key_file.chmod(0o644)
    with pytest.raises(AuditSinkError) as err:
        await AuditLog.open(replica.settings())
    assert err.value.code == "key_invalid"


async def test_a_witness_that_cannot_be_written_does_not_stop_requests(tmp_path: Path) -> None:
    replica = Replica(tmp_path / "r1", "r1")
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("")
    settings = AuditSettings(
        path=replica.log,
        key_file=replica.key_file,
        witness_file=blocker / "witness.jsonl",
        checkpoint_every=2,
    )
    async with await AuditLog.open(settings) as log:
        for i in range(5):
            await log.emit("mcp.request", **request_fields(i))
        log.check()
        assert log.stats.copy_failures >= 2 and log.stats.checkpoints >= 3
    assert verify(replica.log, "--key", replica.public)[0] == 0


async def test_a_crash_between_rename_and_first_line_continues_from_the_rotated_file(tmp_path: Path) -> None:
    replica = await write_log(tmp_path, events=12, every=100)
    # what a crash right after the rename leaves: the rotated file, and no live file (or an empty one)
    replica.log.rename(replica.log.with_name("audit.jsonl.000001"))
    recs = records(replica.log.with_name("audit.jsonl.000001").read_bytes().splitlines())
    recs_after = 3
    async with await AuditLog.open(replica.settings(every=100)) as log:
        for i in range(recs_after):
            await log.emit("mcp.request", **request_fields(i))
    first = json.loads(replica.log.read_bytes().splitlines()[0])
    assert first["event"] == "audit.checkpoint" and first["seq"] == len(recs) + 1
    assert first["checkpoint"]["n"] == recs[-1]["checkpoint"]["n"] + 1
    files = [replica.log.with_name("audit.jsonl.000001"), replica.log]
    code, report = verify(*files, "--key", replica.public, "--witness", replica.witness)
    assert code == 0, report


class NoNewFile(FileSink):
    """Rotation renames the file, then cannot create the next one while `refuse` is set."""

    refuse = False

    def open(self) -> bytes | None:
        if self.refuse:
            raise OSError(13, "Permission denied")
        return super().open()


async def test_rotation_that_cannot_open_the_next_file_fails_closed_and_recovers(tmp_path: Path) -> None:
    from broker.audit import AuditSinkError

    replica = Replica(tmp_path / "r1", "r1")
    create_signing_key(replica.key_file)
    sink = NoNewFile(replica.log)
    evidence = Evidence(
        notary=Notary(replica.signer, "r1", time.time_ns),
        witness=FileCopy(replica.witness),
        rotate_bytes=2500,
    )
    async with await AuditLog.with_sink(sink, evidence=evidence) as log:
        sink.refuse = True
        i = 0
        while log.healthy and i < 100:  # the event that reaches the size is written; then the rotation fails
            await log.emit("mcp.request", **request_fields(i))
            i += 1
        with pytest.raises(AuditSinkError):
            log.check()
        sink.refuse = False
        await log.emit("mcp.request", **request_fields(i))
        log.check()
    files = [*rotated_files(replica.log), replica.log]
    assert len(files) == 2
    assert [r["event"] for r in records(replica.lines())][:2] == ["audit.checkpoint", "audit.gap"]
    code, report = verify(*files, "--key", replica.public, "--witness", replica.witness)
    assert code == 0 and report["files"][1]["gaps"][0]["refused"] == 1, report


async def test_a_copy_of_stdout_serves_as_the_witness(tmp_path: Path) -> None:
    replica = await write_log(tmp_path, events=22, every=5)
    shipped = tmp_path / "collected-stdout.jsonl"  # what a log collector kept of stdout
    shipped.write_bytes(replica.log.read_bytes())
    lines = replica.lines()
    replica.log.write_bytes(b"".join(lines[: len(lines) // 2]))
    assert verify(replica.log, "--key", replica.public)[0] == 0
    code, report = verify(replica.log, "--key", replica.public, "--witness", shipped)
    assert code == 1 and "cut back" in problem(report), report
    assert report["witnesses"][0]["records"] == sum(b"audit.checkpoint" in line for line in lines)


async def test_a_log_from_before_checkpoints_is_signed_from_its_first_line_on(tmp_path: Path) -> None:
    replica = Replica(tmp_path / "r1", "r1")
    async with await AuditLog.open(plain(replica.log)) as log:  # no key: a plain chain
        for i in range(4):
            await log.emit("mcp.request", **request_fields(i))
    async with await AuditLog.open(replica.settings()) as log:  # upgraded: a key from now on
        await log.emit("mcp.request", **request_fields(9))
    recs = records(replica.lines())
    assert recs[4]["event"] == "audit.checkpoint" and recs[4]["checkpoint"]["size"] == 4
    code, report = verify(replica.log, "--key", replica.public, "--witness", replica.witness)
    assert code == 0 and report["files"][0]["checkpoints"] == 2, report
