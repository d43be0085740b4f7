"""DOCBROKER_RUNTIME=kubernetes: one Pod per tenant (broker/runtime/kubernetes/)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from broker.settings.reader import INSTANCE_RE, PREFIX, Reader, SettingsError


@dataclass(frozen=True)
class KubernetesSettings:
    """DOCBROKER_RUNTIME=kubernetes: one Pod per tenant (broker/runtime/kubernetes/)."""

    namespace: str = "docbroker-tenants"
    kubeconfig: Path | None = None  # None: the in-cluster config (the Pod's ServiceAccount)
    server_image: str = "docbroker-server:latest"
    keeper_image: str = "docbroker-broker:latest"
    image_pull_policy: str = "IfNotPresent"
    # "localhost/<profile path under the kubelet's seccomp root>" or "RuntimeDefault": the
    # latter is a fallback that /readyz and `doctor` report (reports lose seccomp's guard).
    seccomp: str = "RuntimeDefault"
    runtime_class: str | None = None  # e.g. gVisor's or Kata's RuntimeClass
    cpu_limit: str = "1"  # a quantity; start-up is CPU-bound (the SDK import)
    memory_limit: str = "128Mi"
    # The tenants' sources claims: ReadOnlyMany (pushed while the tenant's Pod serves) or
    # ReadWriteOnce (what EBS, Azure Disk, PD offer: the push and the tenant's Pod take turns,
    # and the broker starts no tenant Pod while its push runs).
    sources_access_mode: str = "ReadOnlyMany"


# An image named by its content, `[registry/]name[:tag]@sha256:<64 hex>`: a tag can be moved to
# another image by whoever can push to the registry or import on a node, the digest cannot.
IMAGE_BY_DIGEST_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._/:-]*@sha256:[0-9a-f]{64}")
KUBE_SECCOMP_RE = re.compile(r"RuntimeDefault|localhost/[A-Za-z0-9._/-]{1,200}")
KUBE_QUANTITY_RE = re.compile(r"[0-9]+(\.[0-9]+)?(m|Ki|Mi|Gi|k|M|G)?")
SOURCES_ACCESS_MODES = ("ReadOnlyMany", "ReadWriteOnce")
KUBE_CPU_RE = re.compile(r"[0-9]+(\.[0-9]+)?m?")  # cores or millicores: what the Pod spec computes with


def kubernetes_settings(r: Reader, *, by_digest: bool) -> KubernetesSettings:
    """`by_digest`: the images must be named by digest (tenant Pods are about to be made from
    them); a broker on another runtime reads the variables without needing them."""
    k = KubernetesSettings(
        namespace=r.text(
            "KUBE_NAMESPACE",
            "docbroker-tenants",
            doc="kubernetes: the namespace of the tenant Pods, PVCs and Secrets",
        ),
        kubeconfig=r.path(
            "KUBECONFIG",
            doc=(
                "kubernetes: a kubeconfig file instead of the Pod's ServiceAccount (development, `doctor` "
                "with other credentials)"
            ),
        ),
        server_image=r.text(
            "KUBE_SERVER_IMAGE",
            "docbroker-server:latest",
            doc=(
                "kubernetes: the tenant Pod's `server` container image, by digest (`name@sha256:…`; a tag "
                "is refused, [docs/supply-chain-kubernetes.md](docs/supply-chain-kubernetes.md))"
            ),
        ),
        keeper_image=r.text(
            "KUBE_KEEPER_IMAGE",
            "docbroker-broker:latest",
            doc=("kubernetes: the `keeper` (and drop-box init) container image, by digest (`name@sha256:…`)"),
        ),
        image_pull_policy=r.choice(
            "KUBE_IMAGE_PULL_POLICY",
            "IfNotPresent",
            ("Always", "IfNotPresent", "Never"),
            doc=("kubernetes: `Always`, `IfNotPresent` or `Never` (images imported into the nodes)"),
        ),
        seccomp=r.text(
            "KUBE_SECCOMP",
            "RuntimeDefault",
            doc=(
                "kubernetes: the server container's seccomp: `localhost/<path under the kubelet's seccomp "
                "root>` (the project's profile) or `RuntimeDefault`, a fallback reported in `/readyz` "
                "(`seccomp_fallback`) and by `doctor`"
            ),
        ),
        runtime_class=r.optional(
            "KUBE_RUNTIME_CLASS", doc="kubernetes: the tenant Pods' `runtimeClassName` (gVisor, Kata)"
        ),
        cpu_limit=r.text(
            "KUBE_CPU_LIMIT",
            "1",
            doc=("kubernetes: the server container's CPU limit (= request), a Kubernetes quantity"),
        ),
        memory_limit=r.text(
            "KUBE_MEMORY_LIMIT",
            "128Mi",
            doc=(
                "kubernetes: the server container's memory limit (= request), a Kubernetes quantity; "
                "separate from the Docker limits, whose units differ"
            ),
        ),
        sources_access_mode=r.choice(
            "KUBE_SOURCES_ACCESS_MODE",
            "ReadOnlyMany",
            SOURCES_ACCESS_MODES,
            doc=(
                "the tenants' sources claims: `ReadOnlyMany` (a push while the tenant's Pod serves) or "
                "`ReadWriteOnce` (block storage: the push stops the tenant's Pod and no Pod starts while it "
                'runs); the default of `tenant manifest` (docs/kubernetes.md, "Storage")'
            ),
        ),
    )
    if not INSTANCE_RE.fullmatch(k.namespace):
        raise SettingsError(f"{PREFIX}KUBE_NAMESPACE must be a DNS label")
    for name, image in (("KUBE_SERVER_IMAGE", k.server_image), ("KUBE_KEEPER_IMAGE", k.keeper_image)):
        if by_digest and not IMAGE_BY_DIGEST_RE.fullmatch(image):
            raise SettingsError(
                f"{PREFIX}{name} must name the image by digest, name@sha256:<64 hex>, never by a tag "
                "alone: after a push, `docker inspect --format '{{index .RepoDigests 0}}' IMAGE` prints it "
                "(docs/supply-chain-kubernetes.md)"
            )
    if not KUBE_SECCOMP_RE.fullmatch(k.seccomp) or ".." in k.seccomp:
        raise SettingsError(
            f"{PREFIX}KUBE_SECCOMP must be RuntimeDefault or localhost/<profile path on the node>"
        )
    if k.runtime_class is not None and not INSTANCE_RE.fullmatch(k.runtime_class):
        raise SettingsError(f"{PREFIX}KUBE_RUNTIME_CLASS must be a DNS label")
    if not KUBE_CPU_RE.fullmatch(k.cpu_limit):
        raise SettingsError(f"{PREFIX}KUBE_CPU_LIMIT must be a CPU quantity such as 1, 1.5 or 500m")
    if not KUBE_QUANTITY_RE.fullmatch(k.memory_limit):
        raise SettingsError(f"{PREFIX}KUBE_MEMORY_LIMIT must be a Kubernetes quantity such as 128Mi")
    return k
