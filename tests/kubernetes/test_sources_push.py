"""`docbroker tenant sources push TENANT DIR` on the live lab cluster (issue 29 item 2).

The command runs as an operator would run it (a subprocess with the admin's kubeconfig: the
broker's ServiceAccount has no pods/exec). What a real tenant Pod then serves is read through
MCP (read_document, search_documents) with the Kubernetes backend, as the broker would; a
second push with another set replaces the first while that Pod runs; folders that break a rule
are refused in one line before anything is created on the cluster; no push Pod outlives a push.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import httpx2
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from broker.runtime.base import SourcesBusy
from broker.runtime.kubernetes import KubernetesBackend, names
from broker.runtime.kubernetes.push import PUSH_COMPONENT, collect, push, push_pod
from broker.runtime.podsecurity import check_pod_spec
from broker.settings import KubernetesSettings
from broker.testing.kubernetes_lab import KEEPER_IMAGE, MASTER, SERVER_IMAGE, Lab, unique_tenant
from broker.types import SandboxSpec
from server.contracts import MAX_DOCUMENT_BYTES, MAX_SCAN_ENTRIES
from tests.kubernetes.conftest import wait_until

pytestmark = pytest.mark.kubernetes
ROOT = Path(__file__).resolve().parents[2]
NS = names.TENANTS_NAMESPACE


def run_push(
    lab: Lab, tenant: str, folder: Path, kubeconfig: Path | None = None
) -> subprocess.CompletedProcess[str]:
    env = {
        "PATH": os.environ["PATH"],
        "PYTHONPATH": str(ROOT),
        "DOCBROKER_KUBECONFIG": str(kubeconfig or lab.kubeconfig),
        "DOCBROKER_KUBE_KEEPER_IMAGE": KEEPER_IMAGE,
        "DOCBROKER_KUBE_SERVER_IMAGE": SERVER_IMAGE,  # both by digest, as the broker's own settings
        "DOCBROKER_KUBE_IMAGE_PULL_POLICY": "Never",
    }
    return subprocess.run(
        [sys.executable, "-m", "broker", "tenant", "sources", "push", tenant, str(folder), "--json"],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        cwd=ROOT,
    )


def push_pods(lab: Lab, tenant: str) -> list[str]:
    selector = f"{names.COMPONENT}={PUSH_COMPONENT},{names.TENANT}={tenant}"
    return [p.metadata.name for p in lab.core.list_namespaced_pod(NS, label_selector=selector).items]


def folder(base: Path, files: dict[str, str]) -> Path:
    base.mkdir()
    for name, text in files.items():
        (base / name).write_text(text)
    return base


async def served(
    lab: Lab, backend: KubernetesBackend, tenant: str, reads: list[str], query: str
) -> dict[str, Any]:
    info = await backend.create(
        SandboxSpec(
            tenant=tenant, docs_root="/nonexistent", secret_file="/nonexistent", run_dir="/nonexistent"
        )
    )
    assert info.endpoint is not None and info.endpoint.token is not None
    headers = {"Authorization": f"Bearer {info.endpoint.token}"}
    async with httpx2.AsyncClient(timeout=20, headers=headers) as http:
        async with Client(streamable_http_client(info.endpoint.url, http_client=http)) as client:
            result: dict[str, Any] = {}
            for name in reads:
                read = await client.call_tool("read_document", {"filename": name})
                result[name] = read.structured_content
            search = await client.call_tool("search_documents", {"query": query})
            result["search"] = search.structured_content
    return result


def test_push_replaces_the_sources_a_tenant_pod_serves(lab: Lab, tenant: str, tmp_path: Path) -> None:
    first = folder(tmp_path / "one", {"alpha.md": "# Alpha\npushed-one marker\n", "beta.md": "# Beta\nb\n"})
    done = run_push(lab, tenant, first)
    assert done.returncode == 0, done.stderr
    assert '"documents": 2' in done.stdout and '"removed": 1' in done.stdout  # notes.md went
    assert '"push_pods": 1' in done.stdout  # a ReadOnlyMany claim: one Pod, one answer
    assert push_pods(lab, tenant) == []

    async def run() -> tuple[dict[str, Any], dict[str, Any]]:
        backend = await KubernetesBackend.connect(lab.settings(), MASTER, replica_id="r1", start_timeout=60.0)
        try:
            before = await served(lab, backend, tenant, ["alpha.md", "beta.md", "notes.md"], "pushed-one")
            # The second push while the tenant Pod runs and serves the volume read-only.
            second = folder(tmp_path / "two", {"gamma.md": "# Gamma\npushed-two marker\n"})
            again = await asyncio.to_thread(run_push, lab, tenant, second)
            assert again.returncode == 0, again.stderr
            assert '"documents": 1' in again.stdout and '"removed": 2' in again.stdout
            after = await served(lab, backend, tenant, ["gamma.md", "alpha.md", "beta.md"], "pushed-two")
            return before, after
        finally:
            await backend.close()

    before, after = asyncio.run(run())
    assert before["alpha.md"]["status"] == "ok" and "pushed-one marker" in str(before["alpha.md"])
    assert before["beta.md"]["status"] == "ok"
    assert before["notes.md"]["status"] != "ok" and "not found" in str(before["notes.md"])
    assert "alpha.md" in str(before["search"])
    assert after["gamma.md"]["status"] == "ok" and "pushed-two marker" in str(after["gamma.md"])
    assert "not found" in str(after["alpha.md"]) and "not found" in str(after["beta.md"])
    assert "gamma.md" in str(after["search"])
    assert push_pods(lab, tenant) == []
    # Nothing of the staging folder is left on the volume.
    assert sorted(os.listdir(lab.folder / "k8sbackend-volumes" / tenant / "sources")) == ["gamma.md"]


def _bad_folders(tmp_path: Path) -> dict[str, Path]:
    bad: dict[str, Path] = {}
    bad["name"] = folder(tmp_path / "name", {"ok.md": "x", "bad name.md": "x"})
    bad["extension"] = folder(tmp_path / "extension", {"notes.txt": "x"})
    link = folder(tmp_path / "link", {"ok.md": "x"})
    (link / "evil.md").symlink_to("/etc/passwd")
    bad["symlink"] = link
    fifo = folder(tmp_path / "fifo", {})
    os.mkfifo(fifo / "pipe.md")
    bad["fifo"] = fifo
    sub = folder(tmp_path / "sub", {})
    (sub / "nested.md").mkdir()
    bad["folder"] = sub
    bad["size"] = folder(tmp_path / "size", {"big.md": "x" * (MAX_DOCUMENT_BYTES + 1)})
    bad["count"] = folder(tmp_path / "count", {f"d{i}.md": "x" for i in range(MAX_SCAN_ENTRIES + 1)})
    utf = folder(tmp_path / "utf8", {})
    (utf / "latin.md").write_bytes(b"caf\xe9\n")
    bad["utf8"] = utf
    bad["missing"] = tmp_path / "missing"
    return bad


def test_a_folder_that_breaks_a_rule_is_refused_before_the_cluster(
    lab: Lab, tenant: str, tmp_path: Path
) -> None:
    bad = _bad_folders(tmp_path)
    for what, path in bad.items():
        done = run_push(lab, tenant, path)
        assert done.returncode == 2, (what, done.returncode, done.stderr)
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1 and "refused" in lines[0] and "Traceback" not in done.stderr, (
            what,
            done.stderr,
        )
        assert "evil" not in lines[0] and "bad name" not in lines[0]  # rules, never names
        assert done.stdout == ""
        assert push_pods(lab, tenant) == []
    # Before the cluster, not merely before a Pod: an unusable kubeconfig is never reached.
    nowhere = run_push(lab, tenant, bad["symlink"], kubeconfig=tmp_path / "none")
    assert nowhere.returncode == 2 and "refused" in nowhere.stderr
    # The sources are as they were.
    assert sorted(os.listdir(lab.folder / "k8sbackend-volumes" / tenant / "sources")) == ["notes.md"]


def test_a_push_to_a_tenant_without_a_sources_pvc_fails_in_one_line(lab: Lab, tmp_path: Path) -> None:
    done = run_push(lab, unique_tenant("p"), folder(tmp_path / "one", {"a.md": "x"}))
    assert done.returncode == 1
    assert done.stderr.count("\n") == 1 and "no sources PVC" in done.stderr


def test_a_push_that_fails_in_the_pod_fails_in_one_line_and_removes_the_pod(
    lab: Lab, tenant: str, tmp_path: Path
) -> None:
    # A folder on the volume where a document must go: the receiver's rename fails (EISDIR).
    blocker = lab.folder / "k8sbackend-volumes" / tenant / "sources" / "alpha.md"
    (blocker / "inside").mkdir(parents=True)
    done = run_push(lab, tenant, folder(tmp_path / "one", {"alpha.md": "x"}))
    assert done.returncode == 1, done.stderr
    assert done.stderr.count("\n") == 1 and "receiver failed" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr
    assert push_pods(lab, tenant) == []  # deleted by the same `finally` as Ctrl-C's
    assert "notes.md" in os.listdir(blocker.parent)  # nothing was removed before the failure


def test_the_push_pod_is_restricted() -> None:
    settings = KubernetesSettings(namespace=NS, keeper_image=KEEPER_IMAGE)
    pod = push_pod(settings, "acme", instance="default", suffix="abc123")
    assert check_pod_spec(pod["spec"], metadata=pod["metadata"], tenant=True) == []
    assert pod["metadata"]["labels"][names.COMPONENT] != "sandbox"  # never adopted as a tenant Pod
    (volume,) = pod["spec"]["volumes"]
    assert volume["persistentVolumeClaim"]["claimName"] == names.sources_claim("acme")


def test_push_on_a_read_write_once_claim_takes_turns_with_the_tenant_pod(lab: Lab, tmp_path: Path) -> None:
    """Block storage (EBS, Azure Disk, PD) has no ReadOnlyMany: one ReadWriteOnce claim, mounted
    read-only by the tenant's Pod and read-write by the push Pod, never both at once. The push
    stops the tenant's Pod before its own mounts the claim, a broker starts none while the push
    Pod exists (503, `sources_push`), and the next call after the push starts one on the new set."""
    tenant = unique_tenant("rwo")
    lab.tenant(tenant, sources_access_mode="ReadWriteOnce")
    selector = f"{names.TENANT}={tenant}"
    seen: list[tuple[bool, bool]] = []  # (a tenant Pod, a push Pod) at each look
    stop = threading.Event()

    def watch() -> None:
        while not stop.is_set():
            pods = lab.core.list_namespaced_pod(NS, label_selector=selector).items
            kinds = {p.metadata.labels.get(names.COMPONENT) for p in pods}
            seen.append(("sandbox" in kinds, PUSH_COMPONENT in kinds))
            stop.wait(0.05)  # a poll paced until the test says stop

    async def run() -> tuple[dict[str, Any], subprocess.CompletedProcess[str], str, dict[str, Any]]:
        settings = lab.settings(sources_access_mode="ReadWriteOnce")
        backend = await KubernetesBackend.connect(settings, MASTER, replica_id="r1", start_timeout=60.0)
        try:
            before = await served(lab, backend, tenant, ["notes.md"], "cluster")
            pushing = asyncio.create_task(
                asyncio.to_thread(
                    run_push, lab, tenant, folder(tmp_path / "new", {"delta.md": "# Delta\nrwo marker\n"})
                )
            )
            await asyncio.to_thread(wait_until, "the push Pod", lambda: push_pods(lab, tenant), 120, 0.1)
            with pytest.raises(SourcesBusy) as busy:
                await served(lab, backend, tenant, ["notes.md"], "cluster")
            done = await pushing
            after = await served(lab, backend, tenant, ["delta.md"], "rwo")
            return before, done, busy.value.reason, after
        finally:
            await backend.close()

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        before, done, reason, after = asyncio.run(run())
    finally:
        stop.set()
        watcher.join(timeout=10)
        lab.drop_tenant(tenant)
    assert before["notes.md"]["status"] == "ok"
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["tenant_pods_stopped"] == 1
    assert reason == "sources_push"
    assert after["delta.md"]["status"] == "ok" and "rwo marker" in str(after["delta.md"])
    assert (True, True) not in seen, "a tenant Pod and a push Pod were there at once"
    assert (False, True) in seen and (True, False) in seen  # the watch saw both turns


def bystander(lab: Lab, tenant: str) -> str:
    """A Pod that is not the tenant's (the push does not stop it) holding the sources claim
    mounted read-only: the kubelet gives a volume its fsGroup only on a mount no other Pod's
    shares, so the push Pod's mount of it gets none and the volume's root stays root's 0755."""
    pod = push_pod(lab.settings(), tenant, instance="bystander", suffix="by")
    pod["metadata"]["name"] = f"{names.object_name(tenant)}-bystander"
    pod["metadata"]["labels"] = {"docbroker.io/test": "bystander", names.TENANT: tenant}
    pod["spec"]["containers"][0]["volumeMounts"][0]["readOnly"] = True
    pod["spec"]["volumes"][0]["persistentVolumeClaim"]["readOnly"] = True
    lab.core.create_namespaced_pod(NS, pod)
    name = str(pod["metadata"]["name"])
    wait_until(
        "the bystander Pod running", lambda: lab.core.read_namespaced_pod(name, NS).status.phase == "Running"
    )
    return name


def delete_and_wait(lab: Lab, name: str) -> None:
    """Gracefully: the API keeps the Pod until the kubelet has unmounted its volumes."""
    lab.core.delete_namespaced_pod(name, NS)

    def gone() -> bool:
        return not [p for p in lab.core.list_namespaced_pod(NS).items if p.metadata.name == name]

    wait_until(f"{name} gone", gone, 60, 0.1)


def test_a_volume_the_push_pod_cannot_write_is_one_line_after_a_second_pod(lab: Lab, tmp_path: Path) -> None:
    """The volume's root did not get the push Pod's fsGroup (another Pod had the claim mounted):
    one line naming that, not a receiver's traceback counted in bytes; on a ReadWriteOnce claim
    a second push Pod first (the cause may be a tenant Pod's mount going away), never a third,
    and none left behind. Nothing on the volume changed."""
    tenant = unique_tenant("nw")
    sources = lab.tenant(tenant, sources_access_mode="ReadWriteOnce") / "sources"
    held = bystander(lab, tenant)
    made: set[str] = set()
    stop = threading.Event()

    def watch() -> None:
        while not stop.is_set():
            made.update(push_pods(lab, tenant))
            stop.wait(0.1)  # a poll paced until the test says stop

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        done = run_push(lab, tenant, folder(tmp_path / "new", {"delta.md": "# Delta\n"}))
        left, after = push_pods(lab, tenant), os.listdir(sources)
    finally:
        stop.set()
        watcher.join(timeout=10)
        delete_and_wait(lab, held)
        lab.drop_tenant(tenant)
    assert done.returncode == 1, done.stderr
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr, done.stderr
    assert "not writable by the push Pod's group" in done.stderr and "fsGroup" in done.stderr, done.stderr
    assert len(made) == 2, made  # the second Pod, and no third
    assert left == [] and after == ["notes.md"]


def test_a_second_push_pod_writes_once_the_volume_is_its_alone(lab: Lab, tmp_path: Path) -> None:
    """The retry's other side: the Pod holding the claim goes while the first push Pod is
    running (its mount made beside it, so without the fsGroup); the second push Pod mounts the
    claim alone, gets the fsGroup, and writes the set."""
    tenant = unique_tenant("nw")
    sources = lab.tenant(tenant, sources_access_mode="ReadWriteOnce") / "sources"
    held = bystander(lab, tenant)
    pods: list[str] = []
    held_gone = threading.Event()

    def first_running_then_alone(name: str) -> None:
        pods.append(name)
        if len(pods) == 1:  # the first push Pod's mount is made beside the bystander's; then it goes
            wait_until(
                "the first push Pod running",
                lambda: lab.core.read_namespaced_pod(name, NS).status.phase == "Running",
            )
            delete_and_wait(lab, held)
            held_gone.set()

    new = collect(folder(tmp_path / "new", {"delta.md": "# Delta\nalone marker\n"}))
    try:
        answer = push(
            lab.admin,
            lab.settings(sources_access_mode="ReadWriteOnce"),
            tenant,
            new,
            instance="default",
            timeout=60,
            on_pod=first_running_then_alone,
        )
        written = sorted(os.listdir(sources))
    finally:
        if not held_gone.is_set():  # the push failed before the callback let it go
            delete_and_wait(lab, held)
        lab.drop_tenant(tenant)
    assert len(pods) == 2 and answer["attempts"] == 2, (pods, answer)  # the race was entered
    assert answer["ok"] is True and answer["files"] == 1 and answer["removed"] == 1
    assert written == ["delta.md"]
