"""A burst of new tenants at once through a real broker on Docker, and the adaptive warm pool.

    python bench/burst.py [--n 20] [--cap 20] [--idle 120] [--host unix:///var/run/docker.sock] [--json PATH]
                          [--breakdown] [--skip-idle]

One broker (rootful daemon: it runs as this user), its warm pool at the default floor
(DOCBROKER_DOCKER_POOL_SIZE=1) and allowed to grow to `--cap` (DOCBROKER_DOCKER_POOL_MAX),
DOCBROKER_IDLE_TIMEOUT=`--idle`. In order:

  floor     the CPU floor of starting N sandboxes here: N hardened sandboxes, created beforehand
            with the warm pool's own container options (the backend's), all started at once
            (`docker start`); each is timed from that instant until its socket accepts, and the
            floor is the last of them: what this host needs to bring N sandbox processes up when
            nothing else runs. Measured first, with no broker running, then removed.
  learning  N new tenants' first calls at once, the pool at its floor (it has never seen a new
            tenant): printed, not the target; the pool counts these arrivals and grows.
  refilled  the wait (untimed) until /readyz shows the pool's spares all warm.
  burst     N other new tenants' first calls at once: each is timed from the instant all are
            released until its answer (a `search_documents` result, status ok), as the floor's
            starts are. p50 and p99 by nearest rank (p99 of 20 is the slowest); ratio = p99 / floor.
  idle      no new tenant: the wait until /readyz shows the pool back at its floor.

`--breakdown`: where the host's CPU went during the burst (bench/first_call.py's CpuWindow): the
broker process, the Docker daemon side (dockerd, containerd, shims, runc), the tenants' sandboxes,
spares started meanwhile, and everything else (other work on a shared host); in the JSON as
"burst_cpu_s". `--skip-idle` ends after the burst ("size_after_idle": null): on a host too loaded
to refill within a short `--idle`, a long one then costs no wait.

Target (issue 25): all answered, p50 <= 1 s, p99 <= 1.2 x floor. `--json PATH` writes
{"burst": {"n", "answered", "p50_s", "p99_s", "floor_s", "ratio_p99_to_floor"},
 "pool": {"size_before", "peak", "size_after_idle"}} (sizes: the pool's target, `size` on /readyz).
Every container is labelled with this run's instance and removed at the end, also on failure.
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import json
import os
import shutil
import signal
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench._stats import fmt, pct  # noqa: E402
from bench.cold_start import broker_call, docker_broker, pool_facts, wait_pool  # noqa: E402
from bench.first_call import CpuWindow  # noqa: E402
from broker.runtime.docker import DockerBackend  # noqa: E402
from broker.runtime.docker.hardening import RUN_DIR  # noqa: E402
from broker.runtime.docker.warm_slots import BIND_SOCKET_NAME  # noqa: E402
from broker.runtime.readiness import wait_ready  # noqa: E402
from broker.settings import DockerSettings  # noqa: E402
from broker.types import Endpoint  # noqa: E402

TARGET_P50_S = 1.0
TARGET_RATIO = 1.2


def start_floor(settings: DockerSettings, instance: str, n: int) -> float:
    """Seconds from starting N pre-created sandboxes at once until the last one's socket accepts."""
    return asyncio.run(_start_floor(settings, instance, n))


async def _start_floor(settings: DockerSettings, instance: str, n: int) -> float:
    backend = await DockerBackend.connect(settings, instance=instance)
    base = Path(tempfile.mkdtemp(prefix="docbroker-burst-floor-", dir="/var/tmp"))
    client = backend._client
    try:
        image = await backend.image()  # the digest the broker's own sandboxes are made from
        containers, sockets = [], []
        for i in range(n):  # created before the clock starts, as the pool's slots are
            run_dir = base / str(i)
            run_dir.mkdir()
            run_dir.chmod(0o1777)
            options = backend.hardened_options(
                f"docbroker-{instance}.floor-{i}",
                image=image,
                labels={},
                environment={},
                mounts=[(RUN_DIR, str(run_dir), False)],
            )
            options["command"] = ["--bind", f"{RUN_DIR}/{BIND_SOCKET_NAME}"]
            containers.append(await asyncio.to_thread(client.containers.create, **options))
            sockets.append(str(run_dir / BIND_SOCKET_NAME))
        with concurrent.futures.ThreadPoolExecutor(n) as threads:
            loop = asyncio.get_running_loop()
            started = time.perf_counter()

            async def one(container: Any, socket: str) -> float:
                await loop.run_in_executor(threads, container.start)
                if not await wait_ready(Endpoint(url="http://localhost/mcp", uds=socket), 600.0):
                    raise RuntimeError("a floor sandbox never became ready")
                return time.perf_counter() - started

            return max(await asyncio.gather(*(one(c, s) for c, s in zip(containers, sockets, strict=True))))
    finally:
        remove_instance(client, instance)
        await backend.close()
        shutil.rmtree(base, ignore_errors=True)


def remove_instance(client: Any, instance: str) -> None:
    for container in client.containers.list(all=True, filters={"label": f"io.docbroker.instance={instance}"}):
        container.remove(force=True)


def burst(broker: Any, names: list[str]) -> list[float | None]:
    """Every tenant's first call, all released at one instant; each one's seconds from then
    (None: not answered)."""
    gate = threading.Barrier(len(names) + 1)
    released = [0.0]

    def call(name: str) -> float | None:
        gate.wait()
        try:
            broker_call(broker, name)
        except Exception as exc:  # counted as not answered; the class only, never a value
            print(f"burst: a first call failed ({exc.__class__.__name__})", file=sys.stderr)
            return None
        return time.perf_counter() - released[0]

    with concurrent.futures.ThreadPoolExecutor(len(names)) as threads:
        futures = [threads.submit(call, name) for name in names]
        released[0] = time.perf_counter()
        gate.wait()
        return [f.result() for f in futures]


def pool_on(check: Any) -> Any:
    """`check` on the pool's facts, ending the run at once if the pool turned itself off (its
    reason is a fixed phrase: e.g. a daemon too loaded to start a spare within its timeout)."""

    def checked(pool: dict[str, Any]) -> bool:
        if pool["state"] == "off":
            raise SystemExit(f"burst: the warm pool turned itself off: {pool.get('reason', '')}")
        return bool(check(pool))

    return checked


def _p50_p99(seconds: list[float]) -> str:
    return f"{fmt(pct(seconds, 0.5))} / {fmt(pct(seconds, 0.99))} s"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=20, help="new tenants in the burst")
    parser.add_argument("--cap", type=int, default=20, help="DOCBROKER_DOCKER_POOL_MAX")
    parser.add_argument("--idle", type=float, default=120.0, help="DOCBROKER_IDLE_TIMEOUT, seconds")
    parser.add_argument("--host", default=os.environ.get("DOCKER_HOST", "unix:///var/run/docker.sock"))
    parser.add_argument("--image", default="docbroker-server:latest")
    parser.add_argument("--json", type=Path, help="write the results as JSON here")
    parser.add_argument(
        "--skip-idle",
        action="store_true",
        help="end after the burst, without waiting for the pool to shrink (size after idle: null)",
    )
    parser.add_argument(
        "--breakdown", action="store_true", help="also say where the host's CPU went during the burst"
    )
    args = parser.parse_args()
    # SIGTERM ends the run through the clean-up below (the broker stopped, the containers removed).
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(2))

    cpus = DockerSettings().nano_cpus / 1e9
    settings = DockerSettings(
        base_url=args.host, image=args.image, seccomp_profile=REPO / "policies" / "seccomp.json"
    )
    instance = f"burst{uuid.uuid4().hex[:6]}"
    floor_s = start_floor(settings, f"{instance}f", args.n)

    learning = [f"learn{i}" for i in range(args.n)]
    measured = [f"burst{i}" for i in range(args.n)]
    env = {
        "DOCBROKER_INSTANCE": instance,
        "DOCBROKER_DOCKER_POOL_MAX": str(args.cap),
        "DOCBROKER_IDLE_TIMEOUT": str(args.idle),
        "DOCBROKER_MAX_SANDBOXES": str(2 * args.n + 1),
    }
    import docker

    docker_client = docker.DockerClient(base_url=args.host)
    try:
        with docker_broker(args.host, args.image, learning + measured, cpus, pool=1, env=env) as broker:
            floor_pool = wait_pool(
                broker, pool_on(lambda p: p["ready"] >= 1), "the pool never became warm", 300
            )
            first = burst(broker, learning)
            before = wait_pool(
                broker,
                pool_on(lambda p: p["waiting"] == 0 and p["warming"] == 0 and p["ready"] >= p["size"]),
                "the pool did not refill after the first burst",
                600,
            )
            if before["size"] <= floor_pool["size"]:
                raise SystemExit("burst: the pool forgot the first burst before it refilled: raise --idle")
            window = CpuWindow(docker_client, instance, broker.proc.pid) if args.breakdown else None
            if window is not None:
                window.start()
            timings = burst(broker, measured)
            cpu = window.stop() if window is not None else None
            peak = pool_facts(broker)["peak"]
            after = (
                {"size": None}
                if args.skip_idle
                else wait_pool(
                    broker,
                    pool_on(lambda p: p["size"] == p["floor"] and p["ready"] + p["warming"] <= p["floor"]),
                    "the pool did not shrink back when idle",
                    args.idle + 600,
                )
            )
    finally:
        remove_instance(docker_client, instance)  # what a crash of the broker left
        docker_client.close()

    answered = [t for t in timings if t is not None]
    first_answered = [t for t in first if t is not None]
    p50, p99 = pct(answered, 0.5), pct(answered, 0.99)
    result: dict[str, Any] = {
        "burst": {
            "n": args.n,
            "answered": len(answered),
            "p50_s": round(p50, 3),
            "p99_s": round(p99, 3),
            "floor_s": round(floor_s, 3),
            "ratio_p99_to_floor": round(p99 / floor_s, 3),
        },
        "pool": {"size_before": before["size"], "peak": peak, "size_after_idle": after["size"]},
    }
    rows = [
        (f"floor: {args.n} pre-created sandboxes started at once, last ready", f"{fmt(floor_s)} s"),
        (
            f"learning burst (pool at its floor, {floor_pool['size']}): answered, p50 / p99",
            f"{len(first_answered)}/{args.n}, {_p50_p99(first_answered)}",
        ),
        (f"pool before the burst (cap {args.cap})", f"size {before['size']}, ready {before['ready']}"),
        (f"burst of {args.n} new tenants: answered", f"{len(answered)}/{args.n}"),
        ("burst: first call p50", f"{fmt(p50)} s (target <= {TARGET_P50_S} s)"),
        ("burst: first call p99", f"{fmt(p99)} s = {fmt(p99 / floor_s)} x floor (target <= {TARGET_RATIO})"),
        ("pool: peak size / after idle", f"{peak} / {after['size']} (idle timeout {args.idle:.0f} s)"),
    ]
    if cpu is not None:
        result["burst_cpu_s"] = {k: round(v, 3) for k, v in cpu.items()}
        rows += [
            (f"burst CPU: {k.removesuffix('_s').replace('_', ' ')}", f"{v:.2f} s") for k, v in cpu.items()
        ]
    width = max(len(k) for k, _ in rows)
    for key, value in rows:
        print(f"{key:<{width}}  {value}")
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    ok = len(answered) == args.n and p50 <= TARGET_P50_S and p99 <= TARGET_RATIO * floor_s
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
