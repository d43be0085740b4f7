"""PNG plots with matplotlib (the Agg backend: no display), one small figure per call."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # before pyplot: files only, whatever $DISPLAY says

import matplotlib.pyplot as plt

_SIZE = (7.0, 3.6)
_DPI = 100


def bars(
    path: Path,
    title: str,
    labels: Sequence[str],
    series: dict[str, Sequence[float]],
    ylabel: str,
    line: tuple[float, str] | None = None,
) -> Path:
    """Grouped vertical bars: one group per label, one bar per series; `line` a horizontal
    reference (a target, a floor) with its name."""
    fig, ax = plt.subplots(figsize=_SIZE)
    width = 0.8 / max(len(series), 1)
    for i, (name, values) in enumerate(series.items()):
        xs = [x + (i - (len(series) - 1) / 2) * width for x in range(len(labels))]
        ax.bar(xs, [v if v == v else 0.0 for v in values], width, label=name)
    if line is not None:
        ax.axhline(line[0], color="black", linestyle="--", linewidth=1, label=line[1])
    ax.set_xticks(range(len(labels)), list(labels), rotation=20, ha="right", fontsize=8)
    ax.set_ylabel(ylabel)
    ax.set_ylim(bottom=0)
    ax.set_title(title, fontsize=10)
    if len(series) > 1 or line is not None:
        ax.legend(fontsize=8)
    ax.grid(axis="y", alpha=0.3)
    return _save(fig, path)


def lines(
    path: Path,
    title: str,
    xs: Sequence[float],
    series: dict[str, Sequence[float]],
    xlabel: str,
    ylabel: str,
    logx: bool = False,
    right: dict[str, Sequence[float]] | None = None,
    right_label: str = "",
    line: tuple[float, str] | None = None,
) -> Path:
    """How something grows: one marked line per series over xs; `right` on a second y axis."""
    fig, ax = plt.subplots(figsize=_SIZE)
    for name, values in series.items():
        ax.plot(xs, values, marker="o", label=name)
    if line is not None:
        ax.axhline(line[0], color="black", linestyle="--", linewidth=1, label=line[1])
    handles, names = ax.get_legend_handles_labels()
    if right:
        other = ax.twinx()
        for name, values in right.items():
            other.plot(xs, values, marker="s", linestyle=":", color="tab:red", label=name)
        other.set_ylabel(right_label)
        more_handles, more_names = other.get_legend_handles_labels()
        handles, names = handles + more_handles, names + more_names
        other.set_ylim(bottom=0)
    if logx:
        ax.set_xscale("log")
    ax.set_ylim(bottom=0)  # from zero: a small difference drawn as a cliff misleads
    ax.set_xticks(list(xs), [f"{x:g}" for x in xs])
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=10)
    ax.legend(handles, names, fontsize=8)
    ax.grid(alpha=0.3)
    return _save(fig, path)


def _save(fig: matplotlib.figure.Figure, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=_DPI, format="png")
    plt.close(fig)
    return path
