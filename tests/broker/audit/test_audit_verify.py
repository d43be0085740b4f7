"""verify_file finds the first broken line, and names the line that was changed."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from broker.audit import AuditLog, main_verify, verify_file
from tests.broker.audit.audit_helpers import plain, request_fields

pytestmark = pytest.mark.anyio

N = 20


@pytest.fixture
async def lines(log_path: Path) -> list[bytes]:
    """A valid 20-line log; returns its lines, each with its newline."""
    async with await AuditLog.open(plain(log_path)) as log:
        for i in range(N):
            await log.emit("mcp.request", **request_fields(i))
    return log_path.read_bytes().splitlines(keepends=True)


def write(path: Path, lines: list[bytes]) -> None:
    path.write_bytes(b"".join(lines))


def edit(line: bytes, **changes: object) -> bytes:
    record = json.loads(line)
    record.update(changes)
    return json.dumps(record, sort_keys=True, separators=(",", ":")).encode() + b"\n"


def digest(line: bytes) -> str:
    return hashlib.sha256(line.rstrip(b"\n")).hexdigest()


def assert_broken_at(path: Path, line: int) -> None:
    report = verify_file(path)
    assert not report.ok
    assert report.first_bad_line == line, report.problem
    assert report.problem


async def test_intact_log_verifies(log_path: Path, lines: list[bytes]) -> None:
    report = verify_file(log_path)
    assert report.ok and report.lines == N and report.first_bad_line is None and report.problem is None
    assert report.head == digest(lines[-1])


async def test_empty_log_verifies(tmp_path: Path) -> None:
    (tmp_path / "empty.jsonl").touch()
    assert verify_file(tmp_path / "empty.jsonl").ok


@pytest.mark.parametrize("k", [1, 7, N - 1])
async def test_tampered_line(log_path: Path, lines: list[bytes], k: int) -> None:
    lines[k - 1] = edit(lines[k - 1], outcome="denied", reason="policy")  # still schema-valid
    write(log_path, lines)
    assert_broken_at(log_path, k)


async def test_tampered_line_that_leaves_the_schema(log_path: Path, lines: list[bytes]) -> None:
    lines[4] = edit(lines[4], query="what the attacker wants hidden")
    write(log_path, lines)
    assert_broken_at(log_path, 5)


async def test_hand_edited_whitespace(log_path: Path, lines: list[bytes]) -> None:
    lines[9] = lines[9].replace(b",", b", ", 1)
    write(log_path, lines)
    assert_broken_at(log_path, 10)


@pytest.mark.parametrize("k", [1, 8])
async def test_deleted_line(log_path: Path, lines: list[bytes], k: int) -> None:
    del lines[k - 1]
    write(log_path, lines)
    assert_broken_at(log_path, k)  # the first line after the hole


@pytest.mark.parametrize("k", [1, 12, N - 1])
async def test_reordered_pair(log_path: Path, lines: list[bytes], k: int) -> None:
    lines[k - 1], lines[k] = lines[k], lines[k - 1]
    write(log_path, lines)
    assert_broken_at(log_path, k)


async def test_inserted_copy_of_another_line(log_path: Path, lines: list[bytes]) -> None:
    lines.insert(10, lines[3])  # becomes line 11
    write(log_path, lines)
    assert_broken_at(log_path, 11)


async def test_inserted_duplicate_of_the_previous_line(log_path: Path, lines: list[bytes]) -> None:
    lines.insert(10, lines[9])  # a replayed line 10 becomes line 11
    write(log_path, lines)
    assert_broken_at(log_path, 11)


@pytest.mark.parametrize("k", [1, 6, N])
async def test_inserted_forged_line_with_correct_seq_and_prev(
    log_path: Path, lines: list[bytes], k: int
) -> None:
    # The forger links the new line to its predecessor; the original line k then repeats its place.
    seq, prev = (1, "0" * 64) if k == 1 else (k, digest(lines[k - 2]))
    forged = edit(lines[k - 1], seq=seq, prev=prev, outcome="ok", tool="read_document")
    lines.insert(k - 1, forged)
    write(log_path, lines)
    assert_broken_at(log_path, k)


async def test_truncated_last_line(log_path: Path, lines: list[bytes]) -> None:
    lines[-1] = lines[-1][: len(lines[-1]) // 2]
    write(log_path, lines)
    assert_broken_at(log_path, N)
    assert verify_file(log_path).lines == N


async def test_last_line_without_its_newline(log_path: Path, lines: list[bytes]) -> None:
    lines[-1] = lines[-1].rstrip(b"\n")
    write(log_path, lines)
    assert_broken_at(log_path, N)


async def test_lines_counts_the_whole_file_after_a_break(log_path: Path, lines: list[bytes]) -> None:
    lines[2] = b"garbage\n"
    write(log_path, lines)
    report = verify_file(log_path)
    assert (report.first_bad_line, report.lines) == (3, N)


async def test_duplicate_json_keys_are_refused(log_path: Path, lines: list[bytes]) -> None:
    lines[0] = lines[0].replace(b'{"arg_names"', b'{"tool":"x","arg_names"', 1)
    write(log_path, lines)
    assert_broken_at(log_path, 1)


async def test_problem_never_quotes_the_file(log_path: Path, lines: list[bytes]) -> None:
    lines[3] = edit(lines[3], **{"CANARY-key": "CANARY-value"})
    write(log_path, lines)
    assert "CANARY" not in (verify_file(log_path).problem or "")


async def test_main_verify(
    log_path: Path, lines: list[bytes], capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    assert main_verify(log_path) == 0
    assert f"OK: {N} lines" in capsys.readouterr().out

    del lines[4]
    write(log_path, lines)
    assert main_verify(log_path) == 1
    assert "BROKEN at line 5" in capsys.readouterr().out

    assert main_verify(tmp_path / "missing.jsonl") == 1
    assert "cannot read" in capsys.readouterr().out
