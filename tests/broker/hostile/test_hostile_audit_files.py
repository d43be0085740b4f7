"""Files an attacker plants for the security team's audit tools.

Someone who can write the audit folder (or the folder a witness or a proof is read from) plants
a FIFO, a link to `/dev/zero`, a 200 MB line, a name full of terminal escapes, 100k nested `[`,
or glues one byte to each witness record. The team then runs `docbroker audit verify`, `query`,
`export`, `prove` and `verify-proof` on them, by name or by `audit.jsonl*`. Each tool must
answer with one clear line and its exit code: no hang, no traceback, no flood of memory, no
escape sequence reaching the terminal, and no witness quietly ignored.

Every run is the real CLI in a fresh process (broker.testing.audit_cli), with a timeout, its
own peak memory measured and its address space capped so that a reader of `/dev/zero` fails
fast instead of taking the host's memory.
"""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path

import pytest

from broker.audit.processors import canonical
from broker.testing.audit_cli import AuditRun, run_audit
from tests.broker.audit.audit_helpers import Replica, write_log

TIMEOUT = 30.0  # each run takes about a second; a hang is what this catches
MEMORY_MIB = 100  # issue 24's target for the audit tools, whatever the input
HUGE = 200 * 1024 * 1024  # the planted line
NESTED = b"[" * 100_000


@pytest.fixture
def real(tmp_path: Path) -> Replica:
    return asyncio.run(write_log(tmp_path, "r1"))  # 22 events, a signed checkpoint every 5


def assert_clean(run: AuditRun) -> None:
    """No hang, no traceback, no escape sequence, memory within the target."""
    assert not run.hung, f"hung: killed after {TIMEOUT} s"
    assert "Traceback" not in run.stderr, run.stderr
    assert "\x1b" not in run.stdout + run.stderr and "\x07" not in run.stdout + run.stderr
    assert run.peak_mib < MEMORY_MIB, f"peak {run.peak_mib:.0f} MiB"


def one_line_with(run: AuditRun, text: str) -> str:
    found = [line for line in (run.stdout + run.stderr).splitlines() if text in line]
    assert len(found) == 1, (run.stdout, run.stderr)
    return found[0]


def plant(kind: str, path: Path) -> Path:
    if kind == "fifo":
        os.mkfifo(path)
    else:
        path.symlink_to("/dev/zero")
    return path


def tool_args(tool: str, real: Replica, planted: Path) -> tuple[str | Path, ...]:
    """Each tool, given the planted file where it takes a file."""
    return {
        "verify": ("verify", real.log, planted),
        "query": ("query", real.log, planted),
        "export": ("export", "--format", "ocsf", real.log, planted),
        "prove": ("prove", real.log, planted, "--seq", "2"),
        "verify-proof": ("verify-proof", planted, "--key", real.public),
        "witness": ("verify", real.log, "--witness", planted, "--key", real.public),
    }[tool]


EXIT = {"verify": 1, "query": 1, "export": 1, "prove": 1, "verify-proof": 2, "witness": 2}


@pytest.mark.parametrize("kind", ["fifo", "dev-zero-link"])
@pytest.mark.parametrize("tool", list(EXIT))
def test_a_fifo_or_a_link_to_dev_zero_is_refused_in_one_line(real: Replica, tool: str, kind: str) -> None:
    # Named like a rotated file, so `audit.jsonl*` picks it up beside the real log.
    planted = plant(kind, real.dir / "audit.jsonl.000002")
    run = run_audit(*tool_args(tool, real, planted), timeout=TIMEOUT)
    assert_clean(run)
    assert run.code == EXIT[tool], (run.stdout, run.stderr)
    one_line_with(run, "not a regular file (refused)")
    if tool == "verify":  # the real log is still verified beside it
        one_line_with(run, "audit log OK")


def test_a_200_mb_line_is_one_bad_line_held_in_bounded_memory(real: Replica) -> None:
    lines = real.lines()
    with real.log.open("wb") as out:
        out.writelines(lines[:2])
        out.write(b"{" + b"x" * HUGE + b"}\n")
        out.writelines(lines[2:])
    total = len(lines) + 1

    run = run_audit("verify", real.log, "--key", real.public, timeout=TIMEOUT)
    assert_clean(run)
    assert run.code == 1
    assert one_line_with(run, "BROKEN").startswith(f"audit log BROKEN at line 3 of {total}: line too long")

    for tool in (("query", real.log), ("export", "--format", "ocsf", real.log)):
        run = run_audit(*tool, timeout=TIMEOUT)
        assert_clean(run)
        assert run.code == 0 and "skipped 1 lines that are not audit events" in run.stderr, run.stderr

    run = run_audit("prove", real.log, "--seq", "2", timeout=TIMEOUT)
    assert_clean(run)
    assert run.code == 1 and "line 3 of audit.jsonl (line too long)" in one_line_with(run, "does not verify")


def test_a_200_mb_proof_or_witness_line_is_refused_in_bounded_memory(real: Replica) -> None:
    huge = real.dir / "proof.json"
    with huge.open("wb") as out:
        out.write(b'{"line":"' + b"x" * HUGE + b'"}\n')
    for args, stdin in (((huge,), None), (("-",), huge.read_bytes())):
        run = run_audit("verify-proof", *args, "--key", real.public, stdin=stdin, timeout=TIMEOUT)
        assert_clean(run)
        assert run.code == 2 and "bytes, no proof is (refused)" in one_line_with(run, "cannot read the proof")

    records = real.witness.read_bytes().splitlines(keepends=True)
    with real.witness.open("wb") as out:
        out.write(records[0] + b"{" + b"x" * HUGE + b"}\n" + b"".join(records[1:]))
    run = run_audit("verify", real.log, "--witness", real.witness, "--key", real.public, timeout=TIMEOUT)
    assert_clean(run)
    assert run.code == 1
    assert one_line_with(run, "witness BROKEN").startswith("witness BROKEN: line 2: line too long")


def test_100k_nested_brackets_are_one_bad_line_named_by_its_number(real: Replica) -> None:
    lines = real.lines()
    real.log.write_bytes(b"".join(lines[:2]) + NESTED + b"\n" + b"".join(lines[3:]))
    run = run_audit("verify", real.log, "--key", real.public, timeout=TIMEOUT)
    assert_clean(run)
    assert run.code == 1
    assert one_line_with(run, "BROKEN").startswith(f"audit log BROKEN at line 3 of {len(lines)}: JSON nested")

    run = run_audit("prove", real.log, "--seq", "2", timeout=TIMEOUT)
    assert_clean(run)
    assert run.code == 1 and "line 3 of audit.jsonl (JSON nested" in one_line_with(run, "does not verify")

    for args, stdin in (((real.dir / "proof.json",), None), (("-",), NESTED)):
        (real.dir / "proof.json").write_bytes(NESTED)
        run = run_audit("verify-proof", *args, "--key", real.public, stdin=stdin, timeout=TIMEOUT)
        assert_clean(run)
        assert run.code == 2 and "JSON nested" in one_line_with(run, "cannot read the proof")

    records = real.witness.read_bytes().splitlines(keepends=True)
    real.witness.write_bytes(records[0] + NESTED + b"\n" + b"".join(records[1:]))
    run = run_audit("verify", real.log, "--witness", real.witness, "--key", real.public, timeout=TIMEOUT)
    assert_clean(run)
    assert one_line_with(run, "witness BROKEN").startswith("witness BROKEN: line 2: not a JSON line")


def test_terminal_escapes_in_planted_names_never_reach_the_terminal(real: Replica) -> None:
    name = "audit.jsonl.\x1b]0;owned\x07\x1b[2J"
    planted = real.dir / name
    planted.write_bytes(b'{"event":"\x1b[31mred"}\n')  # a regular file: verified, and broken
    fifo = plant("fifo", real.dir / (name + "2"))
    run = run_audit("verify", *sorted(real.dir.glob("audit.jsonl*")), timeout=TIMEOUT)
    assert_clean(run)
    assert run.code == 1
    shown = f"({real.dir}/audit.jsonl.\\x1b]0;owned\\x07\\x1b[2J)"  # escaped, as text
    assert one_line_with(run, "not a JSON line").endswith(shown)
    one_line_with(run, "not a regular file (refused)")
    for tool in (("query", real.log, fifo), ("prove", real.log, fifo, "--seq", "2")):
        run = run_audit(*tool, timeout=TIMEOUT)
        assert_clean(run)
        assert run.code == 1 and "\\x1b" in one_line_with(run, "not a regular file (refused)")


def test_a_byte_glued_to_each_witness_record_does_not_hide_a_cut_tail(real: Replica) -> None:
    lines = real.lines()
    cut = [i for i, line in enumerate(lines) if b'"event":"audit.checkpoint"' in line][2]
    real.log.write_bytes(b"".join(lines[:cut]))  # cut back behind a shipped checkpoint
    run = run_audit("verify", real.log, "--key", real.public, "--witness", real.witness, timeout=TIMEOUT)
    assert run.code == 1 and "cut back" in run.stdout, run.stdout  # the witness as shipped: caught

    records = real.witness.read_bytes().splitlines()
    real.witness.write_bytes(b"".join(record + b" x\n" for record in records))
    run = run_audit("verify", real.log, "--key", real.public, "--witness", real.witness, "--json")
    assert_clean(run)
    assert run.code == 1, run.stdout
    report = json.loads(run.stdout)
    assert report["files"][0]["ok"]  # the log alone still looks whole: the witness is what fails
    assert report["witnesses"][0] == {
        "path": str(real.witness),
        "ok": False,
        "records": 0,
        "problem": "line 1: not a JSON line (or nested too deep)",
    }


def test_a_checkpoint_frontier_that_does_not_fit_its_size_is_one_bad_line(real: Replica) -> None:
    # The frontier is not signed: a genuine checkpoint, its frontier cut, in a file given
    # without its start (the tree is anchored on that checkpoint).
    lines = real.lines()
    events = [json.loads(line)["event"] for line in lines]
    start = events.index("mcp.request", 3)
    at = events.index("audit.checkpoint", start)
    record = json.loads(lines[at])
    record["frontier"] = record["frontier"][1:]
    lines[at] = canonical(record).encode("ascii") + b"\n"
    real.log.write_bytes(b"".join(lines[start:]))
    run = run_audit("verify", real.log, "--key", real.public, timeout=TIMEOUT)
    assert_clean(run)
    assert run.code == 1
    verdict = one_line_with(run, "checkpoint frontier does not fit its tree size")
    assert verdict.startswith(f"audit log BROKEN at line {at - start + 1} of"), verdict
