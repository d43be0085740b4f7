"""broker.runtime.podsecurity, from the attacker's side: a spec tampered in any one way the
"restricted" profile (or our extras) forbids is refused, naming the rule; every pod template
that k8s/ renders passes."""

from __future__ import annotations

import copy
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from broker.runtime.podsecurity import Violation, check_pod_spec
from tests.k8s_manifests.render import all_renderings, render
from tests.k8s_manifests.workloads import pod_spec_of

SERVER_BY_DIGEST = "docbroker-server@sha256:" + "ab" * 32
KEEPER_BY_DIGEST = "registry.example.com:5000/docbroker/docbroker-broker:0.1@sha256:" + "cd" * 32


def tenant_pod() -> dict[str, Any]:
    """A tenant Pod of the shape the Kubernetes runtime creates (issue-18 contract)."""
    hardened = {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "privileged": False,
        "capabilities": {"drop": ["ALL"]},
    }
    limits = {"limits": {"cpu": "1", "memory": "128Mi"}, "requests": {"cpu": "100m", "memory": "64Mi"}}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "docbroker-tenant-acme", "namespace": "docbroker-tenants"},
        "spec": {
            "automountServiceAccountToken": False,
            "enableServiceLinks": False,
            "securityContext": {
                "runAsNonRoot": True,
                "runAsUser": 10001,
                "runAsGroup": 10001,
                "fsGroup": 10001,
                "seccompProfile": {"type": "Localhost", "localhostProfile": "docbroker/seccomp-tcp.json"},
            },
            "containers": [
                {
                    "name": "server",
                    "image": SERVER_BY_DIGEST,
                    "securityContext": copy.deepcopy(hardened),
                    "resources": copy.deepcopy(limits),
                    "ports": [{"containerPort": 8080}],
                    "volumeMounts": [{"name": "sources", "mountPath": "/srv/docs/sources", "readOnly": True}],
                },
                {
                    "name": "keeper",
                    "image": KEEPER_BY_DIGEST,
                    "securityContext": copy.deepcopy(hardened),
                    "resources": copy.deepcopy(limits),
                    "ports": [{"containerPort": 8081}],
                },
            ],
            "volumes": [
                {
                    "name": "sources",
                    "persistentVolumeClaim": {"claimName": "docbroker-tenant-acme-sources", "readOnly": True},
                },
                {"name": "reports", "persistentVolumeClaim": {"claimName": "docbroker-tenant-acme-reports"}},
                {"name": "dropbox", "emptyDir": {"sizeLimit": "16Mi"}},
                {"name": "secret", "secret": {"secretName": "docbroker-tenant-acme"}},
            ],
        },
    }


def spec(pod: dict[str, Any]) -> dict[str, Any]:
    s: dict[str, Any] = pod["spec"]
    return s


def server(pod: dict[str, Any]) -> dict[str, Any]:
    c: dict[str, Any] = spec(pod)["containers"][0]
    return c


def ctx(pod: dict[str, Any]) -> dict[str, Any]:
    c: dict[str, Any] = server(pod)["securityContext"]
    return c


def pod_ctx(pod: dict[str, Any]) -> dict[str, Any]:
    c: dict[str, Any] = spec(pod)["securityContext"]
    return c


def rules(pod: dict[str, Any], tenant: bool = True) -> set[str]:
    return {v.rule for v in check_pod_spec(spec(pod), metadata=pod["metadata"], tenant=tenant)}


def test_the_tenant_pod_shape_passes() -> None:
    assert check_pod_spec(spec(tenant_pod()), tenant=True) == []


Tamper = Callable[[dict[str, Any]], None]
TAMPERED: list[tuple[str, Tamper, str]] = [
    ("hostPath", lambda p: spec(p)["volumes"].append({"name": "h", "hostPath": {"path": "/"}}), "hostPath"),
    (
        "nfs volume",
        lambda p: spec(p)["volumes"].append({"name": "n", "nfs": {"server": "x", "path": "/"}}),
        "volumeType",
    ),
    ("no drop ALL", lambda p: ctx(p)["capabilities"].pop("drop"), "capabilities.drop"),
    ("drop only NET_RAW", lambda p: ctx(p)["capabilities"].update(drop=["NET_RAW"]), "capabilities.drop"),
    ("add SYS_ADMIN", lambda p: ctx(p)["capabilities"].update(add=["SYS_ADMIN"]), "capabilities.add"),
    ("runAsNonRoot false on the pod", lambda p: pod_ctx(p).update(runAsNonRoot=False), "runAsNonRoot"),
    ("runAsNonRoot false on a container", lambda p: ctx(p).update(runAsNonRoot=False), "runAsNonRoot"),
    ("runAsNonRoot missing", lambda p: pod_ctx(p).pop("runAsNonRoot"), "runAsNonRoot"),
    ("no seccomp", lambda p: pod_ctx(p).pop("seccompProfile"), "seccomp"),
    ("seccomp Unconfined", lambda p: pod_ctx(p).update(seccompProfile={"type": "Unconfined"}), "seccomp"),
    (
        "container seccomp Unconfined",
        lambda p: ctx(p).update(seccompProfile={"type": "Unconfined"}),
        "seccomp",
    ),
    (
        "Localhost without a file",
        lambda p: pod_ctx(p).update(seccompProfile={"type": "Localhost"}),
        "seccomp",
    ),
    (
        "allowPrivilegeEscalation true",
        lambda p: ctx(p).update(allowPrivilegeEscalation=True),
        "allowPrivilegeEscalation",
    ),
    (
        "allowPrivilegeEscalation unset",
        lambda p: ctx(p).pop("allowPrivilegeEscalation"),
        "allowPrivilegeEscalation",
    ),
    ("uid 0 on the pod", lambda p: pod_ctx(p).update(runAsUser=0), "runAsUser"),
    ("uid 0 on a container", lambda p: ctx(p).update(runAsUser=0), "runAsUser"),
    ("uid unset", lambda p: pod_ctx(p).pop("runAsUser"), "runAsUser"),
    ("gid 0 on the pod", lambda p: pod_ctx(p).update(runAsGroup=0), "runAsGroup"),
    ("gid 0 on a container", lambda p: ctx(p).update(runAsGroup=0), "runAsGroup"),
    ("gid unset", lambda p: pod_ctx(p).pop("runAsGroup"), "runAsGroup"),
    ("fsGroup 0", lambda p: pod_ctx(p).update(fsGroup=0), "fsGroup"),
    ("supplementalGroups 0", lambda p: pod_ctx(p).update(supplementalGroups=[0]), "supplementalGroups"),
    ("uid as a string", lambda p: pod_ctx(p).update(runAsUser="10001"), "runAsUser"),
    ("privileged", lambda p: ctx(p).update(privileged=True), "privileged"),
    ("hostNetwork", lambda p: spec(p).update(hostNetwork=True), "hostNetwork"),
    ("hostPID", lambda p: spec(p).update(hostPID=True), "hostPID"),
    ("hostIPC", lambda p: spec(p).update(hostIPC=True), "hostIPC"),
    ("hostPort", lambda p: server(p)["ports"].append({"containerPort": 1, "hostPort": 8080}), "hostPort"),
    ("procMount Unmasked", lambda p: ctx(p).update(procMount="Unmasked"), "procMount"),
    (
        "unsafe sysctl",
        lambda p: pod_ctx(p).update(sysctls=[{"name": "kernel.msgmax", "value": "1"}]),
        "sysctls",
    ),
    ("SELinux spc_t", lambda p: ctx(p).update(seLinuxOptions={"type": "spc_t"}), "seLinux"),
    ("SELinux user", lambda p: pod_ctx(p).update(seLinuxOptions={"user": "system_u"}), "seLinux"),
    ("AppArmor unconfined", lambda p: ctx(p).update(appArmorProfile={"type": "Unconfined"}), "appArmor"),
    (
        "AppArmor annotation unconfined",
        lambda p: p["metadata"].update(
            annotations={"container.apparmor.security.beta.kubernetes.io/server": "unconfined"}
        ),
        "appArmor",
    ),
    ("Windows host process", lambda p: ctx(p).update(windowsOptions={"hostProcess": True}), "hostProcess"),
    ("writable root fs", lambda p: ctx(p).update(readOnlyRootFilesystem=False), "readOnlyRootFilesystem"),
    ("no memory limit", lambda p: server(p)["resources"]["limits"].pop("memory"), "limits"),
    ("no limits", lambda p: server(p).pop("resources"), "limits"),
    # A limit of 0 is no limit (no CFS quota, no memory cap): DOCBROKER_KUBE_MEMORY_LIMIT=0 made one.
    ("memory limit 0", lambda p: server(p)["resources"]["limits"].update(memory="0"), "limits"),
    ("memory limit 0Mi", lambda p: server(p)["resources"]["limits"].update(memory="0Mi"), "limits"),
    ("cpu limit 0m", lambda p: server(p)["resources"]["limits"].update(cpu="0m"), "limits"),
    ("cpu limit 0.0 as a number", lambda p: server(p)["resources"]["limits"].update(cpu=0.0), "limits"),
    (
        "memory limit not a quantity",
        lambda p: server(p)["resources"]["limits"].update(memory="lots"),
        "limits",
    ),
    (
        "service account token",
        lambda p: spec(p).pop("automountServiceAccountToken"),
        "automountServiceAccountToken",
    ),
    ("service links", lambda p: spec(p).update(enableServiceLinks=True), "enableServiceLinks"),
    (
        "shared process namespace",
        lambda p: spec(p).update(shareProcessNamespace=True),
        "shareProcessNamespace",
    ),
    (
        "a privileged init container",
        lambda p: spec(p).update(
            initContainers=[
                {**copy.deepcopy(server(p)), "name": "init", "securityContext": {"privileged": True}}
            ]
        ),
        "privileged",
    ),
    (
        "an ephemeral debug container",
        lambda p: spec(p).update(
            ephemeralContainers=[{"name": "debug", "image": "busybox", "securityContext": {}}]
        ),
        "allowPrivilegeEscalation",
    ),
    ("no containers", lambda p: spec(p).update(containers=[]), "malformed"),
    ("containers not a list", lambda p: spec(p).update(containers={"name": "x"}), "malformed"),
    ("securityContext not an object", lambda p: server(p).update(securityContext="privileged"), "malformed"),
    ("volumes not a list", lambda p: spec(p).update(volumes="hostPath"), "malformed"),
    # DESIGN §13: a tag can be moved to another image on the registry or the node.
    ("the server image by tag", lambda p: server(p).update(image="docbroker-server:latest"), "image"),
    ("the server image by name", lambda p: server(p).update(image="docbroker-server"), "image"),
    (
        "a digest that is not sha256",
        lambda p: server(p).update(image="docbroker-server@md5:" + "ab" * 16),
        "image",
    ),
    (
        "a short digest",
        lambda p: server(p).update(image="docbroker-server@sha256:" + "ab" * 8),
        "image",
    ),
    (
        "the keeper image by tag",
        lambda p: spec(p)["containers"][1].update(image="docbroker-broker:latest"),
        "image",
    ),
    ("no image", lambda p: server(p).pop("image"), "image"),
]


@pytest.mark.parametrize(("what", "tamper", "rule"), TAMPERED, ids=[t[0] for t in TAMPERED])
def test_a_tampered_tenant_pod_is_refused(what: str, tamper: Tamper, rule: str) -> None:
    pod = tenant_pod()
    tamper(pod)
    assert rule in rules(pod)


def test_the_keeper_container_is_checked_too() -> None:
    pod = tenant_pod()
    spec(pod)["containers"][1]["securityContext"]["capabilities"] = {"drop": ["ALL"], "add": ["CHOWN"]}
    found = check_pod_spec(spec(pod), tenant=True)
    assert [(v.rule, v.where) for v in found] == [("capabilities.add", "containers[keeper]")]


def test_net_bind_service_may_be_added() -> None:
    pod = tenant_pod()
    ctx(pod)["capabilities"]["add"] = ["NET_BIND_SERVICE"]
    assert rules(pod) == set()


@pytest.mark.parametrize(("cpu", "memory"), [("1.5", "1Gi"), ("500m", "96Mi"), (2, "1e9"), (".5", "128M")])
def test_every_positive_quantity_is_a_limit(cpu: Any, memory: str) -> None:
    pod = tenant_pod()
    server(pod)["resources"]["limits"] = {"cpu": cpu, "memory": memory}
    assert rules(pod) == set()


def test_the_broker_may_mount_its_token() -> None:
    """The token rules are for tenant Pods only; the broker's needs the API."""
    pod = tenant_pod()
    spec(pod)["automountServiceAccountToken"] = True
    assert rules(pod, tenant=False) == set()
    assert rules(pod, tenant=True) == {"automountServiceAccountToken"}


@pytest.mark.parametrize("junk", [None, [], "spec", 7])
def test_junk_is_a_violation_not_an_exception(junk: Any) -> None:
    found = check_pod_spec(junk)
    assert found and all(isinstance(v, Violation) for v in found)
    assert str(found[0]).startswith("pod: malformed")


def test_every_pod_template_in_k8s_passes(tmp_path: Path) -> None:
    templates = 0
    for name, docs in all_renderings(tmp_path):
        for doc in docs:
            found = pod_spec_of(doc)
            if found is None:
                continue
            metadata, pod_spec = found
            violations = check_pod_spec(pod_spec, metadata=metadata)
            assert violations == [], f"{name}: {doc['kind']}/{doc['metadata']['name']}: {violations}"
            templates += 1
    # the brokers' StatefulSet and the db-upgrade Job: in the 4 overlays and with each of the 9 components
    assert templates == 26


def test_the_broker_pod_may_name_a_tag_unless_pinned_is_asked() -> None:
    pod = tenant_pod()
    server(pod)["image"] = "docbroker-broker:latest"
    assert rules(pod, tenant=False) == set()  # base and lab overlays: the run names its image
    assert {v.rule for v in check_pod_spec(spec(pod), pinned=True)} == {"image"}


def test_the_production_overlay_names_every_image_by_digest() -> None:
    """The brokers' own StatefulSet (kustomize `images:` with a digest) and the tenant Pods'
    images in its settings: nothing there is a tag."""
    docs = render("overlays/production")
    templates = [found for found in map(pod_spec_of, docs) if found is not None]
    assert len(templates) == 2  # the brokers' StatefulSet and the db-upgrade Job
    for metadata, pod_spec in templates:
        assert check_pod_spec(pod_spec, metadata=metadata, pinned=True) == []
    config = next(
        d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"].startswith("docbroker-config")
    )
    for name in ("DOCBROKER_KUBE_SERVER_IMAGE", "DOCBROKER_KUBE_KEEPER_IMAGE"):
        assert "@sha256:" in config["data"][name]


def test_pod_spec_of_reads_workloads() -> None:
    pod = tenant_pod()
    assert pod_spec_of(pod) == (pod["metadata"], pod["spec"])
    template = {"metadata": {"labels": {}}, "spec": pod["spec"]}
    for kind in ("Deployment", "StatefulSet", "DaemonSet", "Job"):
        assert pod_spec_of({"kind": kind, "spec": {"template": template}}) == (
            template["metadata"],
            pod["spec"],
        )
    cron = {"kind": "CronJob", "spec": {"jobTemplate": {"spec": {"template": template}}}}
    assert pod_spec_of(cron) == (template["metadata"], pod["spec"])
    assert pod_spec_of({"kind": "Service", "spec": {}}) is None
