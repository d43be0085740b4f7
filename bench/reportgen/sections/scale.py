"""Throughput and p99 against the number of tenants (scale.py), and memory per tenant: Docker
(scale.py, cold_start.py) and Kubernetes Pods (kubernetes.py, on the lab cluster when one is up)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench._stats import med
from bench.reportgen import plots
from bench.reportgen.md import image, num, ratio, table, verdict
from bench.reportgen.runner import Context, NotMeasured, Part, parsed, run_bench

TENANTS = "1,10,100,300"
QUICK_TENANTS = "1,10"
WARM_P99_MS = 20.0  # issue 25 item 3: warm calls p99 ≤ 20 ms with 300 active tenants


@dataclass(frozen=True)
class Point:
    tenants: int
    throughput: float
    p50_ms: float
    p99_ms: float
    memory_per_idle_tenant_mib: float | None
    broker_rss_mib: float | None


@dataclass(frozen=True)
class Scale:
    points: list[Point]
    limits: dict[str, Any]

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Scale:
        def optional(value: Any) -> float | None:
            return None if value is None else float(value)

        points = [
            Point(
                tenants=int(p["tenants"]),
                throughput=float(p["throughput"]),
                p50_ms=float(p["p50_ms"]),
                p99_ms=float(p["p99_ms"]),
                memory_per_idle_tenant_mib=optional(p.get("memory_per_idle_tenant_mib")),
                broker_rss_mib=optional(p.get("broker_rss_mib")),
            )
            for p in data["points"]
        ]
        if not points:
            raise ValueError("no points")
        limits = data.get("limits") or {}
        if not isinstance(limits, dict):
            raise TypeError("limits is not an object")
        return cls(sorted(points, key=lambda p: p.tenants), limits)

    def idle_tenant_mib(self) -> tuple[int, float] | None:
        """Memory per idle tenant at the largest number of tenants that reported it."""
        known = [p for p in self.points if p.memory_per_idle_tenant_mib is not None]
        if not known:
            return None
        last = known[-1]
        assert last.memory_per_idle_tenant_mib is not None
        return last.tenants, last.memory_per_idle_tenant_mib


def render_scale(result: Scale) -> list[str]:
    first = result.points[0]
    rows = [
        [
            str(p.tenants),
            num(p.throughput, 0),
            num(ratio(p.throughput, first.throughput)),
            num(p.p50_ms),
            num(p.p99_ms),
            verdict(p.p99_ms <= WARM_P99_MS),
            num(p.memory_per_idle_tenant_mib, 1),
            num(p.broker_rss_mib, 1),
        ]
        for p in result.points
    ]
    lines = [
        "`bench/scale.py`: warm calls from every tenant at once through one broker on Docker, each "
        "number of tenants in the same run.",
        "",
        *table(
            [
                "tenants",
                "calls/s",
                f"÷ {first.tenants} tenant{'s' if first.tenants != 1 else ''}",
                "p50 ms",
                "p99 ms",
                f"p99 ≤ {WARM_P99_MS:g} ms",
                "MiB per idle tenant",
                "broker RSS MiB",
            ],
            rows,
            numeric_from=0,
        ),
    ]
    if result.limits:
        lines += ["", "What stops it (measured ceilings):", ""]
        lines += [f"- `{name}`: {value}" for name, value in result.limits.items()]
    return lines


def draw_scale(ctx: Context, result: Scale) -> list[Path]:
    xs = [float(p.tenants) for p in result.points]
    pngs = [
        plots.lines(
            ctx.plot_path("scale-throughput-p99.png"),
            "Warm calls against the number of active tenants",
            xs,
            {"calls/s": [p.throughput for p in result.points]},
            "active tenants",
            "calls/s",
            logx=True,
            right={"p99 ms": [p.p99_ms for p in result.points]},
            right_label="p99 ms",
        )
    ]
    with_memory = [p for p in result.points if p.memory_per_idle_tenant_mib is not None]
    if with_memory:
        pngs.append(
            plots.lines(
                ctx.plot_path("scale-memory.png"),
                "Memory against the number of tenants (Docker)",
                [float(p.tenants) for p in with_memory],
                {"MiB per idle tenant": [p.memory_per_idle_tenant_mib or 0.0 for p in with_memory]},
                "tenants",
                "MiB per idle tenant",
                logx=True,
                right={"broker RSS MiB": [p.broker_rss_mib or 0.0 for p in with_memory]},
                right_label="broker RSS MiB",
            )
        )
    return pngs


def scale_section(ctx: Context) -> Part:
    tenants = QUICK_TENANTS if ctx.quick else TENANTS
    data = run_bench(ctx, "scale", "scale.py", ["--tenants", tenants])
    result = parsed(data, Scale.from_json, "bench/scale.py's JSON")
    ctx.results["scale"] = result
    pngs = draw_scale(ctx, result)
    return Part([*render_scale(result), "", *(image(p, p.stem) for p in pngs)], pngs)


# -- memory per tenant: Docker and Pod
@dataclass(frozen=True)
class PodMemory:
    pod_mib: list[float]
    docker_mib: float | None  # a Docker sandbox measured by the same run, for the side-by-side ratio

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> PodMemory:
        pods = [float(v) for v in data["pod_memory_mib"]]
        if not pods:
            raise ValueError("no Pod was measured")
        docker = data.get("docker_memory_mib")
        return cls(pods, None if docker is None else float(docker))


def kubernetes_args(ctx: Context) -> list[str]:
    return ["--tenants", "2", "--burst", "3", "--idle", "5"] if ctx.quick else []


def pod_memory(ctx: Context) -> PodMemory:
    if not ctx.env.get("DOCBROKER_TEST_KUBECONFIG"):
        raise NotMeasured(
            "no lab cluster (start one with `bash .ci/kube-lab.sh start DIR`, `source DIR/env`, and rerun)"
        )
    data = run_bench(ctx, "kubernetes", "kubernetes.py", kubernetes_args(ctx))
    return parsed(data, PodMemory.from_json, "bench/kubernetes.py's JSON")


def memory_section(ctx: Context) -> Part:
    rows: list[list[str]] = []
    bars: dict[str, float] = {}
    scale = ctx.results.get("scale")
    per_tenant = scale.idle_tenant_mib() if isinstance(scale, Scale) else None
    if per_tenant is not None:
        tenants, mib = per_tenant
        rows.append([f"Docker: per idle tenant, {tenants} tenants (`scale.py`)", num(mib, 1)])
        bars[f"Docker, per idle tenant ({tenants})"] = mib
    else:
        why = "the scale section did not run" if scale is None else "scale.py reported no memory"
        rows.append(["Docker: per idle tenant (`scale.py`)", f"not measured: {why}"])
    cold = ctx.results.get("cold")
    if cold is not None:
        rows.append(["Docker: one idle sandbox (`cold_start.py`)", num(cold.idle_mib, 1)])
        bars["Docker, one idle sandbox"] = cold.idle_mib
    else:
        why = "not measured: the first-call section did not run"
        rows.append(["Docker: one idle sandbox (`cold_start.py`)", why])
    lines = ["Memory of an idle tenant's sandbox, MiB.", ""]
    try:
        pods = pod_memory(ctx)
    except NotMeasured as exc:
        why = f"not measured this run: {exc.reason}"
        rows.append(["Kubernetes: per idle tenant Pod (`kubernetes.py`)", why])
    else:
        pod = med(pods.pod_mib)
        rows.append([f"Kubernetes: per idle tenant Pod, median of {len(pods.pod_mib)}", num(pod, 1)])
        bars["Pod (lab)"] = pod
        if pods.docker_mib is not None:
            rows.append(["Docker sandbox measured beside the Pods", num(pods.docker_mib, 1)])
            rows.append(["Pod ÷ Docker sandbox (same run)", num(ratio(pod, pods.docker_mib))])
            bars["Docker, beside the Pods"] = pods.docker_mib
    lines += table(["what", "MiB"], rows)
    pngs: list[Path] = []
    if bars:
        pngs.append(
            plots.bars(
                ctx.plot_path("memory-per-tenant.png"),
                "Memory per idle tenant",
                list(bars),
                {"MiB": list(bars.values())},
                "MiB",
            )
        )
        lines += ["", *(image(p, p.stem) for p in pngs)]
    return Part(lines, pngs)
