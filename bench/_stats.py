"""The statistics every benchmark uses: quantiles, medians, spreads, number formats."""

from __future__ import annotations

import math
import statistics


def pct(samples: list[float], q: float) -> float:
    """The q-quantile (0..1) by nearest rank."""
    if not samples:
        return float("nan")
    ordered = sorted(samples)
    return ordered[max(1, math.ceil(q * len(ordered))) - 1]


def nearest_index(values: list[float], q: float) -> float:
    """The q-quantile (0..1) at the nearest index of the sorted values (for a few runs, where
    nearest rank would report the maximum as p90)."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def med(values: list[float]) -> float:
    values = [v for v in values if v == v]
    return statistics.median(values) if values else float("nan")


def fmt(value: float, digits: int = 2, suffix: str = "") -> str:
    return "-" if value != value else f"{value:.{digits}f}{suffix}"


def spread(values: list[float], form: str) -> str:
    values = [v for v in values if v == v]
    return f"{form.format(min(values))}, {form.format(max(values))}" if values else "-"
