"""A tenant's first call, pooled and cold (cold_start.py), and a burst of new tenants (burst.py)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench._stats import med, nearest_index
from bench.reportgen import plots
from bench.reportgen.md import image, num, ratio, table, verdict
from bench.reportgen.runner import Context, Part, parsed, run_bench

# cold_start.py's series: (JSON key, label, the pooled series it is compared with)
PATHS = (
    ("broker_pooled_s", "through the broker, warm pool", "broker_pooled_s"),
    ("broker_cold_s", "through the broker, no pool (container start)", "broker_pooled_s"),
    ("backend_pooled_s", "DockerBackend, a pooled sandbox", "backend_pooled_s"),
    ("backend_cold_s", "DockerBackend, a new container", "backend_pooled_s"),
    ("naive_s", "naive `docker run -i`, MCP over stdio", "backend_pooled_s"),
)


@dataclass(frozen=True)
class ColdStart:
    daemon: str
    runs: int
    cpus: float
    series: dict[str, list[float]]  # seconds; an empty list: not measured on this daemon
    idle_mib: float
    floors_mib: dict[str, float]
    image_mb: float

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ColdStart:
        return cls(
            daemon=str(data["daemon"]),
            runs=int(data["runs"]),
            cpus=float(data["cpus"]),
            series={key: [float(v) for v in data[key]] for key, _, _ in PATHS},
            idle_mib=float(data["idle_mib"]),
            floors_mib={str(k): float(v) for k, v in data["floors_mib"].items()},
            image_mb=float(data["image_mb"]),
        )

    def p50_ms(self, key: str) -> float | None:
        values = self.series[key]
        return med(values) * 1000 if values else None

    def p90_ms(self, key: str) -> float | None:
        values = self.series[key]
        return nearest_index(values, 0.9) * 1000 if values else None


def cold_args(ctx: Context) -> list[str]:
    host = ctx.env.get("DOCKER_HOST_ROOTFUL") or ctx.env.get("DOCKER_HOST")
    args = ["--host", host] if host else []
    return [*args, "--runs", "2", "--idle-wait", "1"] if ctx.quick else args


def render_cold(result: ColdStart) -> list[str]:
    rows = []
    for key, label, pooled in PATHS:
        rows.append(
            [
                label,
                str(len(result.series[key])),
                num(result.p50_ms(key), 0),
                num(result.p90_ms(key), 0),
                "1" if key == pooled else num(ratio(result.p50_ms(key), result.p50_ms(pooled))),
            ]
        )
    lines = [
        f"`bench/cold_start.py` on Docker ({result.daemon}), sandbox CPU limit {result.cpus:g}: "
        "a new tenant's first `tools/call` until its result; pooled and cold in the same run.",
        "",
        *table(["first call", "n", "p50 ms", "p90 ms", "p50 ÷ pooled p50"], rows),
    ]
    if not result.series["broker_pooled_s"]:
        lines += ["", "Through the broker: not measured (a rootful daemon only)."]
    lines += [
        "",
        f"Idle sandbox memory (`docker stats`): {num(result.idle_mib, 1)} MiB; "
        + "; ".join(f"{name}: {num(mib, 1)} MiB" for name, mib in result.floors_mib.items())
        + f". Server image: {num(result.image_mb, 1)} MB.",
    ]
    return lines


def draw_cold(ctx: Context, result: ColdStart) -> Path:
    measured = [(key, label) for key, label, _ in PATHS if result.series[key]]
    return plots.bars(
        ctx.plot_path("first-call.png"),
        "A new tenant's first call, pooled and cold",
        [label.replace("`", "") for _, label in measured],
        {
            "p50": [result.p50_ms(key) or 0.0 for key, _ in measured],
            "p90": [result.p90_ms(key) or 0.0 for key, _ in measured],
        },
        "ms",
    )


def cold_section(ctx: Context) -> Part:
    data = run_bench(ctx, "cold_start", "cold_start.py", cold_args(ctx))
    result = parsed(data, ColdStart.from_json, "bench/cold_start.py's JSON")
    ctx.results["cold"] = result
    png = draw_cold(ctx, result)
    return Part([*render_cold(result), "", image(png, png.stem)], [png])


# -- the burst of new tenants (bench/burst.py: the adaptive warm pool's target, issue 25 item 4)
BURST_P50_S = 1.0
BURST_P99_OVER_FLOOR = 1.2


@dataclass(frozen=True)
class Burst:
    n: int
    answered: int
    p50_s: float
    p99_s: float
    floor_s: float
    ratio_p99_to_floor: float
    pool_before: int
    pool_peak: int
    pool_after_idle: int
    # Where the host's CPU went during the burst (burst.py --breakdown), seconds by part.
    cpu_s: dict[str, float] | None = None

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Burst:
        burst, pool = data["burst"], data["pool"]
        cpu = data.get("burst_cpu_s")
        return cls(
            n=int(burst["n"]),
            answered=int(burst["answered"]),
            p50_s=float(burst["p50_s"]),
            p99_s=float(burst["p99_s"]),
            floor_s=float(burst["floor_s"]),
            ratio_p99_to_floor=float(burst["ratio_p99_to_floor"]),
            pool_before=int(pool["size_before"]),
            pool_peak=int(pool["peak"]),
            pool_after_idle=int(pool["size_after_idle"]),
            cpu_s={str(k): float(v) for k, v in cpu.items()} if isinstance(cpu, dict) else None,
        )


def render_burst(result: Burst) -> list[str]:
    targets = [
        ["all answered", f"{result.answered}/{result.n}", f"{result.n}/{result.n}",
         verdict(result.answered == result.n)],
        ["p50", f"{num(result.p50_s)} s", f"≤ {BURST_P50_S:g} s", verdict(result.p50_s <= BURST_P50_S)],
        ["p99 ÷ CPU floor of starting them", num(result.ratio_p99_to_floor), f"≤ {BURST_P99_OVER_FLOOR:g}",
         verdict(result.ratio_p99_to_floor <= BURST_P99_OVER_FLOOR)],
    ]  # fmt: skip
    measured = [
        f"{result.answered}/{result.n}",
        num(result.p50_s),
        num(result.p99_s),
        num(result.floor_s),
        num(result.ratio_p99_to_floor),
    ]
    return [
        f"`bench/burst.py`: {result.n} new tenants' first calls at once through one broker on Docker "
        f"with the adaptive warm pool; the floor (the CPU time of starting {result.n} sandboxes here) "
        "measured in the same run.",
        "",
        *table(["answered", "p50 s", "p99 s", "floor s", "p99 ÷ floor"], [measured], numeric_from=0),
        "",
        *table(["target", "measured", "goal", "verdict"], targets),
        "",
        f"Warm pool: {result.pool_before} before the burst, {result.pool_peak} at its peak, "
        f"{result.pool_after_idle} after idling.",
        *render_burst_cpu(result),
    ]


# burst.py --breakdown's parts, in the order they are shown, and what each one is.
BURST_CPU_PARTS = {
    "broker_s": "the broker process",
    "docker_daemon_s": "dockerd, containerd, shims, runc",
    "tenant_sandboxes_s": "the tenants' sandboxes (claim to answer)",
    "spares_started_meanwhile_s": "spares started during the burst (refills)",
    "other_s": "everything else on the host (other work)",
}


def render_burst_cpu(result: Burst) -> list[str]:
    """Where the host's CPU went while the burst was answered: what the first calls themselves
    cost (the floor p50 cannot go below on this host), and what else ran."""
    cpu = result.cpu_s
    if not cpu or not cpu.get("wall_s"):
        return []
    rows = [[what, num(cpu.get(key, 0.0)), num(cpu.get(key, 0.0) / result.n * 1000)]
            for key, what in BURST_CPU_PARTS.items()]  # fmt: skip
    own = sum(cpu.get(k, 0.0) for k in ("broker_s", "docker_daemon_s", "tenant_sandboxes_s"))
    return [
        "",
        f"Where the CPU went during the burst ({num(cpu['wall_s'])} s; the host busy "
        f"{num(cpu.get('host_busy_s', 0.0))} CPU-s):",
        "",
        *table(["part", "CPU s", "per first call, ms"], rows),
        "",
        f"The first calls' own CPU (broker, Docker, sandboxes): {num(own)} CPU-s, "
        f"{num(own / result.n * 1000)} ms each.",
    ]


def draw_burst(ctx: Context, result: Burst) -> Path:
    return plots.bars(
        ctx.plot_path("burst.png"),
        f"{result.n} new tenants at once: first-call latency against the CPU floor",
        ["p50", "p99", "floor"],
        {"seconds": [result.p50_s, result.p99_s, result.floor_s]},
        "s",
        line=(result.floor_s * BURST_P99_OVER_FLOOR, f"{BURST_P99_OVER_FLOOR:g} x floor (p99 target)"),
    )


def burst_section(ctx: Context) -> Part:
    data = run_bench(ctx, "burst", "burst.py", ["--breakdown"])
    result = parsed(data, Burst.from_json, "bench/burst.py's JSON")
    ctx.results["burst"] = result
    png = draw_burst(ctx, result)
    return Part([*render_burst(result), "", image(png, png.stem)], [png])
