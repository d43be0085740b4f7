"""Where a new tenant's first call on a warm (pooled) sandbox spends its time and CPU.

    python bench/first_call.py [--runs 5] [--host unix:///var/run/docker.sock] [--json PATH]

A burst of N new tenants on a host with C cores costs about N x (the CPU of one pooled first
call) / C, however warm the pool is: this script says what that CPU is made of. It needs a
rootful daemon (the broker runs as this user, and the sandboxes' cgroups are read from
/sys/fs/cgroup). Each run is one new tenant, the pool refilled (untimed) before it.

  (a) the backend alone (DockerBackend, a pool of one), phase by phase: claim (take a spare,
      send it the tenant's binding, rename it: `create()`), ready (the bound server builds its
      tools and its socket accepts), first tools/call, second tools/call (same tenant) -
      each with its wall time and the sandbox's own CPU (its cgroup's cpuacct.usage).
  (b) through a real broker: the first call's wall time; the CPU the broker process, the
      Docker daemon and the claimed sandbox spent on it; then the same tenant's second call.
  Docker API calls: the daemon is reached through a counting proxy socket; the calls made
      during the claim (a), and during the whole first call (b), are counted, spares' own
      (their create/start/inspect, by name) apart from the tenant's.

`--json PATH` writes every sample: {"backend": [{phase: {"wall_s", "cpu_s"}}...], "broker": [...]}.
Every container is labelled with this run's instance and removed at the end, also on failure.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import re
import signal
import socket
import statistics
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import httpx2  # noqa: E402

from bench.cold_start import (  # noqa: E402
    _CALL_BODY,
    _CALL_HEADERS,
    Tenants,
    _pool_ready,
    broker_call,
    docker_broker,
    wait_pool_warm,
)
from broker.runtime.docker import DockerBackend  # noqa: E402
from broker.runtime.readiness import wait_ready  # noqa: E402
from broker.settings import DockerSettings  # noqa: E402

CGROUP_CPU = Path("/sys/fs/cgroup/cpuacct/docker")  # cgroup v1, cgroupfs driver (this host)
_REQUEST = re.compile(rb"(?:^|\r\n)(GET|POST|PUT|DELETE|HEAD) (\S+) HTTP/1\.[01]\r\n")


class CountingProxy:
    """A unix socket in front of the Docker daemon's that records every request (method, path)."""

    def __init__(self, upstream: str) -> None:
        self.upstream = upstream
        self.dir = tempfile.mkdtemp(prefix="docbroker-apicount-")
        self.path = os.path.join(self.dir, "docker.sock")
        self.requests: list[tuple[float, str, str]] = []
        self._lock = threading.Lock()
        self._listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._listener.bind(self.path)
        self._listener.listen(256)
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            daemon = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            daemon.connect(self.upstream)
            threading.Thread(target=self._pump, args=(client, daemon, True), daemon=True).start()
            threading.Thread(target=self._pump, args=(daemon, client, False), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket, count: bool) -> None:
        tail = b""
        with contextlib.suppress(OSError):
            while data := source.recv(65536):
                if count:
                    seen = tail + data
                    for match in _REQUEST.finditer(seen):
                        if match.start() >= len(tail) - 2 or not tail:
                            with self._lock:
                                self.requests.append((time.monotonic(), match[1].decode(), match[2].decode()))
                    tail = seen[-256:]
                sink.sendall(data)
        with contextlib.suppress(OSError):
            sink.shutdown(socket.SHUT_WR)

    def between(self, start: float, end: float) -> list[tuple[str, str]]:
        with self._lock:
            return [(m, p) for t, m, p in self.requests if start <= t <= end]

    def close(self) -> None:
        self._listener.close()
        with contextlib.suppress(OSError):
            os.unlink(self.path)
            os.rmdir(self.dir)


def split_calls(calls: list[tuple[str, str]]) -> tuple[list[str], list[str]]:
    """(the tenant's calls, the spares' refill calls): a spare is created, and inspected by its
    `.pool-` name; its start is by id, right after its create; an image inspect is counted for the
    tenant's claim first, then the refills' (each refill resolves the image once)."""
    tenant: list[str] = []
    spares: list[str] = []
    refills = sum(1 for m, p in calls if m == "POST" and "/containers/create" in p)
    tenant_images = max(0, sum(1 for _, p in calls if "/images/" in p) - refills)
    for method, path in calls:
        short = re.sub(r"/v1\.\d+", "", path.split("?")[0])
        short = re.sub(r"/containers/[^/]+/", "/containers/{id}/", short)
        short = re.sub(r"/images/[^/]+/", "/images/{name}/", short)
        label = f"{method} {short}"
        if "/containers/create" in path or ".pool-" in path or path.endswith("/start"):
            spares.append(label)
        elif "/images/" in path and tenant_images == 0:
            spares.append(label)
        else:
            tenant_images -= "/images/" in path
            tenant.append(label)
    return tenant, spares


def cgroup_cpu_s(container_id: str) -> float:
    try:
        return int((CGROUP_CPU / container_id / "cpuacct.usage").read_text()) / 1e9
    except FileNotFoundError:
        return float("nan")


def proc_cpu_s(pid: int) -> float:
    """CPU seconds a process has run, to the nanosecond: its threads' schedstat summed (the
    clock ticks of /proc/<pid>/stat are 10 ms, the size of what is measured here)."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(OSError, ValueError, IndexError):
            total += int((task / "schedstat").read_text().split()[0])
    return total / 1e9


def rootful_dockerd() -> int | None:
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            if (entry / "comm").read_text().strip() == "dockerd" and (entry / "status").read_text().count(
                "Uid:\t0\t"
            ):
                return int(entry.name)
    return None


def host_busy_s() -> float:
    """CPU seconds the whole host has been busy (all cores, /proc/stat: not idle, not iowait)."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    busy = fields[0] + fields[1] + fields[2] + fields[5] + fields[6] + (fields[7] if len(fields) > 7 else 0)
    return busy / os.sysconf("SC_CLK_TCK")


def daemon_cpu_s() -> float:
    """The rootful Docker daemon, its containerd, the shims and runc (processes run as root),
    summed: what creating, starting and inspecting containers costs outside the containers."""
    total = 0.0
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError, IndexError, ValueError):
            comm = (entry / "comm").read_text().strip()
            if comm in ("dockerd", "containerd", "runc") or comm.startswith("containerd-shim"):
                if "Uid:\t0\t" in (entry / "status").read_text():
                    total += proc_cpu_s(int(entry.name))
    return total


class CpuWindow:
    """Where the host's CPU went between `start()` and `stop()`: the broker process, the Docker
    daemon side, the tenants' sandboxes of `instance` (by name), its spares started meanwhile,
    and everything else (other work on a shared host)."""

    def __init__(self, client: Any, instance: str, broker_pid: int) -> None:
        self._client = client
        self._filters = {"label": f"io.docbroker.instance={instance}"}
        self._pid = broker_pid

    def _containers(self) -> dict[str, tuple[str, float]]:
        return {
            c.id: (c.name or "", cgroup_cpu_s(c.id))
            for c in self._client.containers.list(all=True, filters=self._filters, ignore_removed=True)
        }

    def start(self) -> None:
        self._before = self._containers()
        self._t = (time.monotonic(), host_busy_s(), proc_cpu_s(self._pid), daemon_cpu_s())

    def stop(self) -> dict[str, float]:
        t, host, broker, daemon = time.monotonic(), host_busy_s(), proc_cpu_s(self._pid), daemon_cpu_s()
        after = self._containers()
        tenants = spares_new = spares_old = 0.0
        for cid, (name, cpu) in after.items():
            was = self._before.get(cid, ("", 0.0))[1]
            used = cpu - was if cpu == cpu and was == was else 0.0  # NaN: gone meanwhile
            if ".pool-" in name:
                if cid in self._before:
                    spares_old += used
                else:
                    spares_new += used
            else:
                tenants += used
        out = {
            "wall_s": t - self._t[0],
            "host_busy_s": host - self._t[1],
            "broker_s": broker - self._t[2],
            "docker_daemon_s": daemon - self._t[3],
            "tenant_sandboxes_s": tenants,
            "spares_started_meanwhile_s": spares_new,
            "spares_already_warm_s": spares_old,
        }
        accounted = sum(v for k, v in out.items() if k not in ("wall_s", "host_busy_s"))
        out["other_s"] = out["host_busy_s"] - accounted
        return out


def call_socket(path: str) -> None:
    """One tools/call over the sandbox's socket, as the broker sends it (no session)."""
    with httpx2.Client(transport=httpx2.HTTPTransport(uds=path), timeout=60) as http:
        reply = http.post("http://localhost/mcp", json=_CALL_BODY, headers=_CALL_HEADERS)
    status = reply.json().get("result", {}).get("structuredContent", {}).get("status")
    if reply.status_code != 200 or status != "ok":
        raise RuntimeError(f"sandbox call failed: HTTP {reply.status_code}")


class Phases:
    """Wall time and the sandbox's own CPU (its cgroup), phase after phase."""

    def __init__(self, container_id: str) -> None:
        self._id = container_id
        self.sample: dict[str, Any] = {}
        self._cpu, self._clock = cgroup_cpu_s(container_id), time.monotonic()

    def end(self, name: str) -> None:
        cpu, now = cgroup_cpu_s(self._id), time.monotonic()
        self.sample[name] = {"wall_s": now - self._clock, "cpu_s": cpu - self._cpu}
        self._cpu, self._clock = cpu, now


async def backend_phases(
    settings: DockerSettings, proxy: CountingProxy, instance: str, tenants: Tenants, runs: int
) -> list[dict[str, Any]]:
    pool_dir = tenants.root / "run" / ".pool"
    pool_dir.mkdir(parents=True, mode=0o700)
    backend = await DockerBackend.connect(settings, instance=instance, pool_dir=pool_dir)
    await backend.start()
    samples = []
    try:
        for i in range(runs + 1):  # +1: a warm-up run, not counted
            await _pool_ready(backend)
            await asyncio.sleep(0.5)  # the spare's own start settled
            spare = backend._pool._ready[0].sandbox_id
            spec = tenants.make(f"phases-{i}")
            phases = Phases(spare)
            claim_start = time.monotonic()
            info = await backend.create(spec)
            claim_end = time.monotonic()
            phases.end("claim")
            assert info.endpoint is not None and info.endpoint.uds is not None
            if not await wait_ready(info.endpoint, 30.0):
                raise RuntimeError("the bound sandbox never became ready")
            phases.end("ready")
            await asyncio.to_thread(call_socket, info.endpoint.uds)
            phases.end("first_call")
            await asyncio.to_thread(call_socket, info.endpoint.uds)
            phases.end("second_call")
            phases.sample["claim_api"], _ = split_calls(proxy.between(claim_start, claim_end))
            samples.append(phases.sample)
            await backend.delete(info)
    finally:
        await backend.close()
    return samples[1:]


def broker_runs(host: str, proxy: CountingProxy, image: str, runs: int, cpus: float) -> list[dict[str, Any]]:
    import docker

    client = docker.DockerClient(base_url=host)
    dockerd = rootful_dockerd()
    names = [f"first{i}" for i in range(runs + 1)]
    samples = []
    try:
        with docker_broker(f"unix://{proxy.path}", image, names, cpus, pool=1) as broker:
            instance = broker.env["DOCBROKER_INSTANCE"] if "DOCBROKER_INSTANCE" in broker.env else "default"
            for name in names:
                wait_pool_warm(broker)
                time.sleep(0.5)  # the spare's own start settled
                spares = {
                    c.id: cgroup_cpu_s(c.id)
                    for c in client.containers.list(filters={"label": ["io.docbroker.pool=true"]})
                    if ".pool-" in (c.name or "")
                }
                assert broker.proc is not None
                broker_cpu = proc_cpu_s(broker.proc.pid)
                daemon_cpu = proc_cpu_s(dockerd) if dockerd else float("nan")
                start = time.monotonic()
                wall = broker_call(broker, name)
                end = time.monotonic()
                broker_used = proc_cpu_s(broker.proc.pid) - broker_cpu
                daemon_used = (proc_cpu_s(dockerd) if dockerd else float("nan")) - daemon_cpu
                prefix = "docbroker" if instance == "default" else f"docbroker-{instance}"
                claimed = client.containers.get(f"{prefix}-{name}").id
                sandbox_used = cgroup_cpu_s(claimed) - spares.get(claimed, float("nan"))
                before_second = cgroup_cpu_s(claimed)
                broker_cpu = proc_cpu_s(broker.proc.pid)
                second = broker_call(broker, name)
                second_broker = proc_cpu_s(broker.proc.pid) - broker_cpu
                tenant_calls, spare_calls = split_calls(proxy.between(start, end))
                samples.append(
                    {
                        "first_call_s": wall,
                        "broker_cpu_s": broker_used,
                        "dockerd_cpu_s": daemon_used,
                        "sandbox_cpu_s": sandbox_used,
                        "second_call_s": second,
                        "second_sandbox_cpu_s": cgroup_cpu_s(claimed) - before_second,
                        "second_broker_cpu_s": second_broker,
                        "api_tenant": tenant_calls,
                        "api_spares": spare_calls,
                    }
                )
    finally:
        client.close()
    return samples[1:]


def _ms(values: list[float]) -> str:
    return f"{statistics.median(values) * 1000:.0f} ms (max {max(values) * 1000:.0f})"


def _calls(lists: list[list[str]]) -> str:
    counts = sorted(len(x) for x in lists)
    kinds: dict[str, int] = {}
    for label in lists[len(lists) // 2]:
        kinds[label] = kinds.get(label, 0) + 1
    detail = ", ".join(f"{k} x{v}" for k, v in sorted(kinds.items()))
    return f"{statistics.median(counts):.0f} (min {counts[0]}, max {counts[-1]}): {detail}"


@contextlib.contextmanager
def proxied(host: str) -> Iterator[CountingProxy]:
    proxy = CountingProxy(host.removeprefix("unix://"))
    try:
        yield proxy
    finally:
        proxy.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--host", default=os.environ.get("DOCKER_HOST", "unix:///var/run/docker.sock"))
    parser.add_argument("--image", default="docbroker-server:latest")
    parser.add_argument("--json", type=Path, help="write the samples as JSON here")
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    if not CGROUP_CPU.is_dir():
        raise SystemExit(f"first_call: needs a rootful daemon with cgroup v1 cpuacct at {CGROUP_CPU}")
    cpus = DockerSettings().nano_cpus / 1e9
    instance = f"first{uuid.uuid4().hex[:6]}"
    tenants = Tenants((0, 0))
    import docker

    try:
        with proxied(args.host) as proxy:
            settings = DockerSettings(
                base_url=f"unix://{proxy.path}",
                image=args.image,
                seccomp_profile=REPO / "policies" / "seccomp.json",
            )
            phases = asyncio.run(backend_phases(settings, proxy, instance, tenants, args.runs))
            through = broker_runs(args.host, proxy, args.image, args.runs, cpus)
    finally:
        client = docker.DockerClient(base_url=args.host)
        for c in client.containers.list(all=True, filters={"label": f"io.docbroker.instance={instance}"}):
            c.remove(force=True)
        client.close()
        tenants.cleanup()

    rows: list[tuple[str, str]] = []
    for name in ("claim", "ready", "first_call", "second_call"):
        rows.append(
            (
                f"(a) backend, {name}: wall / sandbox CPU p50",
                f"{_ms([s[name]['wall_s'] for s in phases])} / {_ms([s[name]['cpu_s'] for s in phases])}",
            )
        )
    rows.append(("(a) Docker API calls during a claim", _calls([s["claim_api"] for s in phases])))
    for key, label in (
        ("first_call_s", "first call, wall"),
        ("broker_cpu_s", "first call, broker process CPU"),
        ("dockerd_cpu_s", "first call, dockerd CPU"),
        ("sandbox_cpu_s", "first call, claimed sandbox CPU (claim to answer)"),
        ("second_call_s", "second call, wall"),
        ("second_sandbox_cpu_s", "second call, sandbox CPU"),
        ("second_broker_cpu_s", "second call, broker process CPU"),
    ):
        rows.append((f"(b) broker, {label} p50", _ms([s[key] for s in through])))
    rows.append(("(b) Docker API calls for the tenant", _calls([s["api_tenant"] for s in through])))
    rows.append(("(b) Docker API calls of spares meanwhile", _calls([s["api_spares"] for s in through])))
    width = max(len(k) for k, _ in rows)
    for key, value in rows:
        print(f"{key:<{width}}  {value}")
    if args.json:
        args.json.write_text(json.dumps({"backend": phases, "broker": through}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
