"""One job per module (issue 36): a module of `broker/` or `server/` over 450 lines says at its
top, in one line, why it is one job all the same (`# Over 450 lines: <its one job>.`), so
growing past the size is a decision someone wrote down, not an accident."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LIMIT = 450
MARK = "# Over 450 lines: "


def _modules() -> list[Path]:
    return sorted([*(ROOT / "broker").rglob("*.py"), *(ROOT / "server").rglob("*.py")])


def test_a_long_module_names_its_one_job_at_its_top() -> None:
    unexplained = []
    for path in _modules():
        lines = path.read_text().splitlines()
        if len(lines) > LIMIT and not (lines[0].startswith(MARK) and len(lines[0]) > len(MARK) + 20):
            unexplained.append(f"{path.relative_to(ROOT)} ({len(lines)} lines)")
    assert not unexplained, f"over {LIMIT} lines without '{MARK}…' on line 1: {unexplained}"


def test_the_walk_finds_modules() -> None:
    paths = _modules()
    assert len(paths) > 100 and ROOT / "broker" / "app.py" in paths
