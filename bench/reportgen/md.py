"""Markdown pieces the sections share: numbers, tables, images, target lines."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path


def num(value: float | None, digits: int = 2, suffix: str = "") -> str:
    """A number for a table cell; '-' for a missing or NaN one."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return f"{value:,.{digits}f}{suffix}"


def ratio(a: float | None, b: float | None) -> float | None:
    """a ÷ b, or None where either is missing or b is not above zero."""
    if a is None or b is None or math.isnan(a) or math.isnan(b) or b <= 0:
        return None
    return a / b


def table(headers: Sequence[str], rows: Sequence[Sequence[str]], numeric_from: int = 1) -> list[str]:
    """A markdown table, columns from `numeric_from` on aligned right."""
    align = ["---" if i < numeric_from else "---:" for i in range(len(headers))]
    out = ["| " + " | ".join(headers) + " |", "|" + "|".join(align) + "|"]
    out += ["| " + " | ".join(row) + " |" for row in rows]
    return out


def image(path: Path, alt: str) -> str:
    """A link to a plot, relative to REPORT.md (plots/ beside it)."""
    return f"![{alt}]({path.parent.name}/{path.name})"


def verdict(ok: bool) -> str:
    return "PASS" if ok else "FAIL"
