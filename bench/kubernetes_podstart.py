"""A tenant Pod's start on the lab, this tree's Pod spec next to an earlier revision's.

    source /tmp/kube-lab/env   # DOCBROKER_TEST_KUBECONFIG, DOCBROKER_TEST_KUBE_LAB
    python bench/kubernetes_podstart.py --compare e911d47 --runs 6

For each run, one new Pod per spec, alternating (this tree's, then the other's), each from
creation through the API until both its servers accept connections at its address: what the
broker waits for before a tenant's first call can go on. The Pods are made with the admin's
credentials, one at a time, and deleted at once; the images are the lab's (the keeper of this
tree serves both specs). The earlier spec is `broker/runtime/kubernetes/podspec.py` as `git
show REV:` prints it, loaded beside this one. Prints p50 and max of each and their ratio.

Exit status: 0 ran, 2 could not run.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
# bench/kubernetes.py is named like the client package: this folder must not come first.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]
sys.path.insert(0, str(ROOT))

from broker.runtime.kubernetes import names  # noqa: E402
from broker.runtime.kubernetes import podspec as current  # noqa: E402
from broker.testing.kubernetes_lab import Lab, unique_tenant  # noqa: E402

NS = names.TENANTS_NAMESPACE
LIMIT_SECONDS = 60.0
Build = Callable[..., dict[str, Any]]


def spec_of(rev: str) -> Build:
    """`tenant_pod` of that revision's podspec.py (its imports resolve in this tree)."""
    source = subprocess.run(
        ["git", "-C", str(ROOT), "show", f"{rev}:broker/runtime/kubernetes/podspec.py"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    folder = Path(tempfile.mkdtemp(prefix="docbroker-podspec-"))
    path = folder / f"podspec_{rev}.py"
    path.write_text(source)
    loaded = importlib.util.spec_from_file_location(f"podspec_{rev}", path)
    assert loaded is not None and loaded.loader is not None
    module = importlib.util.module_from_spec(loaded)
    loaded.loader.exec_module(module)
    build: Build = module.tenant_pod
    return build


def accepts(ip: str, port: int) -> bool:
    try:
        with socket.create_connection((ip, port), timeout=0.2):
            return True
    except OSError:
        return False


def start_once(lab: Lab, build: Build, tenant: str) -> float:
    """Seconds from the Pod's creation until both ports accept."""
    body = build(lab.settings(), tenant, instance="bench", replica="bench")
    name = names.object_name(tenant)
    started = time.perf_counter()
    lab.core.create_namespaced_pod(NS, body)
    try:
        ip = None
        while time.perf_counter() - started < LIMIT_SECONDS:
            if ip is None:
                status = lab.core.read_namespaced_pod(name, NS).status
                ip = status.pod_ip if status is not None else None
            elif accepts(ip, names.MCP_PORT) and accepts(ip, names.KEEPER_PORT):
                return time.perf_counter() - started
            time.sleep(0.01)
        raise RuntimeError(f"a Pod did not serve within {LIMIT_SECONDS:.0f} s")
    finally:
        lab.core.delete_namespaced_pod(name, NS, grace_period_seconds=0)
        while any(p.metadata.name == name for p in lab.core.list_namespaced_pod(NS).items):
            time.sleep(0.1)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--compare", required=True, metavar="REV", help="the earlier revision")
    parser.add_argument("--runs", type=int, default=6, help="Pods per spec")
    args = parser.parse_args()
    if not os.environ.get("DOCBROKER_TEST_KUBECONFIG"):
        print("DOCBROKER_TEST_KUBECONFIG is not set: start the lab and source its env", file=sys.stderr)
        return 2
    try:
        other = spec_of(args.compare)
    except subprocess.CalledProcessError:
        print(f"{args.compare}: no podspec.py at that revision", file=sys.stderr)
        return 2
    lab = Lab.open()
    from broker.runtime.kubernetes.podspec import tenant_secret_object

    tenant = unique_tenant("q")
    lab.tenant(tenant)
    secret = tenant_secret_object(os.urandom(32), tenant, namespace=NS, instance="bench")
    lab.core.create_namespaced_secret(NS, secret)
    times: dict[str, list[float]] = {"this tree": [], args.compare: []}
    try:
        for _ in range(args.runs):
            times["this tree"].append(start_once(lab, current.tenant_pod, tenant))
            times[args.compare].append(start_once(lab, other, tenant))
    finally:
        lab.core.delete_namespaced_secret(names.object_name(tenant), NS)
        lab.drop_tenant(tenant)
    print(f"Pod creation -> both ports accept, {args.runs} Pods each, alternating")
    print(f"{'spec':<12}  {'p50':>7}  {'max':>7}")
    for label, values in times.items():
        print(f"{label:<12}  {statistics.median(values):>6.2f}s  {max(values):>6.2f}s")
    ratio = statistics.median(times[args.compare]) / statistics.median(times["this tree"])
    print(f"p50 ratio {args.compare} / this tree: {ratio:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
