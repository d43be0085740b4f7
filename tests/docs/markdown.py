"""Reading the project's Markdown the way a reader (and GitHub) does: fenced and indented code
blocks, inline code, headings and their anchors, links. Only what tests/docs needs."""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from broker.testing import ROOT

_FENCE = re.compile(r"^(\s*)(```|~~~)")


def pages() -> list[Path]:
    """README and every page under docs/: whatever exists when the test runs."""
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


@dataclass(frozen=True)
class Snippet:
    """A piece of code a reader may copy: where it is (page, line) and its text."""

    page: Path
    line: int
    text: str
    block: bool  # a code block's line (True) or an inline code span (False)

    def where(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


def split(text: str) -> tuple[list[tuple[int, str]], list[tuple[int, str]]]:
    """(code lines, prose lines), each with its 1-based line number. Code: inside a fence, or
    indented by 4+ after a blank line outside a list (Markdown's indented code block)."""
    code: list[tuple[int, str]] = []
    prose: list[tuple[int, str]] = []
    fence: str | None = None
    indented = False
    previous_blank = True
    in_list = False
    for number, line in enumerate(text.splitlines(), start=1):
        opening = _FENCE.match(line)
        if fence is not None:
            if opening and opening.group(2) == fence:
                fence = None
            else:
                code.append((number, line))
            continue
        if opening:
            fence = opening.group(2)
            continue
        blank = not line.strip()
        if re.match(r"\s*([-*+]|\d+\.)\s", line):
            in_list = True
        elif not blank and not line.startswith(" "):
            in_list = False
        if line.startswith("    ") and not in_list and (previous_blank or indented) and not blank:
            indented = True
            code.append((number, line))
        else:
            indented = indented and blank
            prose.append((number, line))
        previous_blank = blank
    return code, prose


def snippets(page: Path) -> Iterator[Snippet]:
    """Every code line (continuations with a trailing `\\` joined) and every inline code span."""
    code, prose = split(page.read_text(encoding="utf-8"))
    pending: tuple[int, str] | None = None
    for number, line in code:
        if pending is not None:
            number, line = pending[0], pending[1] + " " + line.strip()
            pending = None
        if line.rstrip().endswith("\\"):
            pending = (number, line.rstrip()[:-1])
            continue
        yield Snippet(page, number, line.strip(), block=True)
    # Inline code may run over a line break: join the prose, remembering where each line starts.
    starts, joined, offset = [], [], 0
    for number, line in prose:
        starts.append((offset, number))
        joined.append(line)
        offset += len(line) + 1
    text = "\n".join(joined)
    for match in re.finditer(r"(?<!`)`([^`]+)`(?!`)", text):
        line = max(n for o, n in starts if o <= match.start())
        yield Snippet(page, line, " ".join(match.group(1).split()), block=False)


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation out, spaces to hyphens."""
    text = re.sub(r"<[^>]+>", "", heading).strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def _headings(page: Path) -> list[tuple[int, int, str]]:
    """(line, level, text) of every heading outside code."""
    _, prose = split(page.read_text(encoding="utf-8"))
    return [
        (number, len(m.group(1)), m.group(2).strip())
        for number, line in prose
        if (m := re.match(r"(#{1,6})\s+(.+?)\s*#*$", line))
    ]


def headings(page: Path) -> list[str]:
    return [text for _, _, text in _headings(page)]


def section(page: Path, heading: str) -> range:
    """The lines under `heading` (exactly one such heading), up to the next of its level or above."""
    found = _headings(page)
    starts = [(number, level) for number, level, text in found if text == heading]
    assert len(starts) == 1, f"{page.name}: {len(starts)} headings {heading!r}"
    start, level = starts[0]
    last = len(page.read_text(encoding="utf-8").splitlines())
    return range(start + 1, next((n for n, lv, _ in found if n > start and lv <= level), last + 1))


def anchors(page: Path) -> set[str]:
    found: set[str] = set()
    seen: dict[str, int] = {}
    for heading in headings(page):
        base = slug(heading)
        count = seen.get(base, 0)
        seen[base] = count + 1
        found.add(base if count == 0 else f"{base}-{count}")
    found.update(re.findall(r"<a\s+(?:id|name)=\"([^\"]+)\"", page.read_text(encoding="utf-8")))
    return found


def links(page: Path) -> Iterator[tuple[int, str]]:
    """(line, target) of every Markdown link outside code."""
    _, prose = split(page.read_text(encoding="utf-8"))
    for number, line in prose:
        for match in re.finditer(r"\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)", line):
            yield number, match.group(1)
