"""The shipped manifests on the lab cluster: `kubectl apply -k` of the lab overlay, the brokers
as their StatefulSet of two replicas (in-cluster config, the broker image, a data volume each),
the schema migrated by the db-upgrade Job, a real MCP SDK client at a broker Pod's IP, real
tenant Pods, a PostgreSQL the Pods reach over TCP.

A run's own addresses, keys and tenant go in a small wrapper overlay in tmp_path (as
docs/kubernetes.md, "Lab", shows). The CI's PostgreSQL listens on a unix socket only, which
Pods cannot reach: the test starts a throw-away cluster of its own, EMPTY, on the address where
Pods reach the host (DOCBROKER_TEST_KUBE_HOST_IP); the apply's Job makes the schema, as on a
first install. Each replica's data volume is a local PersistentVolume in the lab's folder.
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
import pwd
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
from mcp import Client

from broker.runtime.kubernetes import names
from broker.runtime.kubernetes.client import status_of
from broker.testing import Broker, free_port, make_broker, structured
from broker.testing.kubernetes_lab import KEEPER_IMAGE, ROOT, SERVER_IMAGE, Lab, _kubectl, unique_tenant
from tests.broker.pgtest import ThrowAwayCluster
from tests.broker.support import call_modern, open_http
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


# The lab's Pods' addresses: its bridges, nothing beyond the host.
PODS = "10.244.0.0/16"


def postgres_for_pods(
    host_ip: str, *, hba: str = f"host all docbroker {PODS} trust", tls: tuple[bytes, bytes] | None = None
) -> tuple[ThrowAwayCluster, int]:
    """A throw-away PostgreSQL that also listens on TCP at `host_ip`, admitting the lab's Pods
    by the `hba` line; with `tls` (a server certificate and its key, PEM) it offers TLS."""
    cluster = ThrowAwayCluster()
    try:
        port = free_port()
        cluster.stop_server()
        with (cluster.dir / "data" / "pg_hba.conf").open("a") as f:
            f.write(hba + "\n")
        options = f"-k {cluster.dir / 'socket'} -h {host_ip} -p {port} -c fsync=off -c max_connections=200"
        if tls is not None:
            owner = pwd.getpwnam(os.environ.get("DOCBROKER_PG_USER", "docbroker"))
            for name, pem in zip(("server.crt", "server.key"), tls, strict=True):
                path = cluster.dir / name
                path.write_bytes(pem)
                path.chmod(0o600)  # PostgreSQL refuses a key others may read
                os.chown(path, owner.pw_uid, owner.pw_gid)
            crt, key = cluster.dir / "server.crt", cluster.dir / "server.key"
            options += f" -c ssl=on -c ssl_cert_file={crt} -c ssl_key_file={key}"
        cluster._pg_ctl("-l", str(cluster.dir / "postgres.log"), "-o", options, "start")
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


def broker_image() -> tuple[str, str]:
    """The broker image's name and digest, as kustomize's `images:` takes them."""
    name, _, digest = BROKER_IMAGE.partition("@")
    if not digest.startswith("sha256:"):
        pytest.fail("DOCBROKER_TEST_KUBE_BROKER_IMAGE must be name@sha256:… (source the lab's DIR/env)")
    return name, digest


def broker_settings(idp: Broker) -> dict[str, str]:
    """The brokers' config literals a run's overlay sets: its issuer, the lab's images."""
    return {
        "DOCBROKER_AUTH_ISSUER": idp.env["DOCBROKER_AUTH_ISSUER"],
        "DOCBROKER_AUTH_AUDIENCE": idp.env["DOCBROKER_AUTH_AUDIENCE"],
        "DOCBROKER_KUBE_SERVER_IMAGE": SERVER_IMAGE,
        "DOCBROKER_KUBE_KEEPER_IMAGE": KEEPER_IMAGE,
        "DOCBROKER_START_TIMEOUT": "60",
        "DOCBROKER_OPS_TOKEN_FILE": "/run/docbroker/keys/ops.token",
    }


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
    name, digest = broker_image()
    settings = broker_settings(idp)
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
OWN_KINDS = ("StatefulSet", "Deployment", "Job", "PodDisruptionBudget", "ConfigMap", "Secret")
REPLICAS = 2


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


def job_complete(lab: Lab) -> bool:
    job = lab.admin_batch.read_namespaced_job("docbroker-db-upgrade", BROKER_NS)
    assert not job.status.failed, (
        "the db-upgrade Job failed (kubectl -n docbroker logs job/docbroker-db-upgrade)"
    )
    return bool(job.status.succeeded)


def print_broker_logs(lab: Lab) -> None:
    """The broker Pods' last lines, shown by pytest only when the test failed."""
    try:
        print(_kubectl(lab.kubeconfig, "-n", BROKER_NS, "logs", "-l", BROKER_SELECTOR, "--tail=40")[-6000:])
    except AssertionError:
        pass  # no Pod (yet, or any more)


@dataclasses.dataclass
class Deployed:
    lab: Lab
    tenant: str
    storage: Path  # the tenant's sources/ and reports/
    idp: Broker
    ips: list[str]
    volumes: list[Path]  # each replica's data volume, by ordinal
    overlay: Path


@pytest.fixture
def deployed(tmp_path: Path) -> Iterator[Deployed]:
    lab = Lab.open()  # namespaces, RBAC, PSP and storage class first: the tenant PVCs need them
    with deployment_lock(lab.folder):
        yield from _deployed(lab, tmp_path)


def _deployed(lab: Lab, tmp_path: Path) -> Iterator[Deployed]:
    cluster, pg_port = postgres_for_pods(_env("DOCBROKER_TEST_KUBE_HOST_IP"))
    tenant = unique_tenant("d")
    idp = make_broker(tmp_path / "idp", tenants=[tenant])  # never started: its IdP key and JWKS
    try:
        storage = lab.tenant(tenant, {"plan.md": "# Plan\nthe deployment shares one tenant pod\n"})
        volumes = lab.broker_volumes(REPLICAS)
        write_overlay(tmp_path, idp, [tenant], pg_port)
        _kubectl(lab.kubeconfig, "apply", "-k", str(tmp_path))  # an empty database: the Job migrates it
        wait_until("the db-upgrade Job", lambda: job_complete(lab), timeout=240, every=1)
        ips = wait_until("two Ready broker Pods", lambda: ready_broker_ips(lab), timeout=240, every=1)
        yield Deployed(lab, tenant, storage, idp, ips, volumes, tmp_path)
    finally:
        print_broker_logs(lab)
        try:
            # Only what this test adds to the lab: the namespaces, RBAC, PSP and storage class
            # stay (Lab.open applies them), since the other Kubernetes tests stand on them,
            # maybe at this moment on the other worker.
            mine = [d for d in yaml.safe_load_all(_kubectl(lab.kubeconfig, "kustomize", str(tmp_path))) if d]
            mine = [d for d in mine if d["kind"] in OWN_KINDS]
            delete = ("delete", "-f", "-", "--ignore-not-found", "--wait=true", "--timeout=180s")
            _kubectl(lab.kubeconfig, *delete, stdin=yaml.safe_dump_all(mine))
        finally:
            lab.drop_broker_volumes(REPLICAS)
            lab.drop_tenant(tenant)
            cluster.remove()


async def save_approved(client: Client, approver: Broker, token: str, filename: str, content: str) -> Any:
    """save_report, approved over REST at `approver` (with its `token`), then asked again: the
    second call's structured result."""
    args = {"filename": filename, "content": content}
    waiting = structured(await client.call_tool("save_report", args))
    assert waiting["status"] == "waiting_approval", waiting
    with approver.http(token) as http:
        assert http.get(f"/v1/approvals/{waiting['data']['approval_id']}").status_code == 200
        decided = http.post(f"/v1/approvals/{waiting['data']['approval_id']}/approve")
        assert decided.status_code == 200, decided.text
    return structured(await client.call_tool("save_report", args))


def test_the_deployment_serves_a_tenant_through_both_replicas(deployed: Deployed) -> None:
    lab, tenant, storage, idp, ips = (
        deployed.lab,
        deployed.tenant,
        deployed.storage,
        deployed.idp,
        deployed.ips,
    )
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
            # the OTHER replica decides: approvals are shared
            saved = await save_approved(client, b, approver, "findings.md", REPORT)
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


def audit_public_key(folder: Path) -> Path:
    """The PEM public half of the run's audit signing key (write_overlay's, in every Pod)."""
    key = serialization.load_pem_private_key((folder / "audit-signing.key").read_bytes(), password=None)
    public = folder / "audit-signing.pub.pem"
    public.write_bytes(
        key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )
    return public


def audit_lines(text: str) -> list[bytes]:
    """The audit lines among a container's log lines (its own logs are plain text)."""
    found = []
    for line in text.splitlines():
        with contextlib.suppress(ValueError):
            record = json.loads(line)
            if isinstance(record, dict) and "seq" in record and "event" in record:
                found.append(line.encode())
    return found


def replica_files(volume: Path, replica: str) -> list[Path]:
    data = volume / "data"
    return [*sorted(data.glob(f"audit-{replica}.jsonl.*")), data / f"audit-{replica}.jsonl"]


def test_a_broker_pod_deleted_under_load_loses_no_audit_line(deployed: Deployed) -> None:
    """docs/kubernetes.md, "Audit on a cluster": each replica's chain is on a volume of its own
    that outlives the Pod. A broker Pod deleted while calls are served on it comes back under
    its name, on its volume, and goes on with its chain: every audit line the deleted Pod wrote
    (its stdout, followed while it ran) is in the replica's files afterwards, and the files
    verify as one chain. (With the old emptyDir they went with the Pod.)"""
    lab, idp = deployed.lab, deployed.idp
    victim = "docbroker-broker-0"
    pod = lab.core.read_namespaced_pod(victim, BROKER_NS)
    old_uid, ip = pod.metadata.uid, pod.status.pod_ip
    broker = dataclasses.replace(idp, url=f"http://{ip}:8000")
    token = broker.token(deployed.tenant, subject="alice", scope="docs:read")
    follow = subprocess.Popen(  # the Pod's stdout, to its end: the lines it wrote
        [
            "kubectl",
            "--kubeconfig",
            str(lab.kubeconfig),
            "-n",
            BROKER_NS,
            "logs",
            "-f",
            victim,
            "-c",
            "broker",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    answered = 0
    deleting = False
    try:
        with open_http(broker, token) as http:
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline:
                try:
                    reply = call_modern(http, "search_documents", {"query": "tenant pod"})
                except httpx2.TransportError:
                    if deleting:
                        break  # the Pod is gone: the load on it ends
                    raise
                if reply.status_code == 200:
                    answered += 1
                elif deleting:
                    break  # shutting down: 503
                if answered == 40 and not deleting:  # mid-load: calls keep coming while it stops
                    _kubectl(lab.kubeconfig, "-n", BROKER_NS, "delete", "pod", victim, "--wait=false")
                    deleting = True
        written = audit_lines(follow.communicate(timeout=120)[0])
    finally:
        if follow.poll() is None:
            follow.kill()
    assert answered >= 40 and deleting

    def back() -> bool:  # the same name, a new Pod, Ready, on the same volume
        try:
            now = lab.core.read_namespaced_pod(victim, BROKER_NS)
        except Exception as exc:
            if status_of(exc) == 404:  # the old Pod gone, its replacement not made yet (CI saw it)
                return False
            raise
        statuses = now.status.container_statuses or []
        return now.metadata.uid != old_uid and bool(statuses) and all(c.ready for c in statuses)

    wait_until("the replica back under its name", back, timeout=240, every=1)
    again = dataclasses.replace(
        idp, url=f"http://{lab.core.read_namespaced_pod(victim, BROKER_NS).status.pod_ip}:8000"
    )
    with open_http(again, token) as http:  # the new Pod's first call: its lines follow the old Pod's
        assert call_modern(http, "search_documents", {"query": "tenant pod"}).status_code == 200
    files = replica_files(deployed.volumes[0], victim)
    kept = {line for path in files if path.exists() for line in path.read_bytes().splitlines()}
    assert len(written) > 40  # the calls' lines, and the checkpoints
    missing = [line for line in written if line not in kept]
    assert missing == [], f"{len(missing)} of {len(written)} audit lines the deleted Pod wrote are gone"
    # one chain across both Pods: the new one went on from the deleted one's last line
    public = audit_public_key(deployed.overlay)
    verified = subprocess.run(
        [sys.executable, "-m", "broker", "audit", "verify", "--json", "--key", str(public), *map(str, files)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert verified.returncode == 0, verified.stdout[-3000:] + verified.stderr[-2000:]
    seqs = [json.loads(line)["seq"] for path in files for line in path.read_bytes().splitlines()]
    assert seqs == list(range(1, len(seqs) + 1))
    assert max(seqs) > max(json.loads(line)["seq"] for line in written)  # the new Pod wrote on
