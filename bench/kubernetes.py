"""Tenant Pods on the lab cluster (issue 18's targets): first call, 20 at once, idle memory.

    source /tmp/kube-lab/env   # DOCBROKER_TEST_KUBECONFIG, DOCBROKER_TEST_KUBE_LAB
    python bench/kubernetes.py                 # N=5 tenants, 20 at once, memory next to Docker's
    python bench/kubernetes.py --tenants 9 --burst 20 --no-docker

1. First call: a real broker process (DOCBROKER_RUNTIME=kubernetes, the broker
   ServiceAccount's token, broker/testing/kubernetes_lab.py) and a real MCP SDK client; for
   each of N new tenants, the time from the client's first request (initialize, then one
   search_documents) to its answer: Pod creation, scheduling, the containers' start and
   readiness included. p50 and max. Target: p50 <= 3 s.
2. Burst: `--burst` new tenants' first calls at once through the same broker; wall time,
   p50/max per call, failures, and the Pods Running at the end.
3. Memory per idle tenant Pod: the kubelet's summary (workingSetBytes, all containers of the
   Pod) after the Pods sat idle; next to it a Docker runtime sandbox's (the docker SDK's
   stats, usage less inactive file cache, as `docker stats` shows) for the same server image.

Everything made is removed at exit. Exit status: 0 ran (targets printed PASS/FAIL), 2 could
not run.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import os
import shutil
import signal
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# This file is named like the client package: its folder must not come first on the path.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]
sys.path.insert(0, str(ROOT))

import httpx2  # noqa: E402
from mcp import Client  # noqa: E402
from mcp.client.streamable_http import streamable_http_client  # noqa: E402

from broker.runtime.kubernetes import names  # noqa: E402
from broker.testing import Broker, structured  # noqa: E402
from broker.testing.kubernetes_lab import Lab, _kubectl, host_broker, unique_tenant  # noqa: E402

TARGET_P50 = 3.0
CALL_TIMEOUT = 150.0


Calls = dict[str, tuple[float, float]]  # tenant: (request sent, answer received), perf_counter


async def first_call(broker: Broker, tenant: str, calls: Calls | None = None) -> float:
    token = broker.token(tenant, scope="docs:read")
    started = time.perf_counter()
    # A longer wait than the tests' client: 20 Pods starting at once on 2 cores is CPU-bound.
    async with (
        httpx2.AsyncClient(headers={"authorization": f"Bearer {token}"}, timeout=CALL_TIMEOUT) as http,
        Client(streamable_http_client(broker.mcp_url, http_client=http)) as client,
    ):
        result = structured(await client.call_tool("search_documents", {"query": "cluster"}))
    if result["status"] != "ok":
        raise RuntimeError(f"first call for a tenant answered {result['status']}")
    answered = time.perf_counter()
    if calls is not None:
        calls[tenant] = (started, answered)
    return answered - started


PHASES = ("created", "scheduled", "initialized", "running", "ready")


class PodPhases:
    """When each tenant Pod reached each phase, as seen by a watch of the namespace (the API's
    own timestamps have whole seconds only): created, scheduled, init done, containers
    running, the kubelet's Ready. The broker itself connects once the containers run."""

    def __init__(self, lab: Lab) -> None:
        self._lab = lab
        self.seen: dict[str, dict[str, float]] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()

    def _watch(self) -> None:
        from kubernetes import watch

        while not self._stop.is_set():
            stream = watch.Watch()  # type: ignore[no-untyped-call]
            try:
                for event in stream.stream(  # type: ignore[no-untyped-call]
                    self._lab.core.list_namespaced_pod, names.TENANTS_NAMESPACE, timeout_seconds=5
                ):
                    self._record(event["object"], time.perf_counter())
                    if self._stop.is_set():
                        break
            finally:
                stream.stop()  # type: ignore[no-untyped-call]

    def _record(self, pod: object, now: float) -> None:
        name = pod.metadata.name  # type: ignore[attr-defined]
        status = pod.status  # type: ignore[attr-defined]
        marks = self.seen.setdefault(name, {})
        marks.setdefault("created", now)
        conditions = {c.type: c.status for c in (status.conditions or ())} if status else {}
        if conditions.get("PodScheduled") == "True":
            marks.setdefault("scheduled", now)
        if conditions.get("Initialized") == "True":
            marks.setdefault("initialized", now)
        statuses = (status.container_statuses or ()) if status else ()
        if statuses and all(c.state is not None and c.state.running is not None for c in statuses):
            marks.setdefault("running", now)
        if conditions.get("Ready") == "True":
            marks.setdefault("ready", now)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def rows(self, tenants: list[str], calls: Calls) -> list[tuple[str, str]]:
        """Median time from the client's first request to each phase, and to the answer."""
        out = []
        for phase in PHASES:
            gaps = [
                self.seen[names.object_name(t)][phase] - calls[t][0]
                for t in tenants
                if phase in self.seen.get(names.object_name(t), {})
            ]
            if gaps:
                out.append((f"  request -> pod {phase} (p50)", f"{statistics.median(gaps):.2f} s"))
        answers = [calls[t][1] - calls[t][0] for t in tenants]
        out.append(("  request -> answer (p50)", f"{statistics.median(answers):.2f} s"))
        return out


def failure(exc: BaseException) -> str:
    """The innermost error of a failed first call (the SDK wraps it in task groups)."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    return f"{type(exc).__name__}: {exc}"[:300]


def pod_memory(lab: Lab, tenants: list[str]) -> list[int]:
    """workingSetBytes of each tenant's Pod, from the kubelet's summary through the API."""
    summary = json.loads(
        _kubectl(lab.kubeconfig, "get", "--raw", f"/api/v1/nodes/{lab.node}/proxy/stats/summary")
    )
    wanted = {names.object_name(t) for t in tenants}
    sizes = []
    for pod in summary.get("pods", []):
        if pod["podRef"]["name"] in wanted and pod["podRef"]["namespace"] == names.TENANTS_NAMESPACE:
            sizes.append(
                sum(c.get("memory", {}).get("workingSetBytes", 0) for c in pod.get("containers", []))
            )
    return sizes


def docker_memory(base: Path) -> int | None:
    """A Docker runtime sandbox's memory once idle (None when no daemon answers)."""
    from broker.runtime.docker import DockerBackend
    from broker.settings import DockerSettings
    from broker.types import DROPBOX_MODE, SandboxSpec, TenantId

    tenant = "benchmem"
    docs = base / "docker" / tenant / "docs"
    (docs / "sources").mkdir(parents=True)
    (docs / "reports").mkdir()
    os.chmod(docs / "reports", DROPBOX_MODE)  # the drop-box, as broker/tenants.py makes it
    (docs / "sources" / "notes.md").write_text("# Notes\nthe cluster\n")
    run = base / "docker" / tenant / "run"
    run.mkdir()
    os.chmod(run, 0o1777)  # noqa: S103 - as broker/tenants.py makes it
    secret = base / "docker" / tenant / "secret.key"
    secret.write_text("0" * 64)
    spec = SandboxSpec(
        tenant=TenantId(tenant), docs_root=str(docs), secret_file=str(secret), run_dir=str(run)
    )
    settings = DockerSettings(
        base_url=os.environ.get("DOCBROKER_DOCKER_HOST"),
        pool_size=0,
        seccomp_profile=ROOT / "policies" / "seccomp.json",
    )

    async def run_one() -> int | None:
        try:
            backend = await DockerBackend.connect(settings)
        except Exception as exc:
            print(f"docker: not measured ({type(exc).__name__}: {exc})", file=sys.stderr)
            return None
        try:
            info = await backend.create(spec)
        except Exception as exc:
            await backend.close()
            print(f"docker: not measured ({type(exc).__name__}: {exc})", file=sys.stderr)
            return None
        try:
            await asyncio.sleep(5)
            stats = await asyncio.to_thread(
                lambda: backend._client.containers.get(info.backend_id).stats(stream=False)
            )
            memory = stats["memory_stats"]
            inactive = memory.get("stats", {}).get(
                "total_inactive_file", memory.get("stats", {}).get("inactive_file", 0)
            )
            return int(memory["usage"] - inactive)
        finally:
            await backend.delete(info)
            await backend.close()

    return asyncio.run(run_one())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tenants", type=int, default=5, help="new tenants for the first-call p50")
    parser.add_argument("--burst", type=int, default=20, help="tenant Pods started at once")
    parser.add_argument("--idle", type=float, default=15.0, help="seconds idle before measuring memory")
    parser.add_argument("--no-docker", action="store_true", help="skip the Docker sandbox's memory")
    parser.add_argument("--json", type=Path, help="also write the results as JSON here (seconds, MiB)")
    args = parser.parse_args()
    if not os.environ.get("DOCBROKER_TEST_KUBECONFIG"):
        print("DOCBROKER_TEST_KUBECONFIG is not set: start the lab and source its env", file=sys.stderr)
        return 2
    lab = Lab.open()
    sequential = [unique_tenant("s") for _ in range(args.tenants)]
    burst = [unique_tenant("p") for _ in range(args.burst)]
    base = Path(tempfile.mkdtemp(prefix="docbroker-kube-bench-"))
    broker = host_broker(lab, base / "broker", sequential + burst)
    broker.env["DOCBROKER_MAX_SANDBOXES"] = str(len(sequential) + len(burst) + 5)
    broker.env["DOCBROKER_START_TIMEOUT"] = str(int(CALL_TIMEOUT - 10))
    broker.env["DOCBROKER_CALL_TIMEOUT"] = str(int(CALL_TIMEOUT - 10))
    rows: list[tuple[str, str]] = []
    results: dict[str, object] = {}  # the same figures for --json
    try:
        for tenant in sequential + burst:
            lab.tenant(tenant)
        broker.start()
        phases = PodPhases(lab)
        calls: Calls = {}
        try:
            firsts = [asyncio.run(first_call(broker, t, calls)) for t in sequential]
        finally:
            phases.stop()
        rows.append(("first call, new tenant (p50)", f"{statistics.median(firsts):.2f} s"))
        rows.append(("first call, new tenant (max)", f"{max(firsts):.2f} s  (N={len(firsts)})"))
        rows.append(("first call, new tenant (in order)", " ".join(f"{t:.2f}" for t in firsts)))
        rows += phases.rows(sequential, calls)

        async def together() -> list[float | BaseException]:
            return list(await asyncio.gather(*(first_call(broker, t) for t in burst), return_exceptions=True))

        started = time.perf_counter()
        outcomes = asyncio.run(together())
        wall = time.perf_counter() - started
        times = [r for r in outcomes if isinstance(r, float)]
        failures = collections.Counter(failure(r) for r in outcomes if not isinstance(r, float))
        for why, count in failures.items():
            print(f"{count} of the burst failed: {why}", file=sys.stderr)
        running = [
            p
            for p in lab.core.list_namespaced_pod(
                names.TENANTS_NAMESPACE, label_selector=names.COMPONENT + "=sandbox"
            ).items
            if p.metadata.labels.get(names.TENANT) in burst and p.status.phase == "Running"
        ]
        results |= {
            "first_call_s": firsts,
            "burst": {"n": len(burst), "wall_s": wall, "answered_s": times, "running": len(running)},
        }
        rows.append((f"{len(burst)} first calls at once (wall)", f"{wall:.2f} s"))
        if times:
            rows.append(
                (
                    f"{len(burst)} at once, per call p50 / max",
                    f"{statistics.median(times):.2f} / {max(times):.2f} s",
                )
            )
        rows.append(
            (f"{len(burst)} at once: failed, Pods Running", f"{len(outcomes) - len(times)}, {len(running)}")
        )
        time.sleep(args.idle)
        sizes = pod_memory(lab, sequential + burst)
        results["pod_memory_mib"] = [size / 2**20 for size in sizes]
        if sizes:
            rows.append(
                (
                    "memory per idle tenant Pod (median)",
                    f"{statistics.median(sizes) / 2**20:.1f} MiB  (n={len(sizes)})",
                )
            )
        if not args.no_docker:
            docker = docker_memory(base)
            results["docker_memory_mib"] = None if docker is None else docker / 2**20
            if docker is not None:
                rows.append(("memory per idle Docker sandbox", f"{docker / 2**20:.1f} MiB"))
    finally:
        broker.stop()
        for tenant in sequential + burst:
            lab.drop_tenant(tenant)
        shutil.rmtree(base, ignore_errors=True)
    width = max(len(r[0]) for r in rows)
    print(f"{'measure':<{width}}  value")
    for name, value in rows:
        print(f"{name:<{width}}  {value}")
    p50 = statistics.median(firsts)
    print(f"target first call p50 <= {TARGET_P50:.0f} s: {'PASS' if p50 <= TARGET_P50 else 'FAIL'}")
    print(f"target {len(burst)} Pods at once: {'PASS' if len(times) == len(burst) else 'FAIL'}")
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    # Stopped (make_report's timeout): unwind through the clean-up, as Ctrl-C would.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    raise SystemExit(main())
