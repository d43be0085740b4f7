"""Many tenants on one broker host (Docker): warm calls, memory per idle tenant, and what limits it.

    python bench/scale.py [--tenants 1,10,100,300] [--concurrency 4] [--seconds 5]
                          [--open-fraction 0.5 | --open-rate R] [--sweep 25,50,100,150]
                          [--json PATH]

One broker (rootful daemon: it runs as this user) with DOCBROKER_MAX_SANDBOXES set to the
largest N (its default, 100, is the first limit: tenant 101 gets 503) and a warm pool of one.
Each tenant may have 200 calls in flight (the default 8 is a limit, not what is measured
here; 200 stays under a sandbox's open-file limit, one connection per call in flight). For each N, ascending:

  activate    the tenants not yet active make their first call (8 at once), so N sandboxes
              run; then the run waits until the warm pool has refilled, so no sandbox start
              overlaps what follows.
  idle        memory of each tenant's sandbox from its cgroup (usage less inactive file, as
              `docker stats` shows it), the median: memory per idle tenant. Beside it the
              containerd shim each container has, the broker's RSS and open descriptors, and
              the CPU an idle sandbox uses (its cgroup's cpuacct over 3 s, median, ms per s).
  saturation  closed loop: `--concurrency` keep-alive clients call for `--seconds`, each call
              for the next tenant in turn, each client sending its next call when the last is
              answered: the throughput the host reaches (calls/s), and p50/p99 of those calls.
              At saturation on a small host (client, broker and N sandboxes share its CPUs)
              these latencies are mostly queueing: they are not the latency target's measure.
  open loop   calls at a fixed offered rate: `--open-fraction` (default 0.5) of the first N's
              saturation throughput measured in this run (the 1-tenant point when N=1 is run),
              or `--open-rate` calls/s if given (to compare runs on a noisy host), the same
              rate for every N, spread over all N tenants in turn. Arrivals are
              Poisson (seeded), each call sent at its scheduled time on an idle keep-alive
              connection (else a new one) whether or not earlier calls were answered, and its
              latency runs from the *scheduled* time to the answer, so queueing anywhere
              (client, broker, sandbox) counts and coordinated omission cannot hide it:
              p50/p99. Meanwhile the broker's CPU (its process) and the sandboxes' (their
              cgroups, idle ones included) per call answered. A call refused or failed, or
              unanswered 30 s after the last was due, is counted as failed: any fails the target.

  sweep       at the largest N only, the open loop once more at each `--sweep` rate (calls/s):
              how p99 grows with the offered load when all N tenants are active, and the
              highest rate measured that meets the target.

The target (issue 25): p99 <= 20 ms of the open-loop calls at the stated rate; the exit status
is 0 when every N meets it. The saturation numbers stay beside it.

Then the limits, each as a ceiling in tenants from what was measured: DOCBROKER_MAX_SANDBOXES,
the broker's open-file limit (descriptors per tenant), the host's pid space (processes and
threads per tenant: the sandbox's cgroup and its shim), and the memory available when the run
began. Before each N the run checks MemAvailable: it stops (and says so) rather than leave
less than `--reserve-gib` to the host. `--json PATH` writes {"open_rate": calls/s,
"open_fraction" (null with --open-rate), "concurrency", "seconds", "points": [{"tenants",
"throughput", "p50_ms", "p99_ms", "open_calls", "open_failed", "open_p50_ms", "open_p99_ms",
"broker_cpu_ms_per_call", "sandbox_cpu_ms_per_call", "idle_cpu_ms_per_s",
"memory_per_idle_tenant_mib", "broker_rss_mib"}], "limits": {...}, "sweep": {"tenants",
"points": [{"rate", "calls", "failed", "p50_ms", "p99_ms", "major_faults_per_call"}]} or
null}. Every container is
labelled with this run's instance and removed at the end, also on failure.
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import gc
import json
import os
import random
import signal
import sys
import time
import uuid
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench._stats import fmt, med, pct  # noqa: E402
from bench.burst import remove_instance  # noqa: E402
from bench.clients import CallFailed, RawConn, Target, check  # noqa: E402
from bench.cold_start import broker_call, docker_broker, wait_pool_warm  # noqa: E402
from bench.processes import cpu_seconds  # noqa: E402
from bench.targets import write_docs  # noqa: E402
from bench.workload import CALLS  # noqa: E402
from broker.settings import DockerSettings, RuntimeSettings  # noqa: E402

TARGET_P99_MS = 20.0  # of the open-loop calls
MIB = 1024 * 1024
IDLE_WINDOW_S = 3.0
# Every tenant's `[limits]`: generous, so that the benchmark measures the host, not a limit.
# max_concurrent stays under a sandbox's open-file limit (DOCBROKER_DOCKER_NOFILE, 256): the
# broker opens a connection to the sandbox per call in flight, and past that limit the sandbox
# cannot accept them (its calls would wait for the call timeout instead of being refused).
LIMITS = "[limits]\nrate_per_minute = 1000000\nburst = 100000\nmax_concurrent = 200\n"
GRACE_S = 30.0  # after the last call was due: what is unanswered then counts as failed


# -- what the host shows -------------------------------------------------------------------------


def mem_available_mib() -> float:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def major_faults() -> int:
    """The host's page faults that read from disk so far (/proc/vmstat pgmajfault): code and
    data a process touches again after the kernel dropped it (memory pressure, or a proactive
    reclaim such as DAMON's `pageout` of memory unused for a while)."""
    for line in Path("/proc/vmstat").read_text().splitlines():
        if line.startswith("pgmajfault "):
            return int(line.split()[1])
    return 0


def _cgroup_file(controller: str, container_id: str, name: str) -> Path | None:
    """A container's cgroup file: cgroup v1 (cgroupfs or systemd driver) or v2."""
    for path in (
        Path(f"/sys/fs/cgroup/{controller}/docker/{container_id}/{name}"),
        Path(f"/sys/fs/cgroup/{controller}/system.slice/docker-{container_id}.scope/{name}"),
        Path(f"/sys/fs/cgroup/system.slice/docker-{container_id}.scope/{name}"),
        Path(f"/sys/fs/cgroup/docker/{container_id}/{name}"),
    ):
        if path.exists():
            return path
    return None


def container_memory_mib(container_id: str) -> float:
    """Usage less inactive file (what `docker stats` shows), from the container's cgroup."""
    usage = _cgroup_file("memory", container_id, "memory.usage_in_bytes") or _cgroup_file(
        "memory", container_id, "memory.current"
    )
    stat = _cgroup_file("memory", container_id, "memory.stat")
    if usage is None or stat is None:
        return float("nan")
    fields = dict(line.split() for line in stat.read_text().splitlines())
    inactive = int(fields.get("total_inactive_file", fields.get("inactive_file", "0")))
    return (int(usage.read_text()) - inactive) / MIB


def container_cpu_seconds(container_id: str) -> float:
    """CPU the container's cgroup has used (cgroup v1 cpuacct, or v2 cpu.stat), in seconds."""
    v1 = _cgroup_file("cpuacct", container_id, "cpuacct.usage")
    if v1 is not None:
        return int(v1.read_text()) / 1e9
    v2 = _cgroup_file("cpu", container_id, "cpu.stat")
    if v2 is None:
        return float("nan")
    fields = dict(line.split() for line in v2.read_text().splitlines())
    return int(fields.get("usage_usec", "0")) / 1e6


def container_pids(container_id: str) -> int:
    path = _cgroup_file("pids", container_id, "pids.current")
    return int(path.read_text()) if path is not None else 0


def _status(pid: int) -> dict[str, str]:
    try:
        lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    except OSError:
        return {}
    return {k: v.strip() for k, _, v in (line.partition(":") for line in lines)}


def rss_mib(pid: int) -> float:
    return int(_status(pid).get("VmRSS", "0 kB").split()[0]) / 1024


def shims(container_ids: set[str]) -> list[int]:
    """The containerd shims of these containers (by the `-id` on their command line)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            argv = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if argv and b"containerd-shim" in argv[0] and b"-id" in argv:
            if argv[argv.index(b"-id") + 1].decode() in container_ids:
                found.append(int(entry))
    return found


def open_files(pid: int) -> tuple[int, int]:
    """(descriptors open, the soft open-file limit) of a process."""
    soft = 0
    for line in Path(f"/proc/{pid}/limits").read_text().splitlines():
        if line.startswith("Max open files"):
            soft = int(line.split()[3])
    return len(os.listdir(f"/proc/{pid}/fd")), soft


# -- the broker's side ---------------------------------------------------------------------------


def activate(broker: Any, names: list[str]) -> float:
    """First calls for these tenants, 8 at once; seconds for all."""
    started = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(8) as threads:
        list(threads.map(lambda name: broker_call(broker, name), names))
    return time.perf_counter() - started


async def warm_calls(broker: Any, names: list[str], concurrency: int, seconds: float) -> list[float]:
    """`concurrency` keep-alive clients, each call for the next tenant in turn; the latencies."""
    target = Target(key="broker", label="broker", url=broker.mcp_url)
    conns = [RawConn(target) for _ in range(concurrency)]
    tokens = {name: broker.token(name, subject="bench-user", scope="docs:read") for name in names}
    heads = {
        (name, k): conns[0].render("POST", {**h, "authorization": f"Bearer {tokens[name]}"})
        for name in names
        for k, h in enumerate(target.call_headers(None))
    }
    bodies = target.call_bodies()
    latencies: list[float] = []
    turn = [0]
    stop_at = time.perf_counter() + seconds

    async def worker(conn: RawConn) -> None:
        while time.perf_counter() < stop_at:
            i = turn[0]
            turn[0] += 1
            name, k = names[i % len(names)], (i // len(names)) % len(CALLS)
            t0 = time.perf_counter()
            status, _, data = await conn.send(heads[(name, k)], bodies[k] % (i + 1))
            latencies.append(time.perf_counter() - t0)
            check(target, status, data)

    try:
        await asyncio.gather(*(worker(c) for c in conns))
    finally:
        for conn in conns:
            await conn.close()
    return latencies


async def open_loop(
    broker: Any, names: list[str], rate: float, seconds: float, seed: int = 25
) -> tuple[list[float], int, int]:
    """Calls at Poisson arrivals of `rate` per second for `seconds`, each for the next tenant in
    turn, each sent at its scheduled time whether or not earlier ones have been answered (on an
    idle keep-alive connection, else a new one). A call's latency runs from its *scheduled*
    send time to its answer, so a late send (the client, the broker or a sandbox busy) counts
    against it: no coordinated omission. Returns the latencies of the calls answered ok, the
    calls scheduled, and those that failed (refused, an error, or unanswered `GRACE_S` after
    the last was due): a failed call has no latency, so any failure fails the target."""
    target = Target(key="broker", label="broker", url=broker.mcp_url)
    tokens = {name: broker.token(name, subject="bench-user", scope="docs:read") for name in names}
    render = RawConn(target).render
    heads = {
        (name, k): render("POST", {**h, "authorization": f"Bearer {tokens[name]}"})
        for name in names
        for k, h in enumerate(target.call_headers(None))
    }
    bodies = target.call_bodies()
    draw = random.Random(seed)
    schedule: list[float] = []
    at = draw.expovariate(rate)
    while at < seconds:
        schedule.append(at)
        at += draw.expovariate(rate)
    idle: list[RawConn] = []
    opened: list[RawConn] = []
    latencies: list[float] = []
    failed = [0]

    async def call(i: int, due: float) -> None:
        conn = idle.pop() if idle else None
        if conn is None:
            conn = RawConn(target)
            opened.append(conn)
        name, k = names[i % len(names)], (i // len(names)) % len(CALLS)
        try:
            status, _, data = await conn.send(heads[(name, k)], bodies[k] % (i + 1))
            check(target, status, data)
        except (OSError, asyncio.IncompleteReadError, CallFailed):
            failed[0] += 1
            await conn.close()
            return
        latencies.append(time.perf_counter() - due)
        idle.append(conn)

    # The client's own full collections (its heap holds the SDK, docker and the run) would
    # stall every call in flight, and count against the broker: they skip what is built now.
    gc.collect()
    gc.freeze()
    calls: set[asyncio.Task[None]] = set()
    start = time.perf_counter() + 0.05
    try:
        for i, offset in enumerate(schedule):
            due = start + offset
            wait = due - time.perf_counter()
            if wait > 0:
                await asyncio.sleep(wait)
            task = asyncio.create_task(call(i, due))
            calls.add(task)
            task.add_done_callback(calls.discard)
        if calls:
            await asyncio.wait(calls, timeout=GRACE_S)
        failed[0] += len(calls)
    finally:
        for task in calls:
            task.cancel()
        for conn in opened:
            await conn.close()
    return latencies, len(schedule), failed[0]


def tenant_containers(client: Any, instance: str) -> set[str]:
    found = client.api.containers(filters={"label": [f"io.docbroker.instance={instance}"]})
    return {c["Id"] for c in found if not any(".pool-" in n for n in c["Names"])}


# -- the run -------------------------------------------------------------------------------------


def meets(loop: dict[str, Any]) -> bool:
    return bool(loop["p99_ms"] <= TARGET_P99_MS and not loop["failed"])


def sweep(broker: Any, names: list[str], rates: list[float], seconds: float) -> list[dict[str, Any]]:
    """The open loop again at each offered rate, all N tenants active: how p99 grows with the
    load, and the highest rate measured that meets the target."""
    rows = []
    for rate in rates:
        faults = major_faults()
        answered, scheduled, failed = asyncio.run(open_loop(broker, names, rate, seconds))
        rows.append(
            {
                "rate": rate,
                "calls": scheduled,
                "failed": failed,
                "p50_ms": round(pct(answered, 0.5) * 1000, 2),
                "p99_ms": round(pct(answered, 0.99) * 1000, 2),
                # A call to a sandbox idle for long enough to have lost pages reads them back.
                "major_faults_per_call": round((major_faults() - faults) / max(1, scheduled), 2),
            }
        )
        print(f"scale: swept {rate:g} calls/s", file=sys.stderr)
    return rows


def ceiling(budget: float, per_tenant: float) -> int | None:
    return int(budget / per_tenant) if per_tenant > 0 and budget == budget else None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tenants", default="1,10,100,300", help="comma-separated N, ascending")
    parser.add_argument("--concurrency", type=int, default=4, help="closed-loop clients (saturation)")
    parser.add_argument("--seconds", type=float, default=5.0, help="of each loop, per N")
    parser.add_argument(
        "--open-fraction",
        type=float,
        default=0.5,
        help="open-loop rate, of the first N's saturation throughput",
    )
    parser.add_argument(
        "--open-rate", type=float, help="open-loop calls/s, fixed (runs to compare on a noisy host)"
    )
    parser.add_argument(
        "--sweep",
        default="25,50,100,150",
        help="open-loop calls/s offered at the largest N, one loop each ('' for none)",
    )
    parser.add_argument("--reserve-gib", type=float, default=4.0, help="memory left to the host, at least")
    parser.add_argument("--host", default=os.environ.get("DOCKER_HOST", "unix:///var/run/docker.sock"))
    parser.add_argument("--image", default="docbroker-server:latest")
    parser.add_argument("--json", type=Path, help="write the results as JSON here")
    args = parser.parse_args()
    # SIGTERM ends the run through the clean-up below (the broker stopped, the containers removed).
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(2))
    counts = sorted({int(n) for n in args.tenants.split(",")})
    sweep_rates = sorted({float(r) for r in args.sweep.split(",") if r.strip()})
    swept: list[dict[str, Any]] = []

    import docker

    client = docker.DockerClient(base_url=args.host)
    instance = f"scale{uuid.uuid4().hex[:6]}"
    names = [f"t{i}" for i in range(counts[-1])]
    available_at_start = mem_available_mib()
    env = {
        "DOCBROKER_INSTANCE": instance,
        "DOCBROKER_MAX_SANDBOXES": str(counts[-1]),
        "DOCBROKER_IDLE_TIMEOUT": "3600",
    }
    points: list[dict[str, Any]] = []
    rows: list[tuple[str, ...]] = []
    stopped_by: str | None = None
    per_tenant_host_mib = 60.0  # until measured: a sandbox and its shim, roughly
    facts: dict[str, float] = {}
    rate = args.open_rate or 0.0
    cpus = DockerSettings().nano_cpus / 1e9
    try:
        with docker_broker(args.host, args.image, names, cpus, env=env, limits=LIMITS) as broker:
            assert broker.proc is not None
            pid = broker.proc.pid
            for name in names:
                write_docs(broker.sources(name))
            rss_before = rss_mib(pid)
            fds_before, nofile = open_files(pid)
            active = 0
            for n in counts:
                needed = (n - active) * per_tenant_host_mib
                if mem_available_mib() - needed < args.reserve_gib * 1024:
                    stopped_by = f"host memory: {n} tenants would leave less than {args.reserve_gib} GiB"
                    break
                activation = activate(broker, names[active:n])
                active = n
                wait_pool_warm(broker, timeout=300)  # no sandbox start overlaps the measurements
                time.sleep(1.0)  # idle: what a sandbox holds between calls, not mid-call
                ids = tenant_containers(client, instance)
                memory = [container_memory_mib(i) for i in ids]
                shim_pids = shims(ids)
                shim_mib = sum(rss_mib(p) for p in shim_pids) / max(1, len(ids))
                pids = (
                    sum(container_pids(i) for i in ids)
                    + sum(int(_status(p).get("Threads", "0")) for p in shim_pids)
                ) / max(1, len(ids))
                fds, _ = open_files(pid)
                idle_before = {i: container_cpu_seconds(i) for i in ids}
                time.sleep(IDLE_WINDOW_S)
                idle_cpu = [(container_cpu_seconds(i) - idle_before[i]) / IDLE_WINDOW_S * 1000 for i in ids]
                latencies = asyncio.run(warm_calls(broker, names[:n], args.concurrency, args.seconds))
                throughput = len(latencies) / args.seconds
                if not rate:
                    rate = args.open_fraction * throughput  # the same offered rate for every N
                sandboxes_before = sum(container_cpu_seconds(i) for i in ids)
                broker_before = cpu_seconds([pid])
                answered, scheduled, failed = asyncio.run(open_loop(broker, names[:n], rate, args.seconds))
                broker_cpu = (cpu_seconds([pid]) - broker_before) / max(1, len(answered)) * 1000
                sandbox_cpu = (
                    (sum(container_cpu_seconds(i) for i in ids) - sandboxes_before)
                    / max(1, len(answered))
                    * 1000
                )
                rss = rss_mib(pid)
                fds_after, _ = open_files(pid)
                point = {
                    "tenants": n,
                    "throughput": round(throughput, 1),
                    "p50_ms": round(pct(latencies, 0.5) * 1000, 2),
                    "p99_ms": round(pct(latencies, 0.99) * 1000, 2),
                    "open_calls": scheduled,
                    "open_failed": failed,
                    "open_p50_ms": round(pct(answered, 0.5) * 1000, 2),
                    "open_p99_ms": round(pct(answered, 0.99) * 1000, 2),
                    "broker_cpu_ms_per_call": round(broker_cpu, 2),
                    "sandbox_cpu_ms_per_call": round(sandbox_cpu, 2),
                    "idle_cpu_ms_per_s": round(med(idle_cpu), 2),
                    "memory_per_idle_tenant_mib": round(med(memory), 1),
                    "broker_rss_mib": round(rss, 1),
                }
                points.append(point)
                per_tenant_host_mib = med(memory) + shim_mib + max(0.0, (rss - rss_before) / n)
                facts = {
                    "shim_mib": shim_mib,
                    "pids_per_tenant": pids,
                    # The larger of idle and just after the loops (the clients' connections and a
                    # sandbox connection per call in flight, closing): what a busy host needs.
                    "fds": max(fds, fds_after),
                    "fds_per_tenant": (max(fds, fds_after) - fds_before) / n,
                    "rss_per_tenant": (rss - rss_before) / n,
                    "per_tenant_host_mib": per_tenant_host_mib,
                }
                rows.append(
                    (
                        str(n),
                        f"{len(ids)}",
                        fmt(activation, 1),
                        fmt(point["throughput"], 0),
                        fmt(point["p50_ms"]),
                        fmt(point["p99_ms"]),
                        fmt(point["open_p50_ms"]),
                        fmt(point["open_p99_ms"]) + (f" ({failed} failed)" if failed else ""),
                        fmt(point["broker_cpu_ms_per_call"]),
                        fmt(point["sandbox_cpu_ms_per_call"]),
                        fmt(point["idle_cpu_ms_per_s"]),
                        fmt(point["memory_per_idle_tenant_mib"], 1),
                        fmt(shim_mib, 1),
                        fmt(pids, 1),
                        fmt(rss, 1),
                        f"{fds}/{max(fds, fds_after)}",
                    )
                )
                print(
                    f"scale: {n} tenants done ({mem_available_mib() / 1024:.1f} GiB available)",
                    file=sys.stderr,
                )
            if points and sweep_rates:
                swept = sweep(broker, names[: points[-1]["tenants"]], sweep_rates, args.seconds)
    finally:
        remove_instance(client, instance)  # what a crash of the broker left
        client.close()

    pid_max = int(Path("/proc/sys/kernel/pid_max").read_text())
    ceilings = {
        "DOCBROKER_MAX_SANDBOXES (default)": RuntimeSettings().max_sandboxes,
        "broker open files": ceiling(nofile - fds_before, facts.get("fds_per_tenant", 0.0)),
        "host pid space": ceiling(pid_max, facts.get("pids_per_tenant", 0.0)),
        "host memory": ceiling(available_at_start, facts.get("per_tenant_host_mib", 0.0)),
    }
    known = {k: v for k, v in ceilings.items() if v is not None}
    limits = {
        "reached_tenants": points[-1]["tenants"] if points else 0,
        "stopped_by": stopped_by,
        "max_sandboxes_default": RuntimeSettings().max_sandboxes,
        "broker_nofile_soft": nofile,
        "broker_fds_per_tenant": round(facts.get("fds_per_tenant", 0.0), 2),
        "fd_ceiling_tenants": ceilings["broker open files"],
        "sandbox_pids_limit": DockerSettings().pids_limit,
        "pids_per_tenant": round(facts.get("pids_per_tenant", 0.0), 1),
        "host_pid_max": pid_max,
        "pid_ceiling_tenants": ceilings["host pid space"],
        "shim_rss_per_tenant_mib": round(facts.get("shim_mib", 0.0), 1),
        "broker_rss_per_tenant_mib": round(facts.get("rss_per_tenant", 0.0), 2),
        "memory_available_mib_at_start": round(available_at_start),
        "memory_ceiling_tenants": ceilings["host memory"],
        "first_limit": min(known, key=lambda k: known[k] or 0) if known else None,
    }
    header = (
        "tenants",
        "sandboxes",
        "activate s",
        "sat. calls/s",
        "sat. p50 ms",
        "sat. p99 ms",
        "open p50 ms",
        "open p99 ms",
        "broker CPU ms/call",
        "sandbox CPU ms/call",
        "idle CPU ms/s/sandbox",
        "idle MiB/sandbox",
        "shim MiB",
        "pids/tenant",
        "broker RSS MiB",
        "broker fds idle/after",
    )
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(header)]
    print("  ".join(h.rjust(w) for h, w in zip(header, widths, strict=True)))
    for row in rows:
        print("  ".join(c.rjust(w) for c, w in zip(row, widths, strict=True)))
    offered = (
        "fixed by --open-rate"
        if args.open_rate
        else f"{args.open_fraction:g} of the {counts[0]}-tenant saturation throughput"
    )
    print(
        f"\nsaturation: {args.concurrency} closed-loop clients, {args.seconds:g} s per N; open loop: "
        f"{rate:.0f} calls/s offered (Poisson, {offered}), spread over the N tenants, latency from each "
        "call's scheduled time; "
        f"target: open-loop p99 <= {TARGET_P99_MS} ms"
    )
    if swept:
        print(f"\nopen loop at {points[-1]['tenants']} tenants, by offered rate:")
        print("calls/s  per tenant/s  calls  failed  p50 ms  p99 ms  major faults/call  p99 <= target")
        for loop in swept:
            print(
                f"{loop['rate']:7.0f}  {loop['rate'] / points[-1]['tenants']:12.2f}  {loop['calls']:5d}  "
                f"{loop['failed']:6d}  {loop['p50_ms']:6.2f}  {loop['p99_ms']:6.2f}  "
                f"{loop['major_faults_per_call']:17.2f}  {'yes' if meets(loop) else 'no'}"
            )
    for key, value in ceilings.items():
        print(f"ceiling, {key}: {value if value is not None else '-'} tenants")
    if stopped_by:
        print(f"stopped: {stopped_by}")
    if args.json:
        result = {
            "open_rate": round(rate, 1),
            "open_fraction": None if args.open_rate else args.open_fraction,
            "concurrency": args.concurrency,
            "seconds": args.seconds,
            "points": points,
            "limits": limits,
            "sweep": {"tenants": points[-1]["tenants"], "points": swept} if swept else None,
        }
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    met = all(meets({"p99_ms": p["open_p99_ms"], "failed": p["open_failed"]}) for p in points)
    return 0 if points and met else 1


if __name__ == "__main__":
    sys.exit(main())
