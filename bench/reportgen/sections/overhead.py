"""Broker overhead next to the direct server, the bare forwarder and mcp-proxy (broker_overhead.py)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from bench.reportgen import plots
from bench.reportgen.md import image, num, ratio, table
from bench.reportgen.runner import Context, Part, parsed, run_bench

PROXIES = ("mcp_proxy_http", "mcp_proxy_stdio")


@dataclass(frozen=True)
class Row:
    key: str
    label: str
    baseline: str | None
    p50_ms: float
    p99_ms: float
    added_p50_ms: float | None
    throughput: float
    throughput_ratio: float | None
    proxy_cpu_us: float
    server_cpu_us: float


@dataclass(frozen=True)
class Overhead:
    concurrency: int
    rounds: int
    rows: dict[str, Row]
    verdicts: list[tuple[str, str, str, str]]
    notes: list[str]  # the bench's own header: workload, noise warning

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Overhead:
        rows = {
            key: Row(
                key=key,
                label=str(r["label"]).strip(),
                baseline=r.get("baseline"),
                p50_ms=float(r["p50_ms"]),
                p99_ms=float(r["p99_ms"]),
                added_p50_ms=None if "added_p50_ms" not in r else float(r["added_p50_ms"]),
                throughput=float(r["throughput"]),
                throughput_ratio=None if "throughput_ratio" not in r else float(r["throughput_ratio"]),
                proxy_cpu_us=float(r["proxy_cpu_us"]),
                server_cpu_us=float(r["server_cpu_us"]),
            )
            for key, r in data["rows"].items()
        }
        if "broker" not in rows:
            raise KeyError("broker")
        return cls(
            concurrency=int(data["concurrency"]),
            rounds=int(data["rounds"]),
            rows=rows,
            verdicts=[(str(a), str(b), str(c), str(d)) for a, b, c, d in data.get("verdicts", [])],
            notes=[str(line) for line in data.get("header", [])[1:]],
        )

    def peer_ratios(self) -> list[tuple[str, float | None]]:
        """The broker's added p50 over each forwarder's, measured in the same rounds."""
        broker = self.rows["broker"].added_p50_ms
        out = []
        for key in ("bare", *PROXIES):
            if key in self.rows:
                peer = self.rows[key]
                out.append((peer.label, ratio(broker, peer.added_p50_ms)))
        return out


def bench_args(ctx: Context) -> list[str]:
    args = ["--rounds", "2", "--calls", "60", "--seconds", "3", "--warmup", "20"] if ctx.quick else []
    if ctx.options.get("no_mcp_proxy"):
        args.append("--no-mcp-proxy")
    return args


def render(result: Overhead) -> list[str]:
    c = result.concurrency
    rows = [
        [
            r.label,
            num(r.p50_ms),
            num(r.p99_ms),
            num(r.added_p50_ms, 3),
            num(r.throughput, 0),
            num(None if r.throughput_ratio is None else r.throughput_ratio * 100, 1, " %"),
            num(r.proxy_cpu_us, 0) if r.proxy_cpu_us > 0 else "-",
            num(r.server_cpu_us, 0),
        ]
        for r in result.rows.values()
    ]
    lines = [
        f"`bench/broker_overhead.py`: {result.rounds} alternating rounds; latency at c=1, throughput "
        f"at c={c}; each forwarder beside its baseline (the server it forwards to) in the same rounds.",
        "",
        *table(
            [
                "target",
                "p50 ms",
                "p99 ms",
                "added p50 ms",
                f"c={c} calls/s",
                "% of baseline",
                f"proxy CPU/call µs (c={c})",
                "server CPU/call µs",
            ],
            rows,
        ),
        "",
        "Side by side (same rounds):",
        "",
    ]
    for label, value in result.peer_ratios():
        lines.append(f"- broker added p50 ÷ {label} added p50: **{num(value)}**")
    if not any(key in result.rows for key in PROXIES):
        lines.append("- mcp-proxy: not measured this run (`--no-mcp-proxy`, or it could not be installed)")
    if result.verdicts:
        # The bench indents a verdict's detail rows (its rounds' spread); markdown would drop that.
        verdicts = [[("↳ " if v[0].startswith(" ") else "") + v[0].strip(), *v[1:]] for v in result.verdicts]
        lines += ["", *table(["target", "measured", "goal", "verdict"], verdicts)]
    if result.notes:
        lines += ["", *(f"> - {note}" for note in result.notes)]
    return lines


def draw(ctx: Context, result: Overhead) -> list[Any]:
    forwarders = [r for r in result.rows.values() if r.added_p50_ms is not None]
    labels = [r.label for r in forwarders]
    return [
        plots.bars(
            ctx.plot_path("overhead-added-p50.png"),
            "Added p50 latency at c=1 over each forwarder's baseline",
            labels,
            {"added p50 ms": [r.added_p50_ms or 0.0 for r in forwarders]},
            "ms",
        ),
        plots.bars(
            ctx.plot_path("overhead-throughput.png"),
            f"Throughput at c={result.concurrency}, % of the baseline's in the same rounds",
            labels,
            {"% of baseline": [(r.throughput_ratio or 0.0) * 100 for r in forwarders]},
            "%",
            line=(85.0, "target ≥ 85 % (broker)"),
        ),
    ]


def section(ctx: Context) -> Part:
    data = run_bench(ctx, "overhead", "broker_overhead.py", bench_args(ctx))
    result = parsed(data, Overhead.from_json, "bench/broker_overhead.py's JSON")
    ctx.results["overhead"] = result
    pngs = draw(ctx, result)
    return Part([*render(result), "", *(image(p, p.stem) for p in pngs)], pngs)
