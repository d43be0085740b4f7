"""`docbroker tenant manifest NAME`: the tenant's PVCs (and, with the master key, its Secret)
as YAML for `kubectl apply -f -`; the same shape as k8s/components/tenant-example.

The broker itself never creates PVCs (its RBAC has none): an operator provisions a tenant's
storage with this, and fills the sources volume out of band. The Secret is optional here
because the broker creates it before each Pod start; printing it serves GitOps setups that
keep the broker's RBAC without secrets/create (and rotations: re-apply after a new master key).
The command line (flags, settings, output) is broker/cli/tenant.py.
"""

from __future__ import annotations

from typing import Any

from broker.runtime.kubernetes import names
from broker.runtime.kubernetes.podspec import tenant_secret_object


def _claim(name: str, tenant: str, *, namespace: str, instance: str, mode: str, size: str) -> dict[str, Any]:
    spec: dict[str, Any] = {"accessModes": [mode], "resources": {"requests": {"storage": size}}}
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": names.common_labels(tenant, instance),
        },
        "spec": spec,
    }


def tenant_objects(
    tenant: str,
    *,
    namespace: str,
    instance: str,
    sources_size: str = "1Gi",
    reports_size: str = "1Gi",
    storage_class: str | None = None,
    sources_storage_class: str | None = None,
    reports_storage_class: str | None = None,
    sources_access_mode: str = "ReadOnlyMany",
    master_key: bytes | None = None,
) -> list[dict[str, Any]]:
    """sources: mounted read-only by the server container, read-write only by a push Pod
    (`ReadWriteOnce`: never both at once, push.py); reports: only by the keeper's. Each claim
    may have a class of its own (`storage_class` is both's default)."""
    objects = [
        _claim(
            names.sources_claim(tenant),
            tenant,
            namespace=namespace,
            instance=instance,
            mode=sources_access_mode,
            size=sources_size,
        ),
        _claim(
            names.reports_claim(tenant),
            tenant,
            namespace=namespace,
            instance=instance,
            mode="ReadWriteOnce",
            size=reports_size,
        ),
    ]
    for claim, own in zip(objects, (sources_storage_class, reports_storage_class), strict=True):
        chosen = own or storage_class
        if chosen is not None:
            claim["spec"]["storageClassName"] = chosen
    if master_key is not None:
        objects.append(tenant_secret_object(master_key, tenant, namespace=namespace, instance=instance))
    return objects


def to_yaml(objects: list[dict[str, Any]]) -> str:
    import yaml

    return str(yaml.safe_dump_all(objects, sort_keys=False, default_flow_style=False))
