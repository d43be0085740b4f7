"""Many tenants on one broker host (Docker): warm calls, memory per idle tenant, and what limits it.

    python bench/scale.py [--tenants 1,10,100,300] [--concurrency 4] [--seconds 5] [--json PATH]

One broker (rootful daemon: it runs as this user) with DOCBROKER_MAX_SANDBOXES set to the
largest N (its default, 100, is the first limit: tenant 101 gets 503). For each N, ascending:

  activate  the tenants not yet active make their first call (8 at once), so N sandboxes run.
  idle      memory of each tenant's sandbox from its cgroup (usage less inactive file, as
            `docker stats` shows it), the median: memory per idle tenant. Beside it the
            containerd shim each container has, the broker's RSS and open descriptors.
  warm      `--concurrency` keep-alive clients call for `--seconds`, each call for the next
            tenant in turn, so all N are called (search / read alternating, bench/workload.py):
            throughput, p50 and p99 of the calls (target: p99 <= 20 ms).

Then the limits, each as a ceiling in tenants from what was measured: DOCBROKER_MAX_SANDBOXES,
the broker's open-file limit (descriptors per tenant), the host's pid space (processes and
threads per tenant: the sandbox's cgroup and its shim), and the memory available when the run
began. Before each N the run checks MemAvailable: it stops (and says so) rather than leave
less than `--reserve-gib` to the host. `--json PATH` writes {"points": [{"tenants",
"throughput", "p50_ms", "p99_ms", "memory_per_idle_tenant_mib", "broker_rss_mib"}], "limits":
{...}}. Every container is labelled with this run's instance and removed at the end, also on
failure.
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import json
import os
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
from bench.clients import RawConn, Target, check  # noqa: E402
from bench.cold_start import broker_call, docker_broker  # noqa: E402
from bench.targets import write_docs  # noqa: E402
from bench.workload import CALLS  # noqa: E402
from broker.settings import DockerSettings, RuntimeSettings  # noqa: E402

TARGET_P99_MS = 20.0
MIB = 1024 * 1024


# -- what the host shows -------------------------------------------------------------------------


def mem_available_mib() -> float:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) / 1024
    return float("nan")


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


def tenant_containers(client: Any, instance: str) -> set[str]:
    found = client.api.containers(filters={"label": [f"io.docbroker.instance={instance}"]})
    return {c["Id"] for c in found if not any(".pool-" in n for n in c["Names"])}


# -- the run -------------------------------------------------------------------------------------


def ceiling(budget: float, per_tenant: float) -> int | None:
    return int(budget / per_tenant) if per_tenant > 0 and budget == budget else None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tenants", default="1,10,100,300", help="comma-separated N, ascending")
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--reserve-gib", type=float, default=4.0, help="memory left to the host, at least")
    parser.add_argument("--host", default=os.environ.get("DOCKER_HOST", "unix:///var/run/docker.sock"))
    parser.add_argument("--image", default="docbroker-server:latest")
    parser.add_argument("--json", type=Path, help="write the results as JSON here")
    args = parser.parse_args()
    # SIGTERM ends the run through the clean-up below (the broker stopped, the containers removed).
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(2))
    counts = sorted({int(n) for n in args.tenants.split(",")})

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
    try:
        with docker_broker(args.host, args.image, names, DockerSettings().nano_cpus / 1e9, env=env) as broker:
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
                time.sleep(2.0)  # idle: what a sandbox holds between calls, not mid-call
                ids = tenant_containers(client, instance)
                memory = [container_memory_mib(i) for i in ids]
                shim_pids = shims(ids)
                shim_mib = sum(rss_mib(p) for p in shim_pids) / max(1, len(ids))
                pids = (
                    sum(container_pids(i) for i in ids)
                    + sum(int(_status(p).get("Threads", "0")) for p in shim_pids)
                ) / max(1, len(ids))
                fds, _ = open_files(pid)
                latencies = asyncio.run(warm_calls(broker, names[:n], args.concurrency, args.seconds))
                rss = rss_mib(pid)
                fds_after, _ = open_files(pid)
                point = {
                    "tenants": n,
                    "throughput": round(len(latencies) / args.seconds, 1),
                    "p50_ms": round(pct(latencies, 0.5) * 1000, 2),
                    "p99_ms": round(pct(latencies, 0.99) * 1000, 2),
                    "memory_per_idle_tenant_mib": round(med(memory), 1),
                    "broker_rss_mib": round(rss, 1),
                }
                points.append(point)
                per_tenant_host_mib = med(memory) + shim_mib + max(0.0, (rss - rss_before) / n)
                facts = {
                    "shim_mib": shim_mib,
                    "pids_per_tenant": pids,
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
                        fmt(point["memory_per_idle_tenant_mib"], 1),
                        fmt(shim_mib, 1),
                        fmt(pids, 1),
                        fmt(rss, 1),
                        str(max(fds, fds_after)),
                    )
                )
                print(
                    f"scale: {n} tenants done ({mem_available_mib() / 1024:.1f} GiB available)",
                    file=sys.stderr,
                )
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
        "calls/s",
        "p50 ms",
        "p99 ms",
        "idle MiB/sandbox",
        "shim MiB",
        "pids/tenant",
        "broker RSS MiB",
        "broker fds",
    )
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(header)]
    print("  ".join(h.rjust(w) for h, w in zip(header, widths, strict=True)))
    for row in rows:
        print("  ".join(c.rjust(w) for c, w in zip(row, widths, strict=True)))
    load = f"{args.concurrency} clients, {args.seconds:.0f} s per point"
    print(f"\nwarm calls: {load}, target p99 <= {TARGET_P99_MS} ms")
    for key, value in ceilings.items():
        print(f"ceiling, {key}: {value if value is not None else '-'} tenants")
    if stopped_by:
        print(f"stopped: {stopped_by}")
    if args.json:
        args.json.write_text(json.dumps({"points": points, "limits": limits}, indent=2) + "\n")
    return 0 if points and all(p["p99_ms"] <= TARGET_P99_MS for p in points) else 1


if __name__ == "__main__":
    sys.exit(main())
