"""Tenant Pods name their images by digest, on the live lab (issue 27 item 6; DESIGN §13).

The settings refuse a tag for DOCBROKER_KUBE_*_IMAGE (test_backend_spec.py); here the broker's
own Pod spec check is shown to hold when a tag reaches it anyway (settings built in code, as a
future setting or a bug could): refused before anything is sent, audited `sandbox.failed` with
`image_untrusted`, no Pod and no Secret on the cluster. And the digest form really runs: the
node's containerd resolves `name@sha256:…` (the lab's `load-image` gives it the digest name, as
a registry pull would) and the Pod's status names that digest.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from broker.audit import AuditLog
from broker.audit import fields as audit_fields
from broker.runtime.base import ImageUntrusted
from broker.runtime.kubernetes import KubernetesBackend, names
from broker.runtime.lifecycle import Runtime
from broker.settings import AuditSettings
from broker.testing.kubernetes_lab import KEEPER_IMAGE, MASTER, SERVER_IMAGE, Lab
from broker.types import SandboxSpec

pytestmark = pytest.mark.kubernetes
NS = names.TENANTS_NAMESPACE


def spec(tenant: str) -> SandboxSpec:
    # The Kubernetes backend uses the tenant only; the host paths are the Docker runtime's.
    return SandboxSpec(
        tenant=tenant, docs_root="/nonexistent", secret_file="/nonexistent", run_dir="/nonexistent"
    )


async def start_through_the_runtime(
    lab: Lab,
    tenant: str,
    audit_path: Path,
    *,
    seen: dict[str, Any] | None = None,
    overrides: dict[str, str] | None = None,
) -> str:
    """The tenant's sandbox as the broker starts it: Runtime → KubernetesBackend, its events
    written by a real audit log as the app writes them; the live Pod read into `seen` while it
    runs. The outcome: "ok", or the refusal's class and message."""
    audit = await AuditLog.open(AuditSettings(path=audit_path, key_file=None, witness_file=None))
    backend = await KubernetesBackend.connect(
        lab.settings(**(overrides or {})), MASTER, replica_id="r1", start_timeout=60.0
    )

    async def on_event(event: str, who: str, sandbox: str, details: dict[str, Any]) -> None:
        await audit.emit(event, **audit_fields.sandbox_event(event, who, sandbox, details))

    runtime = Runtime(backend, spec, max_sandboxes=4, idle_timeout=600, start_timeout=60, on_event=on_event)
    try:
        await runtime.ensure(tenant)
        if seen is not None:
            pod = lab.pod(tenant)
            seen["containers"] = [{"name": c.name, "image": c.image} for c in pod.spec.containers]
            seen["image_ids"] = {c.name: c.image_id for c in pod.status.container_statuses}
        return "ok"
    except ImageUntrusted as exc:
        return f"{type(exc).__name__}: {exc}"
    finally:
        await runtime.close()  # stops what it started
        await audit.close()


def events(path: Path, event: str) -> list[dict[str, Any]]:
    lines = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [e for e in lines if e.get("event") == event]


@pytest.mark.parametrize("which", ["server_image", "keeper_image"])
def test_a_tenant_pod_spec_with_a_tag_is_refused_audited_and_nothing_created(
    lab: Lab, tenant: str, tmp_path: Path, which: str
) -> None:
    tag = {"server_image": "docbroker-server:latest", "keeper_image": "docbroker-broker:latest"}[which]
    audit_path = tmp_path / "audit.jsonl"
    outcome = asyncio.run(start_through_the_runtime(lab, tenant, audit_path, overrides={which: tag}))
    assert outcome == "ImageUntrusted: the tenant's pod would name its image by a tag, not by digest"
    failed = events(audit_path, "sandbox.failed")
    assert [(e["tenant"], e["reason"], e["outcome"]) for e in failed] == [
        (tenant, "image_untrusted", "error")
    ]
    assert events(audit_path, "sandbox.started") == []
    selector = f"{names.TENANT}={tenant}"
    assert lab.core.list_namespaced_pod(NS, label_selector=selector).items == []
    assert lab.core.list_namespaced_secret(NS, label_selector=selector).items == []


def test_a_tenant_pod_by_digest_runs_that_digest_and_the_start_names_it(
    lab: Lab, tenant: str, tmp_path: Path
) -> None:
    assert "@sha256:" in SERVER_IMAGE and "@sha256:" in KEEPER_IMAGE, "source the lab's DIR/env"
    audit_path = tmp_path / "audit.jsonl"
    seen: dict[str, Any] = {}
    assert asyncio.run(start_through_the_runtime(lab, tenant, audit_path, seen=seen)) == "ok"
    digest = SERVER_IMAGE.partition("@")[2]
    [started] = events(audit_path, "sandbox.started")
    assert started["tenant"] == tenant and started["image_digest"] == digest
    images = {c["name"]: c["image"] for c in seen["containers"]}
    assert images == {"server": SERVER_IMAGE, "keeper": KEEPER_IMAGE}
    # What the node ran, by the digest the CRI resolved (not a tag it could have moved).
    assert seen["image_ids"]["server"].endswith(digest)
    assert seen["image_ids"]["keeper"].endswith(KEEPER_IMAGE.partition("@")[2])
