"""`docbroker tenant manifest NAME`: the tenant's PVCs (and, with the master key, its Secret)
as YAML for `kubectl apply -f -`; the same shape as k8s/components/tenant-example.

The broker itself never creates PVCs (its RBAC has none): an operator provisions a tenant's
storage with this, and fills the sources volume out of band. The Secret is optional here
because the broker creates it before each Pod start; printing it serves GitOps setups that
keep the broker's RBAC without secrets/create (and rotations: re-apply after a new master key).
"""

from __future__ import annotations

import argparse
from typing import Any, TextIO

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


def run_manifest(args: argparse.Namespace, out: TextIO) -> int:
    """The command: namespace and instance from DOCBROKER_KUBE_NAMESPACE / DOCBROKER_INSTANCE."""
    from broker.master_key import MasterKeyError, load_master_key
    from broker.settings import (
        INSTANCE_RE,
        KUBE_QUANTITY_RE,
        SettingsError,
        kubernetes_from_env,
        master_key_file_from_env,
    )
    from server.contracts import TENANT_RE

    tenant = args.manifest_of
    if not TENANT_RE.fullmatch(tenant):
        raise SystemExit("docbroker tenant manifest: not a tenant id (a DNS label)")
    for flag, value in (("--sources-size", args.sources_size), ("--reports-size", args.reports_size)):
        if not KUBE_QUANTITY_RE.fullmatch(value):
            raise SystemExit(f"docbroker tenant manifest: {flag} must be a quantity such as 1Gi")
    for flag, value in (
        ("--storage-class", args.storage_class),
        ("--sources-storage-class", args.sources_storage_class),
        ("--reports-storage-class", args.reports_storage_class),
    ):
        if value is not None and not INSTANCE_RE.fullmatch(value):
            raise SystemExit(f"docbroker tenant manifest: {flag} must be a DNS label")
    try:
        kube, instance = kubernetes_from_env(by_digest=False)  # PVCs and a Secret: no image
    except SettingsError as exc:
        raise SystemExit(f"docbroker tenant manifest: {exc}") from None
    master_key = None
    if args.secret:
        try:
            master_key = load_master_key(master_key_file_from_env())
        except MasterKeyError as exc:
            raise SystemExit(f"docbroker tenant manifest: {exc}") from None
    objects = tenant_objects(
        tenant,
        namespace=kube.namespace,
        instance=instance,
        sources_size=args.sources_size,
        reports_size=args.reports_size,
        storage_class=args.storage_class,
        sources_storage_class=args.sources_storage_class,
        reports_storage_class=args.reports_storage_class,
        sources_access_mode=args.sources_access_mode or kube.sources_access_mode,
        master_key=master_key,
    )
    out.write(to_yaml(objects))
    return 0
