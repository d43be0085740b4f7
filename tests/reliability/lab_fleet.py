"""The broker as it is deployed on the lab cluster, for the reliability run (test_lab_run.py).

- `deploy(tmp, tenants)`: PostgreSQL for the Pods, the tenants' PVCs on local volumes (sources
  with documents, reports where the keeper writes), and the lab overlay's Deployment of two broker
  Pods applied with this run's keys, tenants and addresses (as test_deployment_live.py does).
- `BrokerPods`: the Ready broker Pods' addresses, kept fresh by a thread (the lab has no
  kube-proxy: the run's own load balancer picks among them); the last list holds while the API
  server is away, as an Endpoints object's would.
- `Collector`: every file the run is accounted from opens while its Pod lives and is read to
  its end afterwards: each broker replica's audit log and witness (its `data` volume) and each
  lab Pod's container logs (/var/log/pods). A deleted Pod's files are removed by the kubelet;
  an open descriptor keeps them whole, the shutdown's last checkpoint included.
- `deployment_lock`: the Deployment's name is the lab's one; test_deployment_live.py takes the
  same lock, so two files on two workers never apply it at once.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client as k8s

from broker.runtime.kubernetes import names
from broker.runtime.kubernetes.manifest import tenant_objects
from broker.testing import Broker, make_broker
from broker.testing.kubernetes_lab import ROOT, STORAGE_CLASS, Lab, _kubectl, local_volume
from tests.kubernetes.conftest import wait_until
from tests.kubernetes.test_deployment_live import (
    BROKER_NS,
    BROKER_SELECTOR,
    OWN_KINDS,
    REPLICAS,
    _env,
    audit_public_key,
    deployment_lock,
    postgres_for_pods,
    upgrade_database,
    write_overlay,
)

TENANTS_NS = names.TENANTS_NAMESPACE
PV_LABEL = "docbroker.io/test"
PV_LABEL_VALUE = "reliability-lab"
LAB_SCRIPT = ROOT / ".ci" / "kube-lab.sh"
DOCUMENTS = {
    "plan.md": "# Plan\nthe fleet shares one tenant pod per tenant\n",
    "notes.md": "# Notes\nreplicas behind a balancer without affinity\n",
    "faults.md": "# Faults\na pod deleted, a broker deleted, the api server restarted\n",
}


def _pod_ready(pod: Any) -> bool:
    return bool(
        pod.metadata.deletion_timestamp is None
        and pod.status.pod_ip
        and pod.status.container_statuses
        and all(c.ready for c in pod.status.container_statuses)
    )


class BrokerPods:
    """The Ready broker Pods (name → IP), polled every 0.3 s by a thread of its own."""

    def __init__(self, lab: Lab) -> None:
        self._lab = lab
        self._lock = threading.Lock()
        self._ready: dict[str, str] = {}
        self._ready_uids: set[str] = set()  # a StatefulSet's replacement Pod keeps the name
        self._uids: dict[str, str] = {}  # every broker Pod seen: name → uid
        self._restarts: dict[str, int] = {}  # name → its containers' restarts (the kubelet's)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="broker-pods", daemon=True)

    def refresh(self) -> bool:
        try:
            pods = self._lab.core.list_namespaced_pod(
                BROKER_NS, label_selector=BROKER_SELECTOR, _request_timeout=5
            ).items
        except Exception:  # the API server is away: keep the last list, like Endpoints do
            return False
        ready = {p.metadata.name: p.status.pod_ip for p in pods if _pod_ready(p)}
        with self._lock:
            self._ready = ready
            self._ready_uids = {p.metadata.uid for p in pods if _pod_ready(p)}
            self._uids.update({p.metadata.name: p.metadata.uid for p in pods})
            for p in pods:
                count = sum(c.restart_count for c in p.status.container_statuses or ())
                self._restarts[p.metadata.name] = max(count, self._restarts.get(p.metadata.name, 0))
        return True

    def _run(self) -> None:
        while not self._stop.wait(0.3):
            self.refresh()

    def start(self) -> None:
        self.refresh()
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=10)

    def ready(self) -> dict[str, str]:
        with self._lock:
            return dict(self._ready)

    def ready_uids(self) -> set[str]:
        with self._lock:
            return set(self._ready_uids)

    def seen(self) -> dict[str, str]:
        with self._lock:
            return dict(self._uids)

    def restarts(self) -> dict[str, int]:
        with self._lock:
            return dict(self._restarts)


@dataclass
class _Open:
    path: Path
    fd: int
    pod_uid: str


_REPLICA_FILE = re.compile(r"^audit-(witness-)?|\.jsonl(\.[0-9]+)?$")


class Collector:
    """Opens each audit file and container log of this lab's Pods as it appears (polled every
    0.2 s) and keeps it open; `save(dest)` then reads every one to its end.

    Only Pods of this lab's kubelet (its pod folders) are looked at: /var/log/pods is shared by
    every lab on the machine."""

    def __init__(self, lab_folder: Path) -> None:
        self._pods_root = lab_folder / "kubelet" / "root" / "pods"
        self._volumes = lab_folder / "broker-volumes"  # Lab.broker_volumes: the PVs' own folders
        self._open: dict[tuple[int, int], _Open] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="collector", daemon=True)

    def _candidates(self) -> Iterator[tuple[Path, str]]:
        # Each replica's audit files, from its local PersistentVolume's own folder: never
        # through the kubelet's bind mount of it in the Pod's folder. A file held open there
        # keeps the mount busy, the kubelet cannot unmount it, and a deleted broker Pod is never
        # removed, so its StatefulSet never replaces it (a CI run waited 180 s). The files name
        # their replica; no Pod uid is needed.
        for path in self._volumes.glob("*/data/audit-*.jsonl"):
            yield path, ""
        for pod in self._pods_root.iterdir() if self._pods_root.is_dir() else ():
            uid = pod.name
            for logs in Path("/var/log/pods").glob(f"*_{uid}"):
                for path in logs.glob("*/*.log*"):
                    yield path, uid

    def poll(self) -> None:
        with contextlib.suppress(OSError):  # a Pod's folder may go while it is listed
            for path, uid in list(self._candidates()):
                try:
                    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
                except OSError:
                    continue
                st = os.fstat(fd)
                key = (st.st_dev, st.st_ino)
                if key in self._open:
                    os.close(fd)
                else:
                    self._open[key] = _Open(path, fd, uid)

    def _run(self) -> None:
        while not self._stop.wait(0.2):
            self.poll()

    def start(self) -> None:
        self.poll()
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
        self.poll()

    def save(self, dest: Path, pod_names: dict[str, str]) -> dict[str, list[Path]]:
        """Every file read whole into dest/<pod name>/; pod name → the files written."""
        by_uid = {uid: name for name, uid in pod_names.items()}
        written: dict[str, list[Path]] = {}
        for entry in self._open.values():
            pod = by_uid.get(entry.pod_uid, entry.pod_uid)
            if entry.path.name.startswith("audit-"):
                # A replica's files outlive its Pods (the StatefulSet's volume), and a Pod that
                # replaces one has its name: the file names the replica, whichever Pod opened it.
                pod = _REPLICA_FILE.sub("", entry.path.name)
            folder = dest / pod
            folder.mkdir(parents=True, exist_ok=True)
            kind = (
                entry.path.name
                if entry.path.name.startswith("audit-")
                else (f"container-{entry.path.parent.name}-{entry.path.name}")
            )
            target = folder / kind
            n = 1
            while target.exists():  # a rotated file: the same name, another inode
                target = folder / f"{kind}.{n}"
                n += 1
            with target.open("wb") as out:
                offset = 0
                while chunk := os.pread(entry.fd, 1 << 20, offset):
                    out.write(chunk)
                    offset += len(chunk)
            written.setdefault(pod, []).append(target)
        return written

    def close(self) -> None:
        for entry in self._open.values():
            os.close(entry.fd)
        self._open.clear()


@dataclass
class Fleet:
    lab: Lab
    idp: Broker  # never started: its IdP key signs the clients' tokens, its ops token reads /readyz
    tenants: list[str]
    storage: dict[str, Path]  # tenant → the folder holding sources/ and reports/
    folder: Path
    audit_public_key: Path
    pods: BrokerPods
    collector: Collector
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def lab_folder(self) -> Path:
        return self.lab.folder

    def tenant_pod_uid(self, tenant: str) -> str | None:
        try:
            pod = self.lab.core.read_namespaced_pod(names.object_name(tenant), TENANTS_NS, _request_timeout=5)
        except Exception:
            return None
        return None if pod.metadata.deletion_timestamp is not None else str(pod.metadata.uid)

    def tenant_pod_gone(self, tenant: str) -> bool:
        """The API answers that the tenant has no Pod (an API away is not an answer)."""
        try:
            self.lab.core.read_namespaced_pod(names.object_name(tenant), TENANTS_NS, _request_timeout=5)
        except k8s.ApiException as exc:
            return exc.status == 404
        except Exception:
            return False
        return False

    def tenant_freezers(self) -> dict[str, Path]:
        """tenant → the freezer cgroup of its Pod (the lab's kubelet drives cgroup v1 through
        cgroupfs: <root>/kubepods/[<qos>/]pod<uid>), for the tenants with a Pod now."""
        pods = self.lab.core.list_namespaced_pod(TENANTS_NS, _request_timeout=10).items
        uids = {p.metadata.name: p.metadata.uid for p in pods if p.metadata.deletion_timestamp is None}
        # The pod folders are named, not searched: a recursive walk of kubepods/ races other
        # Pods' folders going away mid-walk (an idle sandbox's Pod removed), an ENOENT.
        parents = [
            kubepods / qos
            for kubepods in Path("/sys/fs/cgroup/freezer").glob("*/kubepods")
            for qos in ("", "burstable", "besteffort")
        ]
        found: dict[str, Path] = {}
        for tenant in self.tenants:
            uid = uids.get(names.object_name(tenant))
            candidates = [parent / f"pod{uid}" for parent in parents] if uid else []
            paths = [path for path in candidates if path.is_dir()]
            if len(paths) == 1:
                found[tenant] = paths[0]
        return found

    def log_count(self, pod: str, text: bytes) -> int:
        """How often `text` is in the containers' logs of a broker Pod (the kubelet's files)."""
        uid = self.pods.seen()[pod]
        count = 0
        for path in Path("/var/log/pods").glob(f"*_{uid}/*/*.log"):
            with contextlib.suppress(FileNotFoundError):  # the kubelet rotated it since the listing
                count += path.read_bytes().count(text)
        return count

    def scale(self, replicas: int) -> None:
        _kubectl(
            self.lab.kubeconfig,
            "-n",
            BROKER_NS,
            "scale",
            "statefulset/docbroker-broker",
            f"--replicas={replicas}",
        )


def _storage(lab: Lab, tenants: list[str]) -> dict[str, Path]:
    """Each tenant's sources and reports folders, bound through PVs and PVCs (one kubectl apply)."""
    docs: list[dict[str, Any]] = []
    found: dict[str, Path] = {}
    for tenant in tenants:
        base = lab.folder / "reliability-volumes" / tenant
        shutil.rmtree(base, ignore_errors=True)
        (base / "sources").mkdir(parents=True)
        (base / "reports").mkdir()
        for filename, text in DOCUMENTS.items():
            (base / "sources" / filename).write_text(text)
            os.chmod(base / "sources" / filename, 0o644)
        os.chmod(base / "sources", 0o755)  # noqa: S103 - the sandbox reads it
        os.chown(base / "reports", 10002, 10001)  # the keeper's; the server never mounts it
        os.chmod(base / "reports", 0o770)  # noqa: S103 - the keeper's uid and gid
        claims = tenant_objects(tenant, namespace=TENANTS_NS, instance="default", storage_class=STORAGE_CLASS)
        for claim, kind in zip(claims, ("sources", "reports"), strict=True):
            docs.append(claim)
            docs.append(_pv(lab, tenant, kind, base / kind, claim))
        found[tenant] = base
    _kubectl(lab.kubeconfig, "apply", "-f", "-", stdin=yaml.safe_dump_all(docs))
    return found


def _pv(lab: Lab, tenant: str, kind: str, path: Path, claim: dict[str, Any]) -> dict[str, Any]:
    labels = {names.TENANT: tenant, PV_LABEL: PV_LABEL_VALUE}
    return local_volume(f"rel-{tenant}-{kind}", TENANTS_NS, claim, path, lab.node, labels)


def _drop_storage(lab: Lab, tenants: list[str]) -> None:
    selector = f"{names.TENANT} in ({','.join(tenants)})"
    kc = lab.kubeconfig
    _kubectl(
        kc,
        "-n",
        TENANTS_NS,
        "delete",
        "pod",
        "-l",
        selector,
        "--grace-period=0",
        "--force",
        "--ignore-not-found",
    )
    _kubectl(kc, "-n", TENANTS_NS, "delete", "secret", "-l", selector, "--ignore-not-found")
    claims = [c for t in tenants for c in (names.sources_claim(t), names.reports_claim(t))]
    _kubectl(kc, "-n", TENANTS_NS, "delete", "pvc", *claims, "--ignore-not-found", "--wait=false")
    _kubectl(kc, "delete", "pv", "-l", f"{PV_LABEL}={PV_LABEL_VALUE}", "--ignore-not-found", "--wait=false")
    for tenant in tenants:
        shutil.rmtree(lab.folder / "reliability-volumes" / tenant, ignore_errors=True)


@contextlib.contextmanager
def deploy(tmp: Path, tenants: list[str], settings: dict[str, str] | None = None) -> Iterator[Fleet]:
    """The StatefulSet of two broker Pods on PostgreSQL, its tenants' storage; torn down after.
    `settings`: the brokers' DOCBROKER_* over the run's own."""
    lab = Lab.open()  # namespaces, RBAC, PSP and storage class
    overlay = tmp / "overlay"
    overlay.mkdir()
    collector = Collector(lab.folder)
    collector.start()
    with deployment_lock(lab.folder):
        cluster, pg_port = postgres_for_pods(_env("DOCBROKER_TEST_KUBE_HOST_IP"))
        idp = make_broker(overlay / "idp", tenants=tenants)
        pods = BrokerPods(lab)
        try:
            upgrade_database(idp, cluster.url)
            storage = _storage(lab, tenants)
            lab.broker_volumes(REPLICAS)
            # A tenant Pod's start on two busy shared cores has taken over 60 s (the lab
            # tests' timeout); a start that times out is deleted and begun again. Below the
            # clients' own limit (lab_load.OP_TIMEOUT), so that the broker answers first.
            own = {"DOCBROKER_START_TIMEOUT": "100", **(settings or {})}
            write_overlay(overlay, idp, tenants, pg_port, own)
            _kubectl(lab.kubeconfig, "apply", "-k", str(overlay))
            pods.start()
            wait_until("two Ready broker Pods", lambda: len(pods.ready()) == 2, timeout=240, every=0.5)
            yield Fleet(lab, idp, tenants, storage, tmp, audit_public_key(overlay), pods, collector)
        finally:
            pods.stop()
            collector.stop()
            try:
                mine = [
                    d for d in yaml.safe_load_all(_kubectl(lab.kubeconfig, "kustomize", str(overlay))) if d
                ]
                mine = [d for d in mine if d["kind"] in OWN_KINDS]
                delete = ("delete", "-f", "-", "--ignore-not-found", "--wait=true", "--timeout=180s")
                _kubectl(lab.kubeconfig, *delete, stdin=yaml.safe_dump_all(mine))
            finally:
                if not (tmp / "collected").exists():  # the run failed early: keep what there is
                    collector.save(tmp / "collected-at-teardown", pods.seen())
                collector.close()
                _drop_storage(lab, tenants)
                lab.drop_broker_volumes(REPLICAS)
                cluster.remove()


def restart_apiserver(lab_folder: Path) -> subprocess.CompletedProcess[str]:
    """`.ci/kube-lab.sh restart-apiserver`: the lab's kube-apiserver stopped and started again."""
    return subprocess.run(
        ["bash", str(LAB_SCRIPT), "restart-apiserver", str(lab_folder)],
        capture_output=True,
        text=True,
        timeout=180,
        env={**os.environ, "KUBE_LAB_SLOT": lab_slot(lab_folder)},
    )


def apiserver_pid(lab_folder: Path) -> int:
    return int((lab_folder / "pids" / "apiserver.pid").read_text())


def lab_slot(lab_folder: Path) -> str:
    """The slot of the lab in `lab_folder` (the script needs it for its names): the one whose
    marker names this folder."""
    for slot in range(10):
        marker = Path(f"/run/docbroker-kube-lab{slot or ''}.dir")
        with contextlib.suppress(OSError):
            if Path(marker.read_text().strip()).resolve() == lab_folder.resolve():
                return str(slot)
    return os.environ.get("KUBE_LAB_SLOT", "0")


def monotonic_ms() -> float:
    return time.monotonic() * 1000
