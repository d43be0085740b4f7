"""broker/files.py's line reader and name display, on real files (the opening itself is
exercised through the audit tools in tests/broker/hostile/test_hostile_audit_files.py)."""

from __future__ import annotations

from pathlib import Path

from broker.files import bounded_lines, open_regular_stream, printable

LIMIT = 1024


def test_an_over_long_line_comes_out_once_cut_at_the_limit(tmp_path: Path) -> None:
    path = tmp_path / "log"
    path.write_bytes(b"first\n" + b"x" * (5 * LIMIT) + b"\nlast\n" + b"torn")
    with open_regular_stream(path) as stream:
        lines = list(bounded_lines(stream, LIMIT))
    assert [len(line) for line in lines] == [6, LIMIT + 1, 5, 4]
    assert lines[0] == b"first\n" and lines[2] == b"last\n" and lines[3] == b"torn"


def test_a_line_of_exactly_the_limit_is_whole(tmp_path: Path) -> None:
    path = tmp_path / "log"
    path.write_bytes(b"y" * (LIMIT - 1) + b"\n" + b"z" * LIMIT + b"\nend\n")
    with open_regular_stream(path) as stream:
        lines = list(bounded_lines(stream, LIMIT))
    assert lines == [b"y" * (LIMIT - 1) + b"\n", b"z" * LIMIT + b"\n", b"end\n"]


def test_printable_escapes_what_would_drive_a_terminal() -> None:
    assert printable("audit.jsonl.000001") == "audit.jsonl.000001"
    assert printable("a\x1b]0;owned\x07\x1b[2J\nb\u202ec") == "a\\x1b]0;owned\\x07\\x1b[2J\\nb\\u202ec"
