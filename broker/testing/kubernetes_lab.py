"""What the live Kubernetes backend tests need from the lab cluster (.ci/kube-lab.sh).

- `Lab.open()`: the admin client (DOCBROKER_TEST_KUBECONFIG; FAILS when unset, like the
  PostgreSQL tests), the lab overlay's namespaces, RBAC, PodSecurityPolicy and storage class
  applied (its brokers and db-upgrade Job left out: these tests are the broker), and a kubeconfig for the
  broker's own ServiceAccount (a TokenRequest token): the backend runs with exactly its RBAC.
- `Lab.tenant(name)`: the tenant's PVCs from `docbroker tenant manifest`, bound to local
  PersistentVolumes in the lab's folder (sources filled with a document).
- `Lab.exec(pod, container, code)`: Python run inside a container through the API's exec,
  with the ADMIN's credentials (the broker's have no pods/exec).
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from broker.runtime.kubernetes import names
from broker.runtime.kubernetes.manifest import tenant_objects
from broker.settings import KubernetesSettings

ROOT = Path(__file__).resolve().parents[2]
BROKER_SA = "docbroker-broker"
STORAGE_CLASS = "docbroker-lab"
SECCOMP = "localhost/docbroker/seccomp-tcp.json"
MASTER = bytes.fromhex("5a" * 32)
# The images the tenant Pods run (imported into the lab's containerd), by digest: the broker
# refuses a tag (DESIGN §13). The lab's DIR/env names them (`.ci/kube-lab.sh load-image IMAGE`
# prints the name@sha256:… of a build of one's own); the defaults here are refused, loudly.
SERVER_IMAGE = os.environ.get("DOCBROKER_TEST_KUBE_SERVER_IMAGE", "docbroker-server:latest")
KEEPER_IMAGE = os.environ.get("DOCBROKER_TEST_KUBE_KEEPER_IMAGE", "docbroker-broker:latest")


@dataclass
class Lab:
    admin: Any  # ApiClient with the admin's credentials
    kubeconfig: Path  # the admin's
    broker_kubeconfig: Path  # the broker ServiceAccount's token
    folder: Path  # the lab's folder: local volumes live under it
    node: str

    @classmethod
    def open(cls) -> Lab:
        lab = cls.connect()
        _apply_lab_overlay(lab.kubeconfig)
        lab.broker_kubeconfig.write_text(_token_kubeconfig(lab.admin, lab.kubeconfig))
        lab.broker_kubeconfig.chmod(0o600)
        return lab

    @classmethod
    def connect(cls) -> Lab:
        """The lab as it is, nothing applied (`broker_kubeconfig` is written by `open` only)."""
        from kubernetes import client, config

        path = os.environ.get("DOCBROKER_TEST_KUBECONFIG")
        if not path:
            raise RuntimeError(
                "DOCBROKER_TEST_KUBECONFIG is not set: start the lab (bash .ci/kube-lab.sh start DIR) "
                "and source DIR/env"
            )
        folder = Path(os.environ.get("DOCBROKER_TEST_KUBE_LAB") or Path(path).parent)
        configuration = client.Configuration()
        config.load_kube_config(config_file=path, client_configuration=configuration)  # type: ignore[no-untyped-call]
        admin = client.ApiClient(configuration)
        meta = client.CoreV1Api(admin).list_node().items[0].metadata
        assert meta is not None
        return cls(admin, Path(path), folder / "k8sbackend-broker.kubeconfig", folder, str(meta.name))

    @property
    def core(self) -> Any:
        from kubernetes import client

        return client.CoreV1Api(self.admin)

    @property
    def admin_batch(self) -> Any:
        from kubernetes import client

        return client.BatchV1Api(self.admin)

    def settings(self, **overrides: Any) -> KubernetesSettings:
        values: dict[str, Any] = {
            "kubeconfig": self.broker_kubeconfig,
            "image_pull_policy": "Never",
            "server_image": SERVER_IMAGE,
            "keeper_image": KEEPER_IMAGE,
            "seccomp": SECCOMP,
            "cpu_limit": "1",
        }
        values.update(overrides)
        return KubernetesSettings(**values)

    def tenant(
        self, name: str, files: dict[str, str] | None = None, *, sources_access_mode: str = "ReadOnlyMany"
    ) -> Path:
        """The tenant's storage on the lab: its PVCs (as the manifest command writes them)
        bound to fresh local volumes; returns the folder holding sources/ and reports/."""
        files = {"notes.md": "# Notes\ndocbroker on a cluster\n"} if files is None else files
        base, claims = self.tenant_volumes(name, files, sources_access_mode=sources_access_mode)
        for claim in claims:
            _kubectl(self.kubeconfig, "apply", "-f", "-", stdin=yaml.safe_dump(claim))
        return base

    def tenant_volumes(
        self, name: str, files: dict[str, str], *, sources_access_mode: str
    ) -> tuple[Path, list[dict[str, Any]]]:
        """The tenant's folders (sources/ holding `files`) and local PersistentVolumes, each
        pre-bound to the claim `docbroker tenant manifest` writes; the folder and those claims
        (the caller applies them, or lets the manifest command do it)."""
        base = self.folder / "k8sbackend-volumes" / name
        shutil.rmtree(base, ignore_errors=True)
        (base / "sources").mkdir(parents=True)
        (base / "reports").mkdir()
        for filename, text in files.items():
            (base / "sources" / filename).write_text(text)
        os.chmod(base / "sources", 0o755)  # noqa: S103 - the sandbox reads it
        for f in (base / "sources").iterdir():
            os.chmod(f, 0o644)
        os.chown(base / "reports", 10002, 10001)  # the keeper's; the server never mounts it
        os.chmod(base / "reports", 0o770)  # noqa: S103 - the keeper's uid and gid
        objects = tenant_objects(
            name,
            namespace=names.TENANTS_NAMESPACE,
            instance="default",
            storage_class=STORAGE_CLASS,
            sources_access_mode=sources_access_mode,
        )
        for claim, kind in zip(objects, ("sources", "reports"), strict=True):
            self._volume(name, kind, base / kind, claim)
        return base, objects

    def _volume(self, tenant: str, kind: str, path: Path, claim: dict[str, Any]) -> None:
        pv_name = f"k8sbackend-{tenant}-{kind}"
        _kubectl(self.kubeconfig, "delete", "pv", pv_name, "--ignore-not-found", "--wait=false")
        pv = local_volume(pv_name, names.TENANTS_NAMESPACE, claim, path, self.node)
        pv["metadata"]["labels"] = {names.TENANT: tenant, "docbroker.io/test": "k8sbackend"}
        _kubectl(self.kubeconfig, "apply", "-f", "-", stdin=yaml.safe_dump(pv))

    def broker_volumes(self, replicas: int) -> list[Path]:
        """Each broker replica's data volume: the StatefulSet's claim `data-docbroker-broker-N`
        pre-bound to a local PersistentVolume in the lab's folder; the folders, by ordinal."""
        folders, docs = [], []
        for n in range(replicas):
            folder = self.folder / "broker-volumes" / str(n)
            shutil.rmtree(folder, ignore_errors=True)
            folder.mkdir(parents=True)
            folders.append(folder)
            claim = {"metadata": {"name": broker_claim(n)}, "spec": {"accessModes": ["ReadWriteOnce"]}}
            pv_name = f"docbroker-lab-broker-data-{n}"
            pv = local_volume(pv_name, names.BROKER_NAMESPACE, claim, folder, self.node)
            pv["spec"]["capacity"]["storage"] = "2Gi"
            docs.append(pv)
        _kubectl(self.kubeconfig, "apply", "-f", "-", stdin=yaml.safe_dump_all(docs))
        return folders

    def drop_broker_volumes(self, replicas: int) -> None:
        """The claims the StatefulSet left (it never deletes them), the volumes, their folders."""
        claims = [broker_claim(n) for n in range(replicas)]
        ns = names.BROKER_NAMESPACE
        _kubectl(self.kubeconfig, "-n", ns, "delete", "pvc", *claims, "--ignore-not-found")
        pvs = [f"docbroker-lab-broker-data-{n}" for n in range(replicas)]
        _kubectl(self.kubeconfig, "delete", "pv", *pvs, "--ignore-not-found")
        shutil.rmtree(self.folder / "broker-volumes", ignore_errors=True)

    def drop_tenant(self, name: str) -> None:
        """Remove what `tenant()` made and any Pod or Secret of the tenant."""
        ns = names.TENANTS_NAMESPACE
        obj = names.object_name(name)
        _kubectl(
            self.kubeconfig,
            "-n",
            ns,
            "delete",
            "pod",
            obj,
            "--ignore-not-found",
            "--grace-period=0",
            "--force",
        )
        _kubectl(self.kubeconfig, "-n", ns, "delete", "secret", obj, "--ignore-not-found")
        _kubectl(
            self.kubeconfig,
            "-n",
            ns,
            "delete",
            "pvc",
            names.sources_claim(name),
            names.reports_claim(name),
            "--ignore-not-found",
            "--wait=false",
        )
        for kind in ("sources", "reports"):
            _kubectl(
                self.kubeconfig,
                "delete",
                "pv",
                f"k8sbackend-{name}-{kind}",
                "--ignore-not-found",
                "--wait=false",
            )
        shutil.rmtree(self.folder / "k8sbackend-volumes" / name, ignore_errors=True)

    def exec(self, pod: str, container: str, code: str, *, timeout: float = 60) -> str:
        """Run Python in the container (as its own uid, under its seccomp and capabilities),
        through the API's exec with the admin's credentials; its stdout."""
        from kubernetes.stream import stream

        return str(
            stream(
                self.core.connect_get_namespaced_pod_exec,
                pod,
                names.TENANTS_NAMESPACE,
                container=container,
                command=["/opt/venv/bin/python", "-c", code],
                stderr=True,
                stdin=False,
                stdout=True,
                tty=False,
                _request_timeout=timeout,
            )
        )

    def probe(self, pod: str, container: str, code: str) -> dict[str, Any]:
        out = self.exec(pod, container, code)
        last = [line for line in out.splitlines() if line.startswith("{")]
        assert last, out
        return dict(json.loads(last[-1]))

    def pod(self, tenant: str) -> Any:
        return self.core.read_namespaced_pod(names.object_name(tenant), names.TENANTS_NAMESPACE)


def unique_tenant(prefix: str = "k") -> str:
    return f"{prefix}{secrets.token_hex(3)}"


def _kubectl(kubeconfig: Path, *args: str, stdin: str | None = None) -> str:
    done = subprocess.run(
        ["kubectl", "--kubeconfig", str(kubeconfig), *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, f"kubectl {args[:3]}: {done.stderr[-2000:]}"
    return done.stdout


# The brokers themselves and their schema step: a test that deploys them applies these.
BROKER_KINDS = ("StatefulSet", "Deployment", "PodDisruptionBudget", "Job")


def _apply_lab_overlay(kubeconfig: Path) -> None:
    """The lab overlay without its brokers, their PDB and the db-upgrade Job: namespaces, RBAC,
    the PSP, the storage class (the broker under test is this process)."""
    rendered = subprocess.run(
        ["kubectl", "kustomize", str(ROOT / "k8s/overlays/lab")], capture_output=True, text=True, timeout=120
    )
    assert rendered.returncode == 0, rendered.stderr
    keep = [d for d in yaml.safe_load_all(rendered.stdout) if d and d["kind"] not in BROKER_KINDS]
    # The base declares the tenants' namespace's `default` ServiceAccount (no token), which the
    # namespace's controller also makes: an apply that creates the namespace may find none and
    # then fail to create it, AlreadyExists (seen after a test deleted the namespaces). Applied
    # again, it patches the one that exists.
    for attempt in range(3):
        try:
            _kubectl(kubeconfig, "apply", "-f", "-", stdin=yaml.safe_dump_all(keep))
            return
        except AssertionError as exc:
            if "AlreadyExists" not in str(exc) or attempt == 2:
                raise


def _token_kubeconfig(
    admin: Any, admin_kubeconfig: Path, account: str = BROKER_SA, namespace: str = names.BROKER_NAMESPACE
) -> str:
    """A kubeconfig for a ServiceAccount (the broker's unless named): a TokenRequest token, the
    admin's cluster."""
    from kubernetes import client

    deadline = time.monotonic() + 30
    while True:  # the ServiceAccount was just applied
        try:
            answer = client.CoreV1Api(admin).create_namespaced_service_account_token(
                account,
                namespace,
                client.AuthenticationV1TokenRequest(
                    spec=client.V1TokenRequestSpec(audiences=[], expiration_seconds=7200)
                ),
            )
            break
        except Exception:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)
    source = yaml.safe_load(admin_kubeconfig.read_text())
    cluster = dict(source["clusters"][0]["cluster"])
    ca = cluster.get("certificate-authority")
    if ca and not Path(ca).is_absolute():
        cluster["certificate-authority"] = str((admin_kubeconfig.parent / ca).resolve())
    token = answer.status.token if answer.status is not None else ""
    return str(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "lab", "cluster": cluster}],
                "users": [{"name": "broker", "user": {"token": token}}],
                "contexts": [{"name": "broker", "context": {"cluster": "lab", "user": "broker"}}],
                "current-context": "broker",
            }
        )
    )


def host_broker(
    lab: Lab, base: Path, tenants: list[str], *, replica: str = "a", master: Path | None = None
) -> Any:
    """A real broker process on the host (`python -m broker serve`, broker.testing)
    with DOCBROKER_RUNTIME=kubernetes and the broker ServiceAccount's kubeconfig: it reaches
    the tenant Pods at their pod IPs over the lab's bridge, as a broker Pod would."""
    from broker.testing import make_broker

    env = {
        "DOCBROKER_KUBECONFIG": str(lab.broker_kubeconfig),
        "DOCBROKER_KUBE_SECCOMP": SECCOMP,
        "DOCBROKER_KUBE_IMAGE_PULL_POLICY": "Never",
        "DOCBROKER_KUBE_SERVER_IMAGE": SERVER_IMAGE,
        "DOCBROKER_KUBE_KEEPER_IMAGE": KEEPER_IMAGE,
        "DOCBROKER_REPLICA_ID": replica,
        "DOCBROKER_START_TIMEOUT": "60",
        "DOCBROKER_IDLE_TIMEOUT": "600",
    }
    if master is not None:
        env["DOCBROKER_MASTER_KEY_FILE"] = str(master)
    return make_broker(base, runtime="kubernetes", env=env, tenants=tenants)


def broker_claim(ordinal: int) -> str:
    """The StatefulSet's claim of replica `ordinal` (`<template>-<set>-<ordinal>`)."""
    return f"data-docbroker-broker-{ordinal}"


def local_volume(
    name: str,
    namespace: str,
    claim: dict[str, Any],
    path: Path,
    node: str,
    labels: dict[str, str] | None = None,
) -> dict[str, Any]:
    """A local PersistentVolume at `path` on the lab's node, pre-bound to `claim`."""
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolume",
        "metadata": {"name": name, **({"labels": labels} if labels else {})},
        "spec": {
            "capacity": {"storage": "1Gi"},
            "accessModes": claim["spec"]["accessModes"],
            "persistentVolumeReclaimPolicy": "Retain",
            "storageClassName": STORAGE_CLASS,
            "claimRef": {"namespace": namespace, "name": claim["metadata"]["name"]},
            "local": {"path": str(path)},
            "nodeAffinity": {
                "required": {
                    "nodeSelectorTerms": [
                        {
                            "matchExpressions": [
                                {"key": "kubernetes.io/hostname", "operator": "In", "values": [node]}
                            ]
                        }
                    ]
                }
            },
        },
    }
