"""The tenant Pod and Secret the Kubernetes backend sends, and `docbroker tenant manifest`,
checked offline: what each container can reach, the hardening, the names of issue 18's
contract. (Behaviour on a live cluster: test_backend_live.py.)"""

from __future__ import annotations

import base64
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from broker.master_key import keeper_key, sandbox_key, tenant_secret
from broker.runtime.kubernetes import names
from broker.runtime.kubernetes.manifest import tenant_objects
from broker.runtime.kubernetes.podspec import tenant_pod, tenant_secret_object
from broker.settings import KubernetesSettings, SettingsError, kubernetes_from_env

ROOT = Path(__file__).resolve().parents[2]
MASTER = bytes(range(32))
SERVER_IMAGE = "registry.example.com/docbroker-server@sha256:" + "ab" * 32
KEEPER_IMAGE = "registry.example.com/docbroker-broker@sha256:" + "cd" * 32
BY_DIGEST = {"DOCBROKER_KUBE_SERVER_IMAGE": SERVER_IMAGE, "DOCBROKER_KUBE_KEEPER_IMAGE": KEEPER_IMAGE}


def pod(**overrides: Any) -> dict[str, Any]:
    settings = KubernetesSettings(**{"server_image": SERVER_IMAGE, "keeper_image": KEEPER_IMAGE, **overrides})
    return tenant_pod(settings, "acme", instance="prod", replica="broker-7f9:1")


def container(spec: dict[str, Any], name: str) -> dict[str, Any]:
    every = spec["spec"]["containers"] + spec["spec"].get("initContainers", [])
    return next(c for c in every if c["name"] == name)


def volumes_of(spec: dict[str, Any], name: str) -> set[str]:
    return {m["name"] for m in container(spec, name)["volumeMounts"]}


def test_names_and_labels_follow_the_contract() -> None:
    p = pod()
    meta = p["metadata"]
    assert meta["name"] == "docbroker-tenant-acme" and meta["namespace"] == "docbroker-tenants"
    assert meta["labels"] == {
        "app.kubernetes.io/part-of": "docbroker",
        "app.kubernetes.io/component": "sandbox",
        "app.kubernetes.io/name": "docbroker-sandbox",
        "docbroker.io/tenant": "acme",
        "docbroker.io/instance": "prod",
        "docbroker.io/replica": "broker-7f9-1",  # ':' is no label character
    }
    claims = {
        v["name"]: v["persistentVolumeClaim"] for v in p["spec"]["volumes"] if "persistentVolumeClaim" in v
    }
    assert claims["sources"] == {"claimName": "docbroker-tenant-acme-sources", "readOnly": True}
    assert claims["reports"] == {"claimName": "docbroker-tenant-acme-reports"}
    ports = {c["name"]: [x["containerPort"] for x in c["ports"]] for c in p["spec"]["containers"]}
    assert ports == {"server": [8080], "keeper": [8081]}


def test_pod_hardening() -> None:
    p = pod(seccomp="localhost/docbroker/seccomp-tcp.json", runtime_class="gvisor")
    spec = p["spec"]
    assert spec["automountServiceAccountToken"] is False
    assert spec["enableServiceLinks"] is False
    assert spec["restartPolicy"] == "Never"
    assert spec["runtimeClassName"] == "gvisor"
    assert "hostNetwork" not in spec and "hostPID" not in spec and "hostIPC" not in spec
    assert spec["securityContext"]["runAsNonRoot"] is True
    assert spec["securityContext"]["fsGroup"] != 0 and spec["securityContext"]["runAsGroup"] != 0
    assert all("hostPath" not in v for v in spec["volumes"])
    for c in spec["containers"] + spec.get("initContainers", []):
        sc = c["securityContext"]
        assert sc["runAsNonRoot"] is True and sc["runAsUser"] != 0 and sc["runAsGroup"] != 0, c["name"]
        assert sc["allowPrivilegeEscalation"] is False and sc["privileged"] is False
        assert sc["readOnlyRootFilesystem"] is True
        assert sc["capabilities"] == {"drop": ["ALL"]}
        assert c["resources"]["limits"]["cpu"] and c["resources"]["limits"]["memory"]
        assert c["resources"]["requests"]["memory"] == c["resources"]["limits"]["memory"]
    server = container(p, "server")
    assert server["securityContext"]["seccompProfile"] == {
        "type": "Localhost",
        "localhostProfile": "docbroker/seccomp-tcp.json",
    }
    assert server["readinessProbe"]["tcpSocket"] == {"port": 8080}
    # the server and the keeper run as different uids: the server cannot act as the keeper
    assert server["securityContext"]["runAsUser"] != container(p, "keeper")["securityContext"]["runAsUser"]


def test_runtime_default_is_the_fallback_and_no_runtime_class_by_default() -> None:
    p = pod()
    assert container(p, "server")["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert "runtimeClassName" not in p["spec"]


def test_the_keeper_starts_first_and_its_hook_makes_the_drop_box_before_the_server_starts() -> None:
    """The kubelet starts containers in their order and waits for each one's postStart hook
    (1.20 SyncPod): the drop-box exists, the keeper's and 1733, before the server's subPath
    mount is made; were the server first, the kubelet would make the folder as root, 0777.
    No init container: it cost a second of each first call on the lab."""
    spec = pod()["spec"]
    assert [c["name"] for c in spec["containers"]] == ["keeper", "server"]
    assert "initContainers" not in spec
    hook = spec["containers"][0]["lifecycle"]["postStart"]["exec"]["command"]
    assert hook[:3] == ["/opt/venv/bin/python", "-I", "-S"]
    assert "/dropbox/reports" in hook[-1] and "0o1733" in hook[-1]
    keeper_env = {e["name"]: e["value"] for e in spec["containers"][0]["env"]}
    assert keeper_env["KEEPER_DROPBOX"] == "/dropbox/reports"  # the folder the hook makes


def test_each_container_reaches_only_its_own_volumes_and_keys() -> None:
    """DESIGN §7 in a Pod: only the keeper mounts the reports PVC and holds keeper-key; the
    server gets the approval secret and the sandbox key, and nothing else of the Secret."""
    p = pod()
    assert volumes_of(p, "server") == {"sources", "dropbox", "server-secret", "tmp"}
    assert volumes_of(p, "keeper") == {"dropbox", "reports", "keeper-secret"}
    secrets = {v["name"]: v["secret"] for v in p["spec"]["volumes"] if "secret" in v}
    assert {s["secretName"] for s in secrets.values()} == {"docbroker-tenant-acme"}
    assert [i["key"] for i in secrets["server-secret"]["items"]] == ["approval-secret", "sandbox-key"]
    assert [i["key"] for i in secrets["keeper-secret"]["items"]] == ["keeper-key"]
    mounts = {m["name"]: m for m in container(p, "server")["volumeMounts"]}
    assert mounts["sources"]["readOnly"] is True and mounts["server-secret"]["readOnly"] is True
    assert mounts["dropbox"]["subPath"] == "reports" and mounts["dropbox"]["mountPath"] == "/srv/docs/reports"
    env = {e["name"]: e.get("value") for e in container(p, "server")["env"]}
    assert env["DOCS_SANDBOX_KEY_FILE"] == "/run/secrets/docbroker/sandbox.key"
    assert env["DOCS_SCOPE"] == "acme"
    assert env["DOCS_ALLOWED_HOSTS"] == "$(POD_IP):8080,localhost"
    assert "--http" in container(p, "server")["command"]
    keeper_env = {e["name"]: e.get("value") for e in container(p, "keeper")["env"]}
    assert keeper_env["KEEPER_DROPBOX"] == "/dropbox/reports" and keeper_env["KEEPER_REPORTS"] == "/reports"
    assert container(p, "keeper")["command"][1:3] == ["-m", "broker.keeper"]


def test_secret_holds_the_three_derived_keys() -> None:
    secret = tenant_secret_object(MASTER, "acme", namespace="docbroker-tenants", instance="default")
    data = {k: base64.b64decode(v).decode() for k, v in secret["data"].items()}
    assert data == {
        "approval-secret": tenant_secret(MASTER, "acme"),
        "sandbox-key": sandbox_key(MASTER, "acme"),
        "keeper-key": keeper_key(MASTER, "acme"),
    }
    assert len(set(data.values())) == 3
    assert secret["metadata"]["name"] == names.object_name("acme")


def test_manifest_has_the_shape_of_the_tenant_example_component() -> None:
    example = list(yaml.safe_load_all((ROOT / "k8s/components/tenant-example/pvcs.yaml").read_text()))
    assert tenant_objects("example", namespace="docbroker-tenants", instance="default") == example


def run_cli(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "broker", *args],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
        env={"PATH": os.environ["PATH"], "PYTHONPATH": str(ROOT), **env},
    )


def test_tenant_manifest_command(tmp_path: Path) -> None:
    key = tmp_path / "master.key"
    key.write_text(MASTER.hex())
    key.chmod(0o600)
    env = {
        "DOCBROKER_MASTER_KEY_FILE": str(key),
        "DOCBROKER_KUBE_NAMESPACE": "tenants-x",
        "DOCBROKER_INSTANCE": "blue",
    }
    plain = run_cli("tenant", "manifest", "acme", "--storage-class", "local", env=env)
    assert plain.returncode == 0, plain.stderr
    objects = list(yaml.safe_load_all(plain.stdout))
    assert [o["kind"] for o in objects] == ["PersistentVolumeClaim", "PersistentVolumeClaim"]
    assert {o["metadata"]["namespace"] for o in objects} == {"tenants-x"}
    assert {o["metadata"]["labels"]["docbroker.io/instance"] for o in objects} == {"blue"}
    assert {o["spec"]["storageClassName"] for o in objects} == {"local"}
    assert MASTER.hex() not in plain.stdout
    with_secret = run_cli("tenant", "manifest", "acme", "--secret", env=env)
    assert with_secret.returncode == 0, with_secret.stderr
    secret = list(yaml.safe_load_all(with_secret.stdout))[-1]
    assert secret["kind"] == "Secret"
    assert base64.b64decode(secret["data"]["sandbox-key"]).decode() == sandbox_key(MASTER, "acme")
    bad = run_cli("tenant", "manifest", "Not_A_Label", env=env)
    assert bad.returncode != 0 and "not a tenant id" in bad.stderr and "Traceback" not in bad.stderr
    no_key = run_cli(
        "tenant", "manifest", "acme", "--secret", env={"DOCBROKER_MASTER_KEY_FILE": str(tmp_path / "none")}
    )
    assert no_key.returncode != 0 and "master key" in no_key.stderr and "Traceback" not in no_key.stderr


def test_tenant_manifest_storage_for_managed_clusters() -> None:
    """Block storage (EBS, Azure Disk, PD) offers no ReadOnlyMany: the sources claim may be
    ReadWriteOnce (a flag, or the broker's setting), and each claim may have its own class."""
    env = {"DOCBROKER_KUBE_SOURCES_ACCESS_MODE": "ReadWriteOnce"}
    classes = ("--sources-storage-class", "gp3", "--reports-storage-class", "gp3-retain")
    done = run_cli("tenant", "manifest", "acme", *classes, env=env)
    assert done.returncode == 0, done.stderr
    sources, reports = yaml.safe_load_all(done.stdout)
    assert (
        sources["spec"]["accessModes"] == ["ReadWriteOnce"] and sources["spec"]["storageClassName"] == "gp3"
    )
    assert reports["spec"]["accessModes"] == ["ReadWriteOnce"]
    assert reports["spec"]["storageClassName"] == "gp3-retain"
    # the flag over the setting; --storage-class for both unless one is set apart
    done = run_cli(
        "tenant", "manifest", "acme", "--sources-access-mode", "ReadOnlyMany", "--storage-class", "nfs",
        "--reports-storage-class", "disk", env=env,
    )  # fmt: skip
    sources, reports = yaml.safe_load_all(done.stdout)
    assert sources["spec"]["accessModes"] == ["ReadOnlyMany"] and sources["spec"]["storageClassName"] == "nfs"
    assert reports["spec"]["storageClassName"] == "disk"
    bad = run_cli("tenant", "manifest", "acme", "--sources-storage-class", "Not A Class", env={})
    assert bad.returncode != 0 and "--sources-storage-class must be a DNS label" in bad.stderr
    refused = run_cli(
        "tenant", "manifest", "acme", env={"DOCBROKER_KUBE_SOURCES_ACCESS_MODE": "ReadWriteMany"}
    )
    assert refused.returncode != 0 and "DOCBROKER_KUBE_SOURCES_ACCESS_MODE must be one of" in refused.stderr


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("DOCBROKER_KUBE_SECCOMP", "Unconfined"),
        ("DOCBROKER_KUBE_SECCOMP", "localhost/../../etc/x"),
        ("DOCBROKER_KUBE_CPU_LIMIT", "lots"),
        ("DOCBROKER_KUBE_CPU_LIMIT", "2k"),  # a quantity, but the Pod spec could not compute with it
        ("DOCBROKER_KUBE_CPU_LIMIT", "1Gi"),
        ("DOCBROKER_KUBE_MEMORY_LIMIT", "128 MB"),
        ("DOCBROKER_KUBE_NAMESPACE", "Bad_NS"),
        ("DOCBROKER_KUBE_RUNTIME_CLASS", "g visor"),
        ("DOCBROKER_KUBE_IMAGE_PULL_POLICY", "Sometimes"),
        # DESIGN §13: the tenant Pods' images by digest, never a tag that can be moved
        ("DOCBROKER_KUBE_SERVER_IMAGE", "registry.example.com/docbroker-server:0.1.0"),
        ("DOCBROKER_KUBE_KEEPER_IMAGE", "docbroker-broker:latest"),
        ("DOCBROKER_KUBE_SERVER_IMAGE", "docbroker-server@sha256:abc"),
        ("DOCBROKER_KUBE_SERVER_IMAGE", "docbroker-server@sha512:" + "ab" * 64),
    ],
)
def test_bad_kubernetes_settings_are_refused_in_one_line(name: str, value: str) -> None:
    with pytest.raises(SettingsError) as caught:
        kubernetes_from_env({**BY_DIGEST, name: value})
    assert name in str(caught.value)
    assert value not in str(caught.value)


def test_a_tag_is_refused_with_how_to_get_the_digest() -> None:
    with pytest.raises(SettingsError) as caught:
        kubernetes_from_env({})  # the defaults name tags: fine for Docker, never for Pods
    assert "DOCBROKER_KUBE_SERVER_IMAGE" in str(caught.value) and "RepoDigests" in str(caught.value)
    kubernetes_from_env({}, by_digest=False)  # `tenant manifest` makes no Pod


def test_kubernetes_settings_defaults_and_values() -> None:
    k, instance = kubernetes_from_env(BY_DIGEST)
    assert (k.namespace, k.kubeconfig, k.seccomp, k.runtime_class, instance) == (
        "docbroker-tenants",
        None,
        "RuntimeDefault",
        None,
        "default",
    )
    k, _ = kubernetes_from_env(
        {
            "DOCBROKER_KUBECONFIG": "/x/kubeconfig",
            "DOCBROKER_KUBE_SECCOMP": "localhost/docbroker/seccomp-tcp.json",
            "DOCBROKER_KUBE_CPU_LIMIT": "500m",
            "DOCBROKER_KUBE_MEMORY_LIMIT": "96Mi",
            "DOCBROKER_KUBE_IMAGE_PULL_POLICY": "Never",
            **BY_DIGEST,
        }
    )
    assert k.kubeconfig == Path("/x/kubeconfig") and k.cpu_limit == "500m" and k.image_pull_policy == "Never"
    server = container(tenant_pod(k, "acme", instance="default", replica="r"), "server")
    assert server["resources"]["limits"] == {"cpu": "500m", "memory": "96Mi"}
    assert server["resources"]["requests"] == {"cpu": "50m", "memory": "96Mi"}  # a node fits many idle ones
    tiny = KubernetesSettings(cpu_limit="20m")
    assert (
        container(tenant_pod(tiny, "acme", instance="d", replica="r"), "server")["resources"]["requests"][
            "cpu"
        ]
        == "20m"
    )
    assert server["imagePullPolicy"] == "Never"


@pytest.mark.parametrize(
    "overrides",
    [
        {},
        {"seccomp": "localhost/docbroker/seccomp-tcp.json"},
        {"runtime_class": "gvisor", "cpu_limit": "500m"},
    ],
)
def test_every_generated_tenant_pod_passes_the_restricted_profile(overrides: dict[str, Any]) -> None:
    from broker.runtime.podsecurity import check_pod_spec

    p = pod(**overrides)
    assert check_pod_spec(p["spec"], metadata=p["metadata"], tenant=True) == []


@pytest.mark.parametrize(
    "tamper",
    ["privileged", "host_path", "root", "no_drop", "escalation", "writable_root", "token", "unconfined"],
)
def test_the_restricted_check_catches_a_tampered_tenant_pod(tamper: str) -> None:
    """The same check can fail: each weakening of the generated spec is reported."""
    import copy

    from broker.runtime.podsecurity import check_pod_spec

    p = copy.deepcopy(pod())
    server = p["spec"]["containers"][0]["securityContext"]
    if tamper == "privileged":
        server["privileged"] = True
    elif tamper == "host_path":
        p["spec"]["volumes"].append({"name": "host", "hostPath": {"path": "/"}})
    elif tamper == "root":
        server["runAsUser"] = 0
        server["runAsNonRoot"] = False
        p["spec"]["securityContext"]["runAsNonRoot"] = False
    elif tamper == "no_drop":
        server["capabilities"] = {}
    elif tamper == "escalation":
        server["allowPrivilegeEscalation"] = True
    elif tamper == "writable_root":
        server["readOnlyRootFilesystem"] = False
    elif tamper == "token":
        p["spec"]["automountServiceAccountToken"] = True
    elif tamper == "unconfined":
        server["seccompProfile"] = {"type": "Unconfined"}
    assert check_pod_spec(p["spec"], metadata=p["metadata"], tenant=True) != []


def test_doctor_and_serve_say_in_one_line_when_no_cluster_answers(tmp_path: Path) -> None:
    """A kubeconfig whose API server does not answer: `doctor` prints a FAIL line per check
    and exits 1, `serve` refuses to start with one line; neither shows a traceback."""
    from broker.testing import make_broker

    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.1:9"}}],
                "users": [{"name": "u", "user": {"token": "not-a-real-token"}}],
                "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
                "current-context": "x",
            }
        )
    )
    broker = make_broker(
        tmp_path / "b", runtime="kubernetes", env={"DOCBROKER_KUBECONFIG": str(kubeconfig), **BY_DIGEST}
    )
    doctor = subprocess.run(
        [sys.executable, "-m", "broker", "doctor"],
        capture_output=True,
        text=True,
        timeout=120,
        env=broker.env,
        cwd=ROOT,
    )
    assert doctor.returncode == 1
    lines = {line.split()[1] + " " + line.split()[2]: line.split()[0] for line in doctor.stdout.splitlines()}
    assert lines["kubernetes api"] == "FAIL" and lines["rbac needed"] == "FAIL"
    assert "NewConnectionError" not in doctor.stdout  # one line each, not the raw exception
    assert "127.0.0.1:9" in doctor.stdout and "not-a-real-token" not in doctor.stdout
    assert "Traceback" not in doctor.stdout + doctor.stderr
    serve = subprocess.run(
        [sys.executable, "-m", "broker", "serve"],
        capture_output=True,
        text=True,
        timeout=120,
        env=broker.env,
        cwd=ROOT,
    )
    assert serve.returncode != 0
    assert "Traceback" not in serve.stderr and "kubernetes" in serve.stderr.lower(), serve.stderr
    assert "not-a-real-token" not in serve.stderr


def test_a_tenant_pod_reserves_little_cpu_so_twenty_idle_ones_fit_two_cores() -> None:
    """A Pod's CPU request is the larger of its init containers' and the sum of its containers'
    (the scheduler's rule): with the init container's request at its limit, 20 Pods at once
    found "Insufficient cpu" on the lab's 2-core node (seen live, bench/kubernetes.py)."""

    def milli(value: str) -> int:
        return int(value[:-1]) if value.endswith("m") else int(float(value) * 1000)

    spec = tenant_pod(KubernetesSettings(), "acme", instance="default", replica="r")["spec"]
    running = sum(milli(c["resources"]["requests"]["cpu"]) for c in spec["containers"])
    init = max((milli(c["resources"]["requests"]["cpu"]) for c in spec.get("initContainers", [])), default=0)
    assert 20 * max(running, init) <= 2000 * 0.75  # a quarter of the node left for the system


def test_the_last_use_stamp_reads_back_and_junk_is_not_a_use() -> None:
    """The Pod's `docbroker.io/last-used`: what a replica writes reads back to the millisecond;
    anything else (hand-edited, a naive time, not a string) is no use, and the Pod's creation
    counts instead."""
    from datetime import UTC, datetime
    from types import SimpleNamespace

    from broker.runtime.kubernetes.lastuse import last_use_of, parse_stamp, stamp

    when = 1_796_159_045.123
    assert stamp(when) == "2026-12-01T21:04:05.123Z"
    assert parse_stamp(stamp(when)) == pytest.approx(when, abs=0.001)
    for junk in ("", "yesterday", "2026-12-01T21:04:05", 1796159045, None, "9" * 100):
        assert parse_stamp(junk) is None
    created = datetime(2026, 12, 1, 20, 0, tzinfo=UTC)

    def pod(annotations: dict[str, str] | None) -> SimpleNamespace:
        return SimpleNamespace(metadata=SimpleNamespace(annotations=annotations, creation_timestamp=created))

    assert last_use_of(pod({names.LAST_USED: stamp(when)}), names.LAST_USED) == pytest.approx(when, abs=0.001)
    assert last_use_of(pod({names.LAST_USED: "junk"}), names.LAST_USED) == created.timestamp()
    assert last_use_of(pod(None), names.LAST_USED) == created.timestamp()
