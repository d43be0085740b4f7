"""Audit cost: checkpoints per request at several intervals (audit_checkpoints.py), and reading
a log back (audit_throughput.py)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.reportgen import plots
from bench.reportgen.md import image, num, ratio, table
from bench.reportgen.runner import Context, NotMeasured, Part, parsed, run_bench

INTERVALS = "100,1000,10000"


@dataclass(frozen=True)
class Interval:
    every: int
    chunks: int
    checkpoints: int
    plain_us: float
    signed_us: float
    added_us: float
    added_mean_us: float


@dataclass(frozen=True)
class Checkpoints:
    target_us: float
    verdict: str
    checked_every: int
    one_checkpoint_us: float
    intervals: list[Interval]

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Checkpoints:
        intervals = [
            Interval(
                every=int(i["every"]),
                chunks=int(i["chunks"]),
                checkpoints=int(i["checkpoints"]),
                plain_us=float(i["plain_us"]),
                signed_us=float(i["signed_us"]),
                added_us=float(i["added_us"]),
                added_mean_us=float(i["added_mean_us"]),
            )
            for i in data["intervals"]
        ]
        if not intervals:
            raise ValueError("no intervals")
        return cls(
            target_us=float(data["target_added_us"]),
            verdict=str(data["verdict"]),
            checked_every=int(data["checked_every"]),
            one_checkpoint_us=float(data["one_checkpoint_us"]),
            intervals=sorted(intervals, key=lambda i: i.every),
        )


@dataclass(frozen=True)
class Command:
    name: str
    lines: int
    wall_s: float
    cpu_s: float
    lines_per_cpu_s: float
    mib_per_cpu_s: float
    ok: bool


@dataclass(frozen=True)
class Throughput:
    lines: int
    size_bytes: int
    commands: list[Command]

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Throughput:
        return cls(
            lines=int(data["lines"]),
            size_bytes=int(data["size_bytes"]),
            commands=[
                Command(
                    name=str(c["name"]),
                    lines=int(c["lines"]),
                    wall_s=float(c["wall_s"]),
                    cpu_s=float(c["cpu_s"]),
                    lines_per_cpu_s=float(c["lines_per_cpu_s"]),
                    mib_per_cpu_s=float(c["mib_per_cpu_s"]),
                    ok=bool(c["ok"]),
                )
                for c in data["commands"]
            ],
        )


def render_checkpoints(result: Checkpoints) -> list[str]:
    rows = [
        [
            f"{i.every:,}",
            str(i.checkpoints),
            num(i.plain_us),
            num(i.signed_us),
            num(ratio(i.signed_us, i.plain_us)),
            num(i.added_us),
            num(i.added_mean_us),
        ]
        for i in result.intervals
    ]
    return [
        "`bench/audit_checkpoints.py`: CPU per request of the audit writer (`emit` + `settle`), a "
        "plain hash chain and a log with signed checkpoints written side by side, chunk by chunk, "
        "for each checkpoint interval.",
        "",
        *table(
            [
                "checkpoint every (lines)",
                "checkpoints",
                "plain µs/event",
                "signed µs/event",
                "signed ÷ plain",
                "added µs (median)",
                "added µs (mean)",
            ],
            rows,
            numeric_from=0,
        ),
        "",
        f"Target: added ≤ {result.target_us:g} µs per event at the broker's interval "
        f"({result.checked_every:,} lines): **{result.verdict}**. One checkpoint on its own (tree head, "
        f"Ed25519 signature, line, witness copy): {num(result.one_checkpoint_us, 1)} µs.",
    ]


def render_throughput(result: Throughput) -> list[str]:
    rows = [
        [
            c.name + ("" if c.ok else " (failed)"),
            num(c.wall_s, 1),
            num(c.cpu_s, 1),
            num(c.lines_per_cpu_s, 0),
            num(c.mib_per_cpu_s, 1),
        ]
        for c in result.commands
    ]
    return [
        f"`bench/audit_throughput.py`: the CLI reading a generated log of {result.lines:,} lines "
        f"({result.size_bytes / 2**20:,.0f} MiB).",
        "",
        *table(["`docbroker audit …`", "wall s", "CPU s", "lines / CPU s", "MiB / CPU s"], rows),
    ]


def draw_checkpoints(ctx: Context, result: Checkpoints) -> Path:
    return plots.lines(
        ctx.plot_path("audit-checkpoint-interval.png"),
        "Audit CPU added per event by signed checkpoints",
        [float(i.every) for i in result.intervals],
        {
            "added (median)": [i.added_us for i in result.intervals],
            "added (mean)": [i.added_mean_us for i in result.intervals],
        },
        "checkpoint every N lines",
        "µs per event",
        logx=True,
        line=(result.target_us, f"target ≤ {result.target_us:g} µs"),
    )


def draw_throughput(ctx: Context, result: Throughput) -> Path:
    return plots.bars(
        ctx.plot_path("audit-read-throughput.png"),
        "Reading the audit log back: lines per CPU second",
        [c.name for c in result.commands],
        {"lines / CPU s": [c.lines_per_cpu_s for c in result.commands]},
        "lines / CPU s",
    )


def section(ctx: Context) -> Part:
    lines: list[str] = []
    pngs: list[Path] = []
    events = ["--events", "20000"] if ctx.quick else []
    try:
        data = run_bench(ctx, "audit_checkpoints", "audit_checkpoints.py", [*events, "--every", INTERVALS])
        checkpoints = parsed(data, Checkpoints.from_json, "bench/audit_checkpoints.py's JSON")
    except NotMeasured as exc:
        lines.append(f"Checkpoints: not measured: {exc.reason}")
    else:
        ctx.results["audit_checkpoints"] = checkpoints
        pngs.append(draw_checkpoints(ctx, checkpoints))
        lines += [*render_checkpoints(checkpoints), "", image(pngs[-1], pngs[-1].stem)]
    lines.append("")
    try:
        size = ["--mb", "4" if ctx.quick else "256"]
        data = run_bench(ctx, "audit_throughput", "audit_throughput.py", size)
        throughput = parsed(data, Throughput.from_json, "bench/audit_throughput.py's JSON")
    except NotMeasured as exc:
        lines.append(f"Reading the log back: not measured: {exc.reason}")
    else:
        ctx.results["audit_throughput"] = throughput
        pngs.append(draw_throughput(ctx, throughput))
        lines += [*render_throughput(throughput), "", image(pngs[-1], pngs[-1].stem)]
    return Part(lines, pngs)
