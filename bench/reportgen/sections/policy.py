"""CPU per policy decision, Cedar beside the TOML path it replaced (policy_decision.py)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.reportgen import plots
from bench.reportgen.md import image, num, ratio, table, verdict
from bench.reportgen.runner import Context, Part, parsed, run_bench


@dataclass(frozen=True)
class Decision:
    name: str
    p50_us: float
    p90_us: float
    targeted: bool  # the target is about this path (a steady state), not the others


@dataclass(frozen=True)
class Policy:
    policies: int
    tenants: int
    target_us: float
    paths: list[Decision]  # the first is the TOML path, the baseline

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Policy:
        paths = [
            Decision(str(r["name"]), float(r["p50_us"]), float(r["p90_us"]), bool(r.get("target", False)))
            for r in data["rows"]
        ]
        if not paths:
            raise ValueError("no rows")
        return cls(int(data["policies"]), int(data["tenants"]), float(data["target_added_us"]), paths)


def bench_args(ctx: Context) -> list[str]:
    return ["--batches", "8", "--calls", "200"] if ctx.quick else []


def render(result: Policy) -> list[str]:
    base = result.paths[0]
    rows = []
    for p in result.paths:
        added = p.p50_us - base.p50_us
        rows.append(
            [
                p.name,
                num(p.p50_us),
                num(p.p90_us),
                num(ratio(p.p50_us, base.p50_us), 0) if p is not base else "1",
                "-"
                if p is base
                else num(added) + (f" ({verdict(added <= result.target_us)})" if p.targeted else ""),
            ]
        )
    return [
        f"`bench/policy_decision.py`: process CPU per decision with {result.policies} policies over "
        f"{result.tenants} tenants, each path in the same run.",
        "",
        *table(
            [
                "path",
                "p50 µs",
                "p90 µs",
                f"÷ {base.name}",
                f"added p50 µs (target ≤ {result.target_us:g}: verdict)",
            ],
            rows,
        ),
    ]


def draw(ctx: Context, result: Policy) -> Path:
    return plots.bars(
        ctx.plot_path("policy-decision.png"),
        f"CPU per policy decision, {result.policies} policies",
        [p.name for p in result.paths],
        {"p50": [p.p50_us for p in result.paths], "p90": [p.p90_us for p in result.paths]},
        "µs",
    )


def section(ctx: Context) -> Part:
    data = run_bench(ctx, "policy", "policy_decision.py", bench_args(ctx))
    result = parsed(data, Policy.from_json, "bench/policy_decision.py's JSON")
    ctx.results["policy"] = result
    png = draw(ctx, result)
    return Part([*render(result), "", image(png, png.stem)], [png])
