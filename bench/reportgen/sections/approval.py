"""The approval round trip on SQLite and on PostgreSQL, side by side (approval_roundtrip.py)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.reportgen import plots
from bench.reportgen.md import image, num, ratio, table
from bench.reportgen.runner import Context, Part, parsed, run_bench

STORES = ("sqlite", "postgresql")


@dataclass(frozen=True)
class Step:
    name: str
    p50_ms: dict[str, float]  # store: ms
    p90_ms: dict[str, float]


@dataclass(frozen=True)
class Approval:
    n: int
    steps: list[Step]
    added_p50_ms: float
    target_ms: float
    verdict: str

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Approval:
        steps = [
            Step(
                name=str(name),
                p50_ms={store: float(stores[store]["p50_ms"]) for store in STORES},
                p90_ms={store: float(stores[store]["p90_ms"]) for store in STORES},
            )
            for name, stores in data["steps"].items()
        ]
        return cls(
            n=int(data["n"]),
            steps=steps,
            added_p50_ms=float(data["added_p50_ms"]),
            target_ms=float(data["target_added_ms"]),
            verdict=str(data["verdict"]),
        )


def bench_args(ctx: Context) -> list[str]:
    return ["--rounds", "2", "--per-round", "5", "--warmup", "3"] if ctx.quick else []


def render(result: Approval) -> list[str]:
    rows = [
        [
            s.name,
            f"{num(s.p50_ms['sqlite'])} / {num(s.p90_ms['sqlite'])}",
            f"{num(s.p50_ms['postgresql'])} / {num(s.p90_ms['postgresql'])}",
            num(ratio(s.p50_ms["postgresql"], s.p50_ms["sqlite"])),
        ]
        for s in result.steps
    ]
    return [
        f"`bench/approval_roundtrip.py`: propose → approve → consume at c=1, n={result.n} per store, two "
        "brokers differing only in their approvals store, in alternating rounds.",
        "",
        *table(["step", "SQLite p50 / p90 ms", "PostgreSQL p50 / p90 ms", "PostgreSQL ÷ SQLite (p50)"], rows),
        "",
        f"Target: PostgreSQL adds ≤ {result.target_ms:g} ms p50 to the round trip: "
        f"{result.added_p50_ms:+.2f} ms, **{result.verdict}**.",
    ]


def draw(ctx: Context, result: Approval) -> Path:
    return plots.bars(
        ctx.plot_path("approval-roundtrip.png"),
        "Approval round trip, p50 per step",
        [s.name for s in result.steps],
        {store: [s.p50_ms[store] for s in result.steps] for store in STORES},
        "ms",
    )


def section(ctx: Context) -> Part:
    data = run_bench(ctx, "approval", "approval_roundtrip.py", bench_args(ctx))
    result = parsed(data, Approval.from_json, "bench/approval_roundtrip.py's JSON")
    ctx.results["approval"] = result
    png = draw(ctx, result)
    return Part([*render(result), "", image(png, png.stem)], [png])
