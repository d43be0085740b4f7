"""The shipped manifests on the lab cluster: `kubectl apply -k` of the lab overlay, the broker
as its Deployment of two replicas (in-cluster config, the broker image), a real MCP SDK client
at a broker Pod's IP, real tenant Pods, a PostgreSQL the Pods reach over TCP.

A run's own addresses, keys and tenant go in a small wrapper overlay in tmp_path (as
docs/kubernetes.md, "Lab", shows). The CI's PostgreSQL listens on a unix socket only, which
Pods cannot reach: the test starts a throw-away cluster of its own on the address where Pods
reach the host (DOCBROKER_TEST_KUBE_HOST_IP) and runs `docbroker db upgrade` from the host.
The broker image comes from DOCBROKER_TEST_KUBE_BROKER_IMAGE (default the one `.ci` builds and
`.ci/kube-lab.sh start` imports).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import fcntl
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import httpx2
import pytest
import yaml
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from broker.runtime.kubernetes import names
from broker.testing import Broker, free_port, make_broker, structured
from broker.testing.kubernetes_lab import KEEPER_IMAGE, ROOT, SERVER_IMAGE, Lab, _kubectl, unique_tenant
from tests.broker.pgtest import ThrowAwayCluster
from tests.kubernetes.conftest import wait_until

pytestmark = [pytest.mark.kubernetes, pytest.mark.timeout(600)]
# By digest, as the lab's DIR/env names it (.ci/kube-lab.sh load-image): the production overlay
# pins the broker's own image so, and this run does the same through kustomize's `images:`.
BROKER_IMAGE = os.environ.get("DOCBROKER_TEST_KUBE_BROKER_IMAGE", "docbroker-broker:latest")
BROKER_NS = names.BROKER_NAMESPACE
TENANTS_NS = names.TENANTS_NAMESPACE
BROKER_SELECTOR = "app.kubernetes.io/name=docbroker-broker"
REPORT = "# Findings\n\nApproved on one replica, saved through the other.\n"


def _env(name: str) -> str:
    value = os.environ.get(name, "").strip()
    if not value:
        pytest.fail(f"{name} is not set (source the lab's DIR/env)", pytrace=False)
    return value


INSECURE_DATABASE = {"DOCBROKER_DATABASE_ALLOW_INSECURE_TRANSPORT": "1"}


def postgres_for_pods(host_ip: str) -> tuple[ThrowAwayCluster, int]:
    """A throw-away PostgreSQL that also listens on TCP at `host_ip` and trusts the lab's Pods."""
    cluster = ThrowAwayCluster()
    try:
        port = free_port()
        cluster.stop_server()
        hba = cluster.dir / "data" / "pg_hba.conf"
        with hba.open("a") as f:  # the Pods' addresses: the lab's bridges, nothing beyond the host
            f.write("host all docbroker 10.244.0.0/16 trust\n")
        cluster._pg_ctl(
            "-l",
            str(cluster.dir / "postgres.log"),
            "-o",
            f"-k {cluster.dir / 'socket'} -h {host_ip} -p {port} -c fsync=off -c max_connections=200",
            "start",
        )
        cluster.url = f"{cluster.url}&port={port}"
    except BaseException:
        cluster.remove()
        raise
    return cluster, port


def upgrade_database(idp: Broker, url: str) -> None:
    """`docbroker db upgrade` on the lab's PostgreSQL (TCP on the host's bridge, without TLS)."""
    upgraded = subprocess.run(
        [sys.executable, "-m", "broker", "db", "upgrade"],
        cwd=ROOT,
        env={**idp.env, "DOCBROKER_DATABASE_URL": url, **INSECURE_DATABASE},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert upgraded.returncode == 0, upgraded.stderr[-2000:]


def write_overlay(
    folder: Path, idp: Broker, tenants: Sequence[str], pg_port: int, config: Mapping[str, str] | None = None
) -> None:
    """The wrapper overlay: the lab overlay plus this run's addresses, image, keys and tenants
    (and `config`: settings of the broker, over the ones given here)."""
    master = folder / "master.key"
    master.write_text(os.urandom(32).hex())
    audit = folder / "audit-signing.key"
    audit.write_bytes(
        Ed25519PrivateKey.generate().private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    (folder / "ops.token").write_text(idp.ops_token + "\n")
    for tenant in tenants:
        (folder / f"{tenant}.toml").write_text("[limits]\nrate_per_minute = 100000\nburst = 10000\n")
    name, _, digest = BROKER_IMAGE.partition("@")
    if not digest.startswith("sha256:"):
        pytest.fail("DOCBROKER_TEST_KUBE_BROKER_IMAGE must be name@sha256:… (source the lab's DIR/env)")
    settings = {
        "DOCBROKER_AUTH_ISSUER": idp.env["DOCBROKER_AUTH_ISSUER"],
        "DOCBROKER_AUTH_AUDIENCE": idp.env["DOCBROKER_AUTH_AUDIENCE"],
        "DOCBROKER_KUBE_SERVER_IMAGE": SERVER_IMAGE,
        "DOCBROKER_KUBE_KEEPER_IMAGE": KEEPER_IMAGE,
        "DOCBROKER_START_TIMEOUT": "60",
        "DOCBROKER_OPS_TOKEN_FILE": "/run/docbroker/keys/ops.token",
    }
    settings.update(config or {})
    kustomization = {
        "apiVersion": "kustomize.config.k8s.io/v1beta1",
        "kind": "Kustomization",
        "resources": [os.path.relpath(ROOT / "k8s" / "overlays" / "lab", folder)],
        "images": [{"name": "docbroker-broker", "newName": name, "digest": digest}],
        "configMapGenerator": [
            {
                "name": "docbroker-lab",
                "namespace": BROKER_NS,
                "behavior": "merge",
                "literals": [
                    f"node-ip={_env('DOCBROKER_TEST_KUBE_NODE_IP')}",
                    f"postgres-host={_env('DOCBROKER_TEST_KUBE_HOST_IP')}",
                    f"postgres-port={pg_port}",
                    "postgres-db=docbroker_test",
                ],
            },
            {
                "name": "docbroker-config",
                "namespace": BROKER_NS,
                "behavior": "merge",
                "literals": [f"{k}={v}" for k, v in settings.items()],
            },
            {
                "name": "docbroker-tenant-policies",
                "namespace": BROKER_NS,
                "behavior": "merge",
                "files": [f"{tenant}.toml" for tenant in tenants],
            },
        ],
        "secretGenerator": [
            {
                "name": "docbroker-keys",
                "namespace": BROKER_NS,
                "files": [master.name, audit.name, "ops.token", "jwks.json=idp/jwks.json"],
                "options": {"disableNameSuffixHash": True},
            }
        ],
    }
    (folder / "kustomization.yaml").write_text(yaml.safe_dump(kustomization))


def ready_broker_ips(lab: Lab) -> list[str]:
    """The pod IPs of the Deployment's Pods once both of them are Ready (empty until then)."""
    pods = lab.core.list_namespaced_pod(BROKER_NS, label_selector=BROKER_SELECTOR).items
    ready = [
        p.status.pod_ip
        for p in pods
        if p.metadata.deletion_timestamp is None
        and p.status.container_statuses
        and all(c.ready for c in p.status.container_statuses)
    ]
    return sorted(ready) if len(ready) == 2 else []


def readyz(ip: str, ops: Broker) -> dict[str, Any] | None:
    try:
        answer = httpx2.get(f"http://{ip}:8000/readyz", headers=ops.ops_headers, timeout=5)
    except httpx2.TransportError:
        return None
    return dict(answer.json()) if answer.status_code == 200 else None


# What the Deployment test applies beyond what Lab.open() applies for every Kubernetes test.
OWN_KINDS = ("Deployment", "PodDisruptionBudget", "ConfigMap", "Secret")


@contextlib.contextmanager
def deployment_lock(lab_folder: Path) -> Iterator[None]:
    """One Deployment of the broker on the lab at a time: its name and namespace are the lab's
    one (tests/reliability/test_lab_run.py deploys it too, maybe at once on the other worker)."""
    with (lab_folder / "broker-deployment.lock").open("a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


@pytest.fixture
def deployed(tmp_path: Path) -> Iterator[tuple[Lab, str, Path, Broker, list[str]]]:
    lab = Lab.open()  # namespaces, RBAC, PSP and storage class first: the tenant PVCs need them
    with deployment_lock(lab.folder):
        yield from _deployed(lab, tmp_path)


def _deployed(lab: Lab, tmp_path: Path) -> Iterator[tuple[Lab, str, Path, Broker, list[str]]]:
    cluster, pg_port = postgres_for_pods(_env("DOCBROKER_TEST_KUBE_HOST_IP"))
    tenant = unique_tenant("d")
    idp = make_broker(tmp_path / "idp", tenants=[tenant])  # never started: its IdP key and JWKS
    try:
        upgrade_database(idp, cluster.url)
        storage = lab.tenant(tenant, {"plan.md": "# Plan\nthe deployment shares one tenant pod\n"})
        write_overlay(tmp_path, idp, [tenant], pg_port)
        _kubectl(lab.kubeconfig, "apply", "-k", str(tmp_path))
        ips = wait_until("two Ready broker Pods", lambda: ready_broker_ips(lab), timeout=240, every=1)
        yield lab, tenant, storage, idp, ips
    finally:
        try:
            logs = _kubectl(lab.kubeconfig, "-n", BROKER_NS, "logs", "-l", BROKER_SELECTOR, "--tail=40")
            print(logs[-6000:])  # shown by pytest only when the test failed
        except AssertionError:
            pass
        try:
            # Only what this test adds to the lab: the namespaces, RBAC, PSP and storage class
            # stay (Lab.open applies them), since the other Kubernetes tests stand on them,
            # maybe at this moment on the other worker.
            mine = [d for d in yaml.safe_load_all(_kubectl(lab.kubeconfig, "kustomize", str(tmp_path))) if d]
            mine = [d for d in mine if d["kind"] in OWN_KINDS]
            delete = ("delete", "-f", "-", "--ignore-not-found", "--wait=true", "--timeout=180s")
            _kubectl(lab.kubeconfig, *delete, stdin=yaml.safe_dump_all(mine))
        finally:
            lab.drop_tenant(tenant)
            cluster.remove()


def test_the_deployment_serves_a_tenant_through_both_replicas(
    deployed: tuple[Lab, str, Path, Broker, list[str]],
) -> None:
    lab, tenant, storage, idp, ips = deployed
    started = time.monotonic()
    checks = {ip: wait_until(f"/readyz of {ip}", lambda ip=ip: readyz(ip, idp), timeout=60) for ip in ips}
    a, b = (dataclasses.replace(idp, url=f"http://{ip}:8000") for ip in ips)
    writer = a.token(tenant, subject="alice", scope="docs:read docs:write")
    approver = b.token(tenant, subject="bob", scope="reports:approve")
    reader = b.token(tenant, subject="carol", scope="docs:read")

    async def run() -> dict[str, dict[str, Any]]:
        async with a.client(writer) as client:
            found = structured(await client.call_tool("search_documents", {"query": "tenant pod"}))
            read = structured(await client.call_tool("read_document", {"filename": "plan.md"}))
            args = {"filename": "findings.md", "content": REPORT}
            waiting = structured(await client.call_tool("save_report", args))
            assert waiting["status"] == "waiting_approval", waiting
            with b.http(approver) as http:  # the OTHER replica decides: approvals are shared
                assert http.get(f"/v1/approvals/{waiting['data']['approval_id']}").status_code == 200
                decided = http.post(f"/v1/approvals/{waiting['data']['approval_id']}/approve")
                assert decided.status_code == 200, decided.text
            saved = structured(await client.call_tool("save_report", args))
        async with b.client(reader) as client:
            other = structured(await client.call_tool("search_documents", {"query": "tenant pod"}))
        return {"found": found, "read": read, "saved": saved, "other": other}

    facts = asyncio.run(run())
    pods = lab.core.list_namespaced_pod(TENANTS_NS, label_selector=f"{names.TENANT}={tenant}").items
    print(f"mcp through the deployment: {time.monotonic() - started:.1f}s")
    for check in checks.values():
        assert check["checks"]["sandboxes"]["backend"] == "kubernetes", json.dumps(check)
    assert facts["found"]["status"] == "ok" and "plan.md" in str(facts["found"]["data"])
    assert facts["read"]["status"] == "ok" and "one tenant pod" in str(facts["read"]["data"])
    assert facts["saved"]["status"] == "ok", facts["saved"]
    assert facts["other"]["status"] == "ok" and "plan.md" in str(facts["other"]["data"])
    # exactly the approved bytes, in the reports PVC (the keeper's volume on the node)
    assert (storage / "reports" / "findings.md").read_bytes() == REPORT.encode()
    # both replicas used the one tenant Pod: whichever started it, the other adopted it
    assert [p.metadata.name for p in pods] == [names.object_name(tenant)]
    assert pods[0].metadata.labels[names.TENANT] == tenant
