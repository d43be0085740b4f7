"""Throughput and p99 against the number of tenants (scale.py), and memory per tenant: Docker
(scale.py, cold_start.py) and Kubernetes Pods (kubernetes.py, on the lab cluster when one is up)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench._stats import med
from bench.reportgen import plots
from bench.reportgen.md import image, num, ratio, table, verdict
from bench.reportgen.runner import Context, NotMeasured, Part, parsed, run_bench

TENANTS = "1,10,100,300"
QUICK_TENANTS = "1,10"
SWEEP = "25,50,100,150"  # calls/s offered at the largest N: how p99 grows with the load
QUICK_SWEEP = "25,50"
WARM_P99_MS = 20.0  # issue 25 item 3: warm calls p99 ≤ 20 ms with 300 active tenants (open loop)


@dataclass(frozen=True)
class Point:
    tenants: int
    throughput: float  # saturation (closed loop)
    p50_ms: float
    p99_ms: float
    memory_per_idle_tenant_mib: float | None
    broker_rss_mib: float | None
    open_p50_ms: float | None = None  # open loop, from each call's scheduled send time
    open_p99_ms: float | None = None
    broker_cpu_ms_per_call: float | None = None
    sandbox_cpu_ms_per_call: float | None = None
    idle_cpu_ms_per_s: float | None = None  # one idle sandbox's CPU, ms per second
    open_failed: int = 0  # open-loop calls refused, failed or unanswered: any fails the target


@dataclass(frozen=True)
class Swept:
    """One open loop at the largest N, at one offered rate."""

    rate: float  # calls/s offered
    calls: int
    failed: int
    p50_ms: float
    p99_ms: float
    major_faults_per_call: float | None = None  # the host's reads from disk, per call

    def meets(self) -> bool:
        return self.p99_ms <= WARM_P99_MS and not self.failed


@dataclass(frozen=True)
class Scale:
    points: list[Point]
    limits: dict[str, Any]
    open_rate: float | None = None  # calls/s offered in the open loop, the same for every N
    open_fraction: float | None = None  # of the first N's saturation throughput
    concurrency: int | None = None  # closed-loop clients
    sweep_tenants: int | None = None  # the N the rates were swept at (the largest)
    sweep: list[Swept] = field(default_factory=list)

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
                open_p50_ms=optional(p.get("open_p50_ms")),
                open_p99_ms=optional(p.get("open_p99_ms")),
                broker_cpu_ms_per_call=optional(p.get("broker_cpu_ms_per_call")),
                sandbox_cpu_ms_per_call=optional(p.get("sandbox_cpu_ms_per_call")),
                idle_cpu_ms_per_s=optional(p.get("idle_cpu_ms_per_s")),
                open_failed=int(p.get("open_failed") or 0),
            )
            for p in data["points"]
        ]
        if not points:
            raise ValueError("no points")
        limits = data.get("limits") or {}
        if not isinstance(limits, dict):
            raise TypeError("limits is not an object")
        concurrency = data.get("concurrency")
        swept = data.get("sweep") or {"tenants": None, "points": []}
        return cls(
            sorted(points, key=lambda p: p.tenants),
            limits,
            optional(data.get("open_rate")),
            optional(data.get("open_fraction")),
            None if concurrency is None else int(concurrency),
            None if swept["tenants"] is None else int(swept["tenants"]),
            sorted(
                (
                    Swept(
                        float(r["rate"]),
                        int(r["calls"]),
                        int(r["failed"]),
                        float(r["p50_ms"]),
                        float(r["p99_ms"]),
                        optional(r.get("major_faults_per_call")),
                    )
                    for r in swept["points"]
                ),
                key=lambda r: r.rate,
            ),
        )

    def idle_tenant_mib(self) -> tuple[int, float] | None:
        """Memory per idle tenant at the largest number of tenants that reported it."""
        known = [p for p in self.points if p.memory_per_idle_tenant_mib is not None]
        if not known:
            return None
        last = known[-1]
        assert last.memory_per_idle_tenant_mib is not None
        return last.tenants, last.memory_per_idle_tenant_mib


def _open_verdict(p: Point) -> str:
    if p.open_p99_ms is None:
        return "not measured"
    return verdict(p.open_p99_ms <= WARM_P99_MS and not p.open_failed)


def render_scale(result: Scale) -> list[str]:
    first = result.points[0]
    clients = f"{result.concurrency} " if result.concurrency is not None else ""
    if result.open_rate is None:
        offered = "not measured (scale.py's JSON has no open loop)."
    else:
        share = (
            f" ({num(result.open_fraction * 100, 0)} % of the saturation throughput at {first.tenants} "
            f"tenant{'s' if first.tenants != 1 else ''})"
            if result.open_fraction is not None
            else ""
        )
        offered = (
            f"calls offered at {num(result.open_rate, 0)} calls/s{share}, the same rate for every N, "
            "Poisson arrivals spread over all N tenants, each sent at its scheduled time, its latency "
            "from that time to the answer (no coordinated omission): the target's measure, "
            f"p99 ≤ {WARM_P99_MS:g} ms."
        )
    rows = [
        [
            str(p.tenants),
            num(p.throughput, 0),
            num(ratio(p.throughput, first.throughput)),
            num(p.p50_ms),
            num(p.p99_ms),
            num(p.open_p50_ms),
            num(p.open_p99_ms) + (f" ({p.open_failed} failed)" if p.open_failed else ""),
            _open_verdict(p),
            num(p.broker_cpu_ms_per_call),
            num(p.sandbox_cpu_ms_per_call),
            num(p.idle_cpu_ms_per_s),
            num(p.memory_per_idle_tenant_mib, 1),
            num(p.broker_rss_mib, 1),
        ]
        for p in result.points
    ]
    lines = [
        "`bench/scale.py`: warm calls from every tenant in turn through one broker on Docker, each "
        "number of tenants in the same run. *Saturation*: "
        f"{clients}closed-loop keep-alive clients, each sending its next call when the last is "
        "answered: the throughput the host reaches; its latencies are mostly queueing (client, "
        f"broker and every sandbox share the host's CPUs). *Open loop*: {offered} Beside them the "
        "CPU per open-loop call of the broker and of the sandboxes (their cgroups, idle ones "
        "included), and what one idle sandbox uses.",
        "",
        *table(
            [
                "tenants",
                "sat. calls/s",
                f"÷ {first.tenants} tenant{'s' if first.tenants != 1 else ''}",
                "sat. p50 ms",
                "sat. p99 ms",
                "open p50 ms",
                "open p99 ms",
                f"open p99 ≤ {WARM_P99_MS:g} ms",
                "broker CPU ms/call",
                "sandboxes CPU ms/call",
                "idle sandbox CPU ms/s",
                "MiB per idle tenant",
                "broker RSS MiB",
            ],
            rows,
            numeric_from=0,
        ),
    ]
    if result.sweep and result.sweep_tenants:
        n = result.sweep_tenants
        met = [r.rate for r in result.sweep if r.meets()]
        best = (
            f"the highest rate measured that meets it: **{num(max(met), 0)} calls/s** "
            f"({num(max(met) / n)} per tenant per second)"
            if met
            else "no rate measured meets it"
        )
        lines += [
            "",
            f"The open loop again at {n} tenants, all active, at each offered rate (`--sweep`): how "
            f"p99 grows with the load on this host; p99 ≤ {WARM_P99_MS:g} ms: {best}. Beside it the "
            "host's major page faults per call (pages read back from disk): a sandbox idle long "
            "enough loses pages to the kernel's reclaim, and its next call reads them back.",
            "",
            *table(
                [
                    "calls/s offered",
                    "per tenant /s",
                    "calls",
                    "failed",
                    "p50 ms",
                    "p99 ms",
                    "major faults/call",
                    "p99 ≤ target",
                ],
                [
                    [
                        num(r.rate, 0),
                        num(r.rate / n),
                        str(r.calls),
                        str(r.failed),
                        num(r.p50_ms),
                        num(r.p99_ms),
                        num(r.major_faults_per_call),
                        verdict(r.meets()),
                    ]
                    for r in result.sweep
                ],
                numeric_from=0,
            ),
        ]
    if result.limits:
        lines += ["", "What stops it (measured ceilings):", ""]
        lines += [f"- `{name}`: {value}" for name, value in result.limits.items()]
    return lines


def draw_scale(ctx: Context, result: Scale) -> list[Path]:
    xs = [float(p.tenants) for p in result.points]
    # The target's measure where it was taken (one series on the right axis: plots.lines draws
    # them all in one colour); the saturation p99 is in the table.
    if all(p.open_p99_ms is not None for p in result.points):
        latency: dict[str, Sequence[float]] = {
            "open-loop p99 ms": [p.open_p99_ms or 0.0 for p in result.points]
        }
    else:
        latency = {"saturation p99 ms": [p.p99_ms for p in result.points]}
    pngs = [
        plots.lines(
            ctx.plot_path("scale-throughput-p99.png"),
            "Warm calls against the number of active tenants",
            xs,
            {"saturation calls/s": [p.throughput for p in result.points]},
            "active tenants",
            "calls/s",
            logx=True,
            right=latency,
            right_label="p99 ms",
        )
    ]
    if result.sweep and result.sweep_tenants:
        pngs.append(
            plots.lines(
                ctx.plot_path("scale-p99-by-rate.png"),
                f"Open-loop latency against the offered rate, {result.sweep_tenants} active tenants",
                [r.rate for r in result.sweep],
                {"p50 ms": [r.p50_ms for r in result.sweep], "p99 ms": [r.p99_ms for r in result.sweep]},
                "calls/s offered",
                "ms",
                line=(WARM_P99_MS, f"target p99 ≤ {WARM_P99_MS:g} ms"),
            )
        )
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
    sweep = QUICK_SWEEP if ctx.quick else SWEEP
    data = run_bench(ctx, "scale", "scale.py", ["--tenants", tenants, "--sweep", sweep])
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
