"""Cold start and footprint of a hardened sandbox.

    python bench/cold_start.py [--runs 10] [--host unix:///var/run/docker.sock] [--many 100]

Prints one table:
  (a) DockerBackend (hardened, unix socket): create → socket ready → first tools/call result,
      cold (a new container) and pooled (a warm sandbox bound to the tenant; the pool is
      given time to refill between runs, as between two tenants' first calls)
  (b) naive hardened `docker run -i` of the same image via the CLI, MCP over stdio
  (c) through a real broker: a tenant's first tools/call → result, with the warm pool (the
      default) and without it (DOCBROKER_DOCKER_POOL_SIZE=0: container start included)
  idle memory of one sandbox (as `docker stats` shows it) next to two floors measured the same
  way in the same image: the interpreter alone, and the interpreter after `import mcp.server`
  (the SDK's server package, which every sandbox loads); image size, and with --many N,
  N sandboxes running at once with their memory per container, then N tenants' first calls
  at once through one broker and one more call each with all N running.
(c) and the broker half of --many need a rootful daemon (the broker runs as this user).

Tenant folders are provisioned before the clock starts (the broker does that once per tenant).
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import contextlib
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import httpx2  # noqa: E402
from mcp import Client, StdioServerParameters  # noqa: E402
from mcp.client.streamable_http import streamable_http_client  # noqa: E402

from bench._stats import nearest_index  # noqa: E402
from bench.workload import call_body, call_headers  # noqa: E402
from broker.master_key import tenant_secret  # noqa: E402
from broker.runtime.docker import DockerBackend  # noqa: E402
from broker.runtime.readiness import wait_ready  # noqa: E402
from broker.settings import DockerSettings  # noqa: E402
from broker.types import DROPBOX_MODE, SandboxSpec, TenantId  # noqa: E402

QUERY = {"query": "bench"}


class Tenants:
    """Broker-style tenant folders, owned by the daemon's user (root, or the rootless user)."""

    def __init__(self, owner: tuple[int, int]) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="docbroker-bench-", dir="/var/tmp"))
        self.owner = owner
        self.key = os.urandom(32)
        os.chown(self.root, *owner)

    def make(self, name: str) -> SandboxSpec:
        docs = self.root / name / "docs"
        run = self.root / name / "run"
        for path, mode in ((docs / "sources", 0o755), (docs / "reports", DROPBOX_MODE), (run, 0o1777)):
            path.mkdir(parents=True)
            path.chmod(mode)
        (docs / "sources" / "a.md").write_text("bench document\n")
        secret = self.root / name / "secret.key"
        secret.write_text(tenant_secret(self.key, name))
        secret.chmod(0o444)
        owned = (self.root / name, docs, docs / "sources", docs / "reports", run, secret)
        for path in (*owned, docs / "sources" / "a.md"):
            os.chown(path, *self.owner)
        return SandboxSpec(
            tenant=TenantId(name), docs_root=str(docs), secret_file=str(secret), run_dir=str(run)
        )

    def cleanup(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)


async def call_over_socket(path: str) -> None:
    async with httpx2.AsyncClient(transport=httpx2.AsyncHTTPTransport(uds=path), timeout=30) as http:
        async with Client(streamable_http_client("http://localhost/mcp", http_client=http)) as client:
            result = await client.call_tool("search_documents", QUERY)
            assert result.structured_content and result.structured_content["status"] == "ok"


async def backend_cold_start(backend: DockerBackend, spec: SandboxSpec) -> tuple[float, Any]:
    started = time.perf_counter()
    info = await backend.create(spec)
    assert info.endpoint is not None and info.endpoint.uds is not None
    if not await wait_ready(info.endpoint, 30.0):
        raise RuntimeError("sandbox never became ready")
    await call_over_socket(info.endpoint.uds)
    return time.perf_counter() - started, info


async def naive_cold_start(host: str, image: str, spec: SandboxSpec, cpus: str) -> float:
    """`docker run -i --rm` with the same hardening flags, MCP over the container's stdio."""
    args = [
        "run",
        "-i",
        "--rm",
        "--network",
        "none",
        "--read-only",
        "--cap-drop",
        "ALL",
        "--security-opt",
        "no-new-privileges:true",
        "--security-opt",
        f"seccomp={REPO / 'policies' / 'seccomp.json'}",
        "--user",
        "10001:0",
        "--tmpfs",
        "/tmp:rw,noexec,nosuid,nodev,size=8m",  # noqa: S108
        "--memory",
        "128m",
        "--pids-limit",
        "64",
        "--cpus",
        cpus,
        "-e",
        f"DOCS_SCOPE={spec.tenant}",
        "-v",
        f"{spec.sources_dir}:/srv/docs/sources:ro",
        "-v",
        f"{spec.dropbox_dir}:/srv/docs/reports",
        "-v",
        f"{spec.secret_file}:/run/secrets/approval.key:ro",
        "--entrypoint",
        "/opt/venv/bin/python",
        image,
        "-OO",  # as the image's own entrypoint runs it (its bytecode is built for -OO)
        "-m",
        "server",
    ]
    params = StdioServerParameters(command="docker", args=args, env={**os.environ, "DOCKER_HOST": host})
    started = time.perf_counter()
    async with Client(params) as client:
        result = await client.call_tool("search_documents", QUERY)
        elapsed = time.perf_counter() - started
        assert result.structured_content and result.structured_content["status"] == "ok"
    return elapsed


def docker_stats_mib(host: str, names: list[str]) -> list[float]:
    """Memory as `docker stats --no-stream` reports it, in MiB."""
    out = subprocess.run(
        ["docker", "stats", "--no-stream", "--format", "{{.Name}} {{.MemUsage}}", *names],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "DOCKER_HOST": host},
    ).stdout
    factor = {"B": 1 / 1024 / 1024, "KiB": 1 / 1024, "MiB": 1.0, "GiB": 1024.0}
    values = []
    for line in out.splitlines():
        match = re.match(r"([0-9.]+)([A-Za-z]+)", line.split()[1])
        assert match, line
        values.append(float(match.group(1)) * factor[match.group(2)])
    return values


# What a sandbox cannot go below, measured as the sandbox is: the same image, `-OO` and user,
# no network, read-only root, `docker stats` after the same idle wait (seccomp and the limits
# do not change what a process holds). The program prints a line once its imports are done.
_FLOORS = {
    "floor: the image's python, nothing imported": "",
    "floor: the image's python after `import mcp.server` only": "import mcp.server",
}


def memory_floor(host: str, image: str, imports: str, labels: dict[str, str], idle_wait: float) -> float:
    """`docker stats` MiB of an idle container that only runs `imports` in the server's image."""
    import docker  # the bench's other rows use the broker's backend; this is a bare container

    client = docker.DockerClient(base_url=host)
    program = f"{imports}\nimport signal, sys\nprint('ready', flush=True)\nsignal.pause()"
    container = client.containers.run(
        image,
        entrypoint=["/opt/venv/bin/python", "-OO", "-c", program],
        command=[],
        detach=True,
        network_mode="none",
        read_only=True,
        user="10001:0",
        cap_drop=["ALL"],
        labels=labels,
    )
    try:
        deadline = time.monotonic() + 60.0
        while b"ready" not in container.logs(stdout=True, stderr=False):
            if time.monotonic() > deadline:
                raise RuntimeError("the floor container did not get through its imports in 60 s")
            time.sleep(0.05)
        time.sleep(idle_wait)
        return docker_stats_mib(host, [container.name])[0]
    finally:
        container.remove(force=True)
        client.close()


_CALL_BODY = call_body("search_documents", QUERY)
_CALL_HEADERS = call_headers("search_documents")


@contextlib.contextmanager
def docker_broker(
    host: str,
    image: str,
    names: list[str],
    cpus: float,
    pool: int = 1,
    env: dict[str, str] | None = None,
    limits: str | None = None,
) -> Iterator[Any]:
    """A real broker on the Docker runtime with these tenants, each with one document.

    It runs as this process's user (root), so only with a rootful daemon; tests/docker runs
    the rootless shape. Caps and timeouts are set out of the way of N sandboxes starting at once;
    `env` overrides any setting (bench/burst.py and bench/scale.py set theirs); `limits`, the
    tenants' `[limits]` table (make_broker's, unless given).
    """
    from broker.testing import make_broker

    base = Path(tempfile.mkdtemp(prefix="docbroker-bench-broker-", dir="/var/tmp"))
    broker = make_broker(
        base,
        runtime="docker",
        tenants=names,
        env={
            "DOCBROKER_DOCKER_HOST": host,
            "DOCBROKER_DOCKER_IMAGE": image,
            "DOCBROKER_DOCKER_SECCOMP_PROFILE": str(REPO / "policies" / "seccomp.json"),
            "DOCBROKER_DOCKER_CPUS": str(cpus),
            "DOCBROKER_IDLE_TIMEOUT": "3600",
            "DOCBROKER_MAX_SANDBOXES": str(max(len(names), 1)),
            "DOCBROKER_START_TIMEOUT": "600",
            "DOCBROKER_CALL_TIMEOUT": "600",
            "DOCBROKER_DOCKER_POOL_SIZE": str(pool),
            **(env or {}),
        },
        **({"limits": limits} if limits is not None else {}),
    )
    for name in names:
        sources = broker.sources(name)
        sources.mkdir(parents=True)
        (sources / "a.md").write_text("bench document\n")
    try:
        # Inside: a broker too slow to answer in time (a loaded host) is still running, and
        # would start sandboxes after the benchmark's clean-up.
        broker.start()
        yield broker
    finally:
        broker.stop()  # the broker removes its sandboxes on shutdown
        shutil.rmtree(base, ignore_errors=True)


def broker_call(broker: Any, tenant: str) -> float:
    """One search through the broker as that tenant; its duration. Raises unless the result is ok."""
    token = broker.token(tenant, scope="docs:read")
    with httpx2.Client(timeout=600) as http:
        started = time.perf_counter()
        reply = http.post(
            broker.mcp_url, json=_CALL_BODY, headers={**_CALL_HEADERS, "authorization": f"Bearer {token}"}
        )
        elapsed = time.perf_counter() - started
    status = reply.json().get("result", {}).get("structuredContent", {}).get("status")
    if reply.status_code != 200 or status != "ok":
        raise RuntimeError(f"broker call failed: HTTP {reply.status_code} {reply.text[:300]}")
    return elapsed


def broker_cold_starts(host: str, image: str, runs: int, cpus: float, pool: int) -> list[float]:
    """(c) The whole path: a client's first tools/call for a tenant without a sandbox, through a
    real broker (JWT, audit, descriptor pinning) on the Docker runtime, until its result.
    One new tenant per run, so every call is a first call. With a pool, each run waits (not
    timed) until the broker's /readyz shows a warm sandbox again."""
    names = [f"cold{i}" for i in range(runs + 1)]  # +1: a warm-up tenant, not counted
    with docker_broker(host, image, names, cpus, pool) as broker:
        timings = []
        for name in names:
            if pool:
                wait_pool_warm(broker)
            timings.append(broker_call(broker, name))
        return timings[1:]


def wait_pool_warm(broker: Any, timeout: float = 60.0) -> None:
    wait_pool(broker, lambda pool: bool(pool["ready"]), "the broker's pool never became warm", timeout)


def pool_facts(broker: Any) -> dict[str, Any]:
    """The warm pool as the broker's /readyz shows it to an operator (size, ready, warming, ...)."""
    ready_url = broker.mcp_url.removesuffix("/mcp") + "/readyz"
    with httpx2.Client(timeout=30) as http:
        facts: dict[str, Any] = http.get(ready_url, headers=broker.ops_headers).json()
    return dict(facts["checks"]["sandboxes"]["pool"])


def wait_pool(broker: Any, check: Any, failure: str, timeout: float) -> dict[str, Any]:
    """The pool's facts once `check` holds for them; RuntimeError(failure) after `timeout` s."""
    deadline = time.monotonic() + timeout
    while not check(pool := pool_facts(broker)):
        if time.monotonic() > deadline:
            raise RuntimeError(f"{failure}: {pool}")
        time.sleep(0.1)
    return pool


async def backend_pooled_starts(
    settings: DockerSettings, instance: str, tenants: Tenants, runs: int
) -> list[float]:
    """(a) pooled: DockerBackend with a pool of one; each run binds the warm sandbox."""
    pool_dir = tenants.root / "run" / ".pool"
    pool_dir.mkdir(parents=True, mode=0o700)
    os.chown(pool_dir.parent, *tenants.owner)
    os.chown(pool_dir, *tenants.owner)
    backend = await DockerBackend.connect(settings, instance=instance, pool_dir=pool_dir)
    await backend.start()
    timings = []
    try:
        for i in range(runs + 1):  # +1: a warm-up run, not counted
            await _pool_ready(backend)
            elapsed, info = await backend_cold_start(backend, tenants.make(f"pooled-{i}"))
            timings.append(elapsed)
            await backend.delete(info)
    finally:
        await backend.close()
    return timings[1:]


async def _pool_ready(backend: DockerBackend, timeout: float = 60.0) -> None:
    """Wait for a warm sandbox; a pool that turned itself off (or never fills) ends the run."""
    deadline = time.monotonic() + timeout
    while not (pool := backend.describe()["pool"])["ready"]:
        if pool["state"] == "off" or time.monotonic() > deadline:
            raise SystemExit(f"cold_start: the warm pool did not fill: {pool}")
        await asyncio.sleep(0.05)


def broker_many(host: str, image: str, n: int, cpus: float) -> tuple[float, list[float]]:
    """N tenants' first calls at once through one broker (N sandboxes start together), then one
    more call for every tenant with all N running: (seconds until all first calls were
    answered, the second calls' durations)."""
    names = [f"many{i}" for i in range(n)]
    with docker_broker(host, image, names, cpus) as broker:
        started = time.perf_counter()
        with concurrent.futures.ThreadPoolExecutor(max_workers=n) as pool:
            list(pool.map(lambda name: broker_call(broker, name), names))
        all_answered = time.perf_counter() - started
        return all_answered, [broker_call(broker, name) for name in names]


def _p50_p90(values: list[float]) -> str:
    return f"{statistics.median(values) * 1000:.0f} ms / {nearest_index(values, 0.9) * 1000:.0f} ms"


async def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--host", default=os.environ.get("DOCKER_HOST", "unix:///var/run/docker.sock"))
    parser.add_argument("--image", default="docbroker-server:latest")
    parser.add_argument("--many", type=int, default=0, help="also run N sandboxes at once")
    parser.add_argument("--idle-wait", type=float, default=5.0)
    parser.add_argument("--json", type=Path, help="also write the results as JSON here (seconds, MiB)")
    parser.add_argument(
        "--cpus",
        type=float,
        default=DockerSettings().nano_cpus / 1e9,
        help="sandbox CPU limit (DOCBROKER_DOCKER_CPUS)",
    )
    args = parser.parse_args()

    seccomp = REPO / "policies" / "seccomp.json"
    settings = DockerSettings(
        base_url=args.host, image=args.image, seccomp_profile=seccomp, nano_cpus=int(args.cpus * 1e9)
    )
    instance = f"bench{uuid.uuid4().hex[:6]}"
    backend = await DockerBackend.connect(settings, instance=instance)
    owner = (0, 0)
    if backend.describe()["mode"] == "rootless":
        st = os.stat(args.host.removeprefix("unix://"))
        import pwd

        owner = (st.st_uid, pwd.getpwuid(st.st_uid).pw_gid)
    tenants = Tenants(owner)
    described = backend.describe()
    rows: list[tuple[str, str]] = [("daemon", f"{described['mode']} {described['engine_version']}")]
    # The same figures for --json: every sample in seconds, memory in MiB, sizes in MB.
    results: dict[str, Any] = {
        "daemon": f"{described['mode']} {described['engine_version']}",
        "runs": args.runs,
        "cpus": args.cpus,
    }
    try:
        # warm the page cache and the daemon once; not counted
        _, info = await backend_cold_start(backend, tenants.make("warmup"))
        await backend.delete(info)

        hardened: list[float] = []
        for i in range(args.runs):
            elapsed, info = await backend_cold_start(backend, tenants.make(f"cold-{i}"))
            hardened.append(elapsed)
            if i == 0:
                await asyncio.sleep(args.idle_wait)
                idle = docker_stats_mib(args.host, [backend.container_name(info.tenant)])[0]
            await backend.delete(info)
        cpus = str(settings.nano_cpus / 1e9)
        naive = []
        for i in range(args.runs):
            naive.append(await naive_cold_start(args.host, args.image, tenants.make(f"naive-{i}"), cpus))

        pooled = await backend_pooled_starts(settings, instance, tenants, args.runs)
        through_broker: list[float] = []
        through_broker_cold: list[float] = []
        if described["mode"] == "rootful":
            through_broker = broker_cold_starts(args.host, args.image, args.runs, args.cpus, pool=1)
            through_broker_cold = broker_cold_starts(args.host, args.image, args.runs, args.cpus, pool=0)
        image = backend._client.images.get(args.image)
        labels = {"io.docbroker.instance": instance}  # so the cleanup below finds it after a crash
        floors = {
            name: memory_floor(args.host, args.image, imports, labels, args.idle_wait)
            for name, imports in _FLOORS.items()
        }
        results |= {
            "backend_cold_s": hardened,
            "backend_pooled_s": pooled,
            "naive_s": naive,
            "broker_pooled_s": through_broker,
            "broker_cold_s": through_broker_cold,
            "idle_mib": idle,
            "floors_mib": floors,
            "image_mb": image.attrs["Size"] / 1e6,
        }
        rows += [
            (
                f"(a) DockerBackend cold start p50 / p90 (n={args.runs}, {args.cpus} CPU)",
                f"{statistics.median(hardened) * 1000:.0f} ms / {nearest_index(hardened, 0.9) * 1000:.0f} ms",
            ),
            (f"(a) DockerBackend pooled start p50 / p90 (n={args.runs})", _p50_p90(pooled)),
            (
                f"(b) naive docker run + stdio p50 / p90 (n={args.runs}, {args.cpus} CPU)",
                f"{statistics.median(naive) * 1000:.0f} ms / {nearest_index(naive, 0.9) * 1000:.0f} ms",
            ),
            (
                f"(c) through the broker, warm pool: first tools/call → result p50 / p90 (n={args.runs})",
                _p50_p90(through_broker) if through_broker else "- (rootful daemon only)",
            ),
            (
                f"(c) through the broker, no pool: first tools/call → result p50 / p90 (n={args.runs})",
                _p50_p90(through_broker_cold) if through_broker_cold else "- (rootful daemon only)",
            ),
            *((f"{name} (docker stats)", f"{mib:.1f} MiB") for name, mib in floors.items()),
            ("idle sandbox memory (docker stats)", f"{idle:.1f} MiB"),
            ("server image size", f"{image.attrs['Size'] / 1e6:.1f} MB"),
        ]
        if args.many:
            started = time.perf_counter()
            specs = [tenants.make(f"many-{i}") for i in range(args.many)]
            infos = []
            for spec in specs:  # created one by one, started concurrently by the daemon
                infos.append(await backend.create(spec))
            ready = await asyncio.gather(*(wait_ready(i.endpoint, 300.0) for i in infos if i.endpoint))
            all_up = time.perf_counter() - started
            await asyncio.sleep(args.idle_wait)
            sockets = [i.endpoint.uds for i in infos if i.endpoint and i.endpoint.uds]
            await asyncio.gather(*(call_over_socket(path) for path in sockets))
            mem = docker_stats_mib(args.host, [backend.container_name(i.tenant) for i in infos])
            results["many"] = {"n": args.many, "ready": sum(ready), "all_up_s": all_up, "memory_mib": mem}
            rows += [
                (f"{args.many} sandboxes: all ready", f"{sum(ready)}/{args.many} in {all_up:.1f} s"),
                (
                    f"{args.many} sandboxes: memory per container p50 / max",
                    f"{statistics.median(mem):.1f} / {max(mem):.1f} MiB (total {sum(mem) / 1024:.2f} GiB)",
                ),
            ]
            await asyncio.gather(*(backend.delete(i) for i in infos))
            if described["mode"] == "rootful":
                all_answered, second = broker_many(args.host, args.image, args.many, args.cpus)
                results["many"] |= {"broker_all_answered_s": all_answered, "broker_next_call_s": second}
                rows += [
                    (
                        f"{args.many} tenants through one broker: all first calls answered",
                        f"{args.many}/{args.many} in {all_answered:.1f} s",
                    ),
                    (
                        f"{args.many} tenants through one broker: next call each, p50 / p90",
                        _p50_p90(second),
                    ),
                ]
    finally:
        client = backend._client
        for c in client.containers.list(all=True, filters={"label": f"io.docbroker.instance={instance}"}):
            c.remove(force=True)
        await backend.close()
        tenants.cleanup()

    width = max(len(k) for k, _ in rows)
    for key, value in rows:
        print(f"{key:<{width}}  {value}")
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    # Stopped (make_report's timeout, Ctrl-C's SIGTERM cousin): unwind through the `finally`
    # blocks, which remove this run's containers, brokers and tenant folders.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    sys.exit(asyncio.run(main()))
