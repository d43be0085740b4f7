"""broker_overhead.py's comparison table: rows per target, verdicts against the targets, printing.

(bench/make_report.py renders the same rows from the bench's --json into bench/REPORT.md.)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from bench._stats import fmt, med, pct, spread
from bench.clients import LoadResult, Target
from bench.workload import TARGET_ADDED_MS, TARGET_RATIO, TARGET_THROUGHPUT


@dataclass
class Series:
    lat_rounds: list[list[float]] = field(default_factory=list)  # c=1 samples, per round
    lat_proxy_cpu: list[float] = field(default_factory=list)  # c=1 proxy CPU seconds per call, per round
    load_rounds: list[LoadResult] = field(default_factory=list)

    def p50(self, r: int) -> float:
        return pct(self.lat_rounds[r], 0.50)

    @property
    def all_latencies(self) -> list[float]:
        return [s for rnd in self.lat_rounds for s in rnd]


def build_report(targets: list[Target], data: dict[str, Series], concurrency: int) -> dict[str, Any]:
    rows: dict[str, dict[str, Any]] = {}
    rounds = min(len(s.lat_rounds) for s in data.values())
    for t in targets:
        s = data[t.key]
        row: dict[str, Any] = {
            "label": t.label,
            "p50_ms": med([s.p50(r) for r in range(rounds)]) * 1000,
            "p99_ms": pct(s.all_latencies, 0.99) * 1000,
            "calls_c1": len(s.all_latencies),
            "throughput": med([lr.throughput for lr in s.load_rounds]),
            "calls_cn": sum(lr.calls for lr in s.load_rounds),
            "p50_cn_ms": pct([x for lr in s.load_rounds for x in lr.latencies], 0.50) * 1000,
        }
        n = sum(lr.calls for lr in s.load_rounds) or 1
        row["proxy_cpu_us"] = sum(lr.proxy_cpu for lr in s.load_rounds) / n * 1e6
        row["proxy_cpu_c1_us"] = med(s.lat_proxy_cpu) * 1e6
        row["server_cpu_us"] = sum(lr.server_cpu for lr in s.load_rounds) / n * 1e6
        row["client_cpu_us"] = sum(lr.client_cpu for lr in s.load_rounds) / n * 1e6
        if t.baseline is not None:
            b = data[t.baseline]
            row["baseline"] = t.baseline
            # Per-round pairs, kept for their spread: on a noisy machine a verdict near the
            # line means little without it.
            added_rounds = [(s.p50(r) - b.p50(r)) * 1000 for r in range(rounds)]
            pairs = zip(s.load_rounds, b.load_rounds, strict=True)
            ratio_rounds = [lr.throughput / lb.throughput for lr, lb in pairs]
            row["added_p50_ms"] = med(added_rounds)
            row["added_p50_ms_rounds"] = added_rounds
            row["throughput_ratio"] = med(ratio_rounds)
            row["throughput_ratio_rounds"] = ratio_rounds
        rows[t.key] = row
    return {"rows": rows, "rounds": rounds, "concurrency": concurrency}


def verdicts(report: dict[str, Any]) -> list[tuple[str, str, str, str]]:
    rows = report["rows"]
    out = []
    broker = rows["broker"]
    added = broker["added_p50_ms"]
    out.append(
        (
            "broker added p50 latency, c=1",
            f"{added:.3f} ms",
            f"≤ {TARGET_ADDED_MS} ms",
            "PASS" if added <= TARGET_ADDED_MS else "FAIL",
        )
    )
    out.append(
        (
            "  rounds: lowest, highest",
            spread(broker["added_p50_ms_rounds"], "{:.3f}"),
            "info",
            "",
        )
    )
    ratio = broker["throughput_ratio"]
    out.append(
        (
            f"broker throughput vs direct, c={report['concurrency']}",
            f"{ratio * 100:.1f} %",
            f"≥ {TARGET_THROUGHPUT * 100:.0f} %",
            "PASS" if ratio >= TARGET_THROUGHPUT else "FAIL",
        )
    )
    out.append(
        (
            "  rounds: lowest, highest",
            spread([r * 100 for r in broker["throughput_ratio_rounds"]], "{:.1f}"),
            "info",
            "",
        )
    )
    proxies = [(k, rows[k]) for k in ("mcp_proxy_http", "mcp_proxy_stdio") if k in rows]
    if proxies:
        key, peer = min(proxies, key=lambda kv: kv[1]["added_p50_ms"])
        peer_added = peer["added_p50_ms"]
        r = added / peer_added if peer_added > 0 else float("inf")
        out.append(
            (
                f"broker added ÷ mcp-proxy added ({peer['label'].strip()}: {peer_added:.2f} ms)",
                f"{r:.3f}",
                f"≤ {TARGET_RATIO:.3f}",
                "PASS" if r <= TARGET_RATIO else "FAIL",
            )
        )
        for k, other in proxies:
            if k != key and other["added_p50_ms"] > 0:
                out.append(
                    (
                        f"  (vs {other['label'].strip()}: {other['added_p50_ms']:.2f} ms)",
                        f"{added / other['added_p50_ms']:.3f}",
                        "info",
                        "",
                    )
                )
    else:
        out.append(("broker added ÷ mcp-proxy added", "-", f"≤ {TARGET_RATIO:.3f}", "SKIP"))
    return out


def report_lines(report: dict[str, Any], header: list[str]) -> list[str]:
    """The table as text lines, as broker_overhead.py prints it."""
    out: list[str] = []
    rows = report["rows"]
    c = report["concurrency"]
    cols = (
        ("target", 40, "<"),
        ("p50 ms", 8, ">"),
        ("p99 ms", 8, ">"),
        ("added p50", 10, ">"),
        (f"c={c} calls/s", 13, ">"),
        ("% of base", 10, ">"),
        (f"c={c} p50 ms", 12, ">"),
        ("proxy CPU c=1", 14, ">"),
        (f"c={c}", 10, ">"),
        ("server CPU/call", 16, ">"),
    )
    out.append("")
    for line in header:
        out.append(line)
    out.append("")
    out.append("".join(f"{name:{align}{width}}" for name, width, align in cols))
    out.append("-" * sum(w for _, w, _ in cols))
    for row in rows.values():
        cells = [
            row["label"],
            fmt(row["p50_ms"]),
            fmt(row["p99_ms"]),
            fmt(row["added_p50_ms"], 3) if "added_p50_ms" in row else "-",
            fmt(row["throughput"], 0),
            fmt(row["throughput_ratio"] * 100, 1, " %") if "throughput_ratio" in row else "-",
            fmt(row["p50_cn_ms"]),
            fmt(row["proxy_cpu_c1_us"], 0, " µs") if row["proxy_cpu_c1_us"] > 0 else "-",
            fmt(row["proxy_cpu_us"], 0, " µs") if row["proxy_cpu_us"] > 0 else "-",
            fmt(row["server_cpu_us"], 0, " µs"),
        ]
        pairs = zip(cells, cols, strict=True)
        out.append("".join(f"{cell:{align}{width}}" for cell, (_, width, align) in pairs))
    out.append("")
    out.append("baselines: broker → direct (unix socket) = the very process it forwards to;")
    out.append(
        "           mcp-proxy → direct (TCP) = the server it forwards to (HTTP→HTTP) / same code (HTTP→stdio)"
    )
    client_us = med([row["client_cpu_us"] for row in rows.values()])
    out.append(
        f"client (this process) CPU per call at c={c}: ~{client_us:.0f} µs; "
        "CPU columns: /proc utime+stime ÷ calls"
    )
    out.append("")
    results = verdicts(report)
    width = max(len(r[0]) for r in results) + 2
    out.append("targets")
    for name, value, target, verdict in results:
        out.append(f"  {name:<{width}}{value:>14}   {target:<10} {verdict}")
    return out


def print_report(report: dict[str, Any], header: list[str]) -> None:
    print("\n".join(report_lines(report, header)))
