"""The lab cluster itself: a Ready node, the project's image running as a hardened Pod under the
project's seccomp profile (checked from the host, in the kernel's view of the process), and
PodSecurityPolicy admission really refusing a privileged Pod for a least-privileged account.
"""

from __future__ import annotations

import base64
import secrets
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

from broker.testing.kubernetes_lab import SERVER_IMAGE
from tests.kubernetes.conftest import SECCOMP_PREFIX, kubeconfig_path, lab_dir, wait_until

pytestmark = pytest.mark.kubernetes

IMAGE = SERVER_IMAGE  # by digest (the lab's DIR/env): the reference form the CRI must resolve
PROFILE = SECCOMP_PREFIX + "seccomp.json"
UID = 10001
POD_PIDS_LIMIT = "1024"  # the lab's kubelet podPidsLimit (.ci/kube-lab.sh)


def test_the_node_is_ready(kube_api: Any) -> None:
    nodes = client.CoreV1Api(kube_api).list_node().items
    assert len(nodes) == 1
    node = nodes[0]
    ready = {c.type: c.status for c in node.status.conditions}["Ready"]
    assert ready == "True"
    assert node.status.node_info.kubelet_version == "v1.20.2"
    assert node.status.node_info.container_runtime_version.startswith("containerd://")


def hardened_pod(name: str, secret: str) -> client.V1Pod:
    """The tenant sandbox's shape: uid/gid 10001, no capabilities, read-only root, own profile."""
    return client.V1Pod(
        metadata=client.V1ObjectMeta(name=name, labels={"app.kubernetes.io/part-of": "docbroker-tests"}),
        spec=client.V1PodSpec(
            automount_service_account_token=False,
            enable_service_links=False,
            restart_policy="Never",
            security_context=client.V1PodSecurityContext(
                run_as_user=UID,
                run_as_group=UID,
                run_as_non_root=True,
                fs_group=UID,
                seccomp_profile=client.V1SeccompProfile(type="Localhost", localhost_profile=PROFILE),
            ),
            containers=[
                client.V1Container(
                    name="server",
                    image=IMAGE,
                    image_pull_policy="Never",
                    env=[client.V1EnvVar(name="DOCS_SCOPE", value="smoke")],
                    security_context=client.V1SecurityContext(
                        allow_privilege_escalation=False,
                        privileged=False,
                        read_only_root_filesystem=True,
                        capabilities=client.V1Capabilities(drop=["ALL"]),
                    ),
                    resources=client.V1ResourceRequirements(
                        requests={"cpu": "100m", "memory": "64Mi"}, limits={"cpu": "1", "memory": "256Mi"}
                    ),
                    volume_mounts=[
                        client.V1VolumeMount(name="run", mount_path="/run/docs"),
                        client.V1VolumeMount(name="sources", mount_path="/srv/docs/sources", read_only=True),
                        client.V1VolumeMount(name="reports", mount_path="/srv/docs/reports"),
                        client.V1VolumeMount(name="secret", mount_path="/run/secrets", read_only=True),
                    ],
                )
            ],
            volumes=[
                client.V1Volume(name="run", empty_dir=client.V1EmptyDirVolumeSource()),
                client.V1Volume(name="sources", empty_dir=client.V1EmptyDirVolumeSource()),
                client.V1Volume(name="reports", empty_dir=client.V1EmptyDirVolumeSource()),
                client.V1Volume(
                    name="secret",
                    secret=client.V1SecretVolumeSource(
                        secret_name=secret,
                        items=[client.V1KeyToPath(key="approval-secret", path="approval.key")],
                        default_mode=0o440,
                    ),
                ),
            ],
        ),
    )


def _status_fields(pid: int) -> dict[str, str]:
    fields = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        fields[key] = value.strip()
    return fields


def _container_pid(container_id: str) -> int:
    """The container's init process on the host, from the lab's containerd."""
    cid = container_id.removeprefix("containerd://")
    sock = lab_dir() / "containerd" / "containerd.sock"
    out = subprocess.run(
        ["ctr", "-a", str(sock), "-n", "k8s.io", "tasks", "ls"], check=True, capture_output=True, text=True
    ).stdout
    for line in out.splitlines()[1:]:
        parts = line.split()
        if parts and parts[0] == cid:
            return int(parts[1])
    pytest.fail("the container's task is not in the lab's containerd", pytrace=False)


@pytest.fixture
def restricted_policy(kube_dynamic: Any, kube_cleanup: Callable[[Callable[[], object]], None]) -> str:
    """A "restricted" PodSecurityPolicy of this test's own: with PSP admission on and no policy,
    the lab admits no Pod at all (the k8s/ lab overlay brings the project's own)."""
    name = f"dbtest-restricted-{secrets.token_hex(4)}"
    psps = kube_dynamic.resources.get(api_version="policy/v1beta1", kind="PodSecurityPolicy")
    psps.create(body=restricted_psp(name))
    kube_cleanup(lambda: psps.delete(name=name))
    return name


MKDIR_PROBE = """
import errno, os
try:
    os.mkdir("/run/docs/probe")
    print("created")
except OSError as exc:
    print(errno.errorcode[exc.errno])
"""


def _exec(namespace: str, pod: str, code: str) -> str:
    """Run Python in the pod's server container (`kubectl exec`, through the API server and kubelet)."""
    kubectl = ["kubectl", "--kubeconfig", kubeconfig_path()]
    out = subprocess.run(
        [*kubectl, "exec", "-n", namespace, pod, "-c", "server", "--", "/opt/venv/bin/python", "-c", code],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr[-500:]
    return out.stdout.strip()


def test_a_hardened_server_pod_runs_confined(kube_api: Any, namespace: str, restricted_policy: str) -> None:
    core = client.CoreV1Api(kube_api)
    core.create_namespaced_secret(
        namespace,
        client.V1Secret(
            metadata=client.V1ObjectMeta(name="smoke"),
            data={"approval-secret": base64.b64encode(secrets.token_hex(32).encode()).decode()},
        ),
    )
    core.create_namespaced_pod(namespace, hardened_pod("smoke", "smoke"))

    def running() -> Any:
        pod = core.read_namespaced_pod("smoke", namespace)
        statuses = pod.status.container_statuses or []
        assert pod.status.phase in ("Pending", "Running"), [s.state for s in statuses]
        return pod if statuses and statuses[0].state.running else None

    pod = wait_until("the hardened pod to run", running, timeout=90)
    time.sleep(3)  # a server that dies on start-up would be gone by now
    status = core.read_namespaced_pod("smoke", namespace).status
    assert status.phase == "Running"
    assert status.container_statuses[0].restart_count == 0
    assert status.container_statuses[0].state.running

    # What the kernel says about the server process, not what the spec asked for.
    pid = _container_pid(pod.status.container_statuses[0].container_id)
    fields = _status_fields(pid)
    assert fields["Uid"].split() == [str(UID)] * 4
    assert fields["Gid"].split() == [str(UID)] * 4
    assert fields["CapEff"] == fields["CapPrm"] == fields["CapBnd"] == "0000000000000000"
    assert fields["NoNewPrivs"] == "1"
    assert fields["Seccomp"] == "2"  # a filter is loaded; which one, the probe below tells
    # The project's profile (not the runtime's default) refuses mkdir even where the process may
    # write: a process in the container trying it in its writable emptyDir gets EPERM.
    assert _exec(namespace, "smoke", MKDIR_PROBE) == "EPERM"
    # podPidsLimit reaches the pod's cgroup: pids are not unlimited.
    pids_cgroup = next(
        line.split(":", 2)[2]
        for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines()
        if ":pids:" in line
    )
    pod_cgroup = Path("/sys/fs/cgroup/pids") / pids_cgroup.lstrip("/")
    assert (pod_cgroup.parent / "pids.max").read_text().strip() == POD_PIDS_LIMIT


def restricted_psp(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "policy/v1beta1",
        "kind": "PodSecurityPolicy",
        "metadata": {
            "name": name,
            "annotations": {
                "seccomp.security.alpha.kubernetes.io/allowedProfileNames": f"localhost/{PROFILE}",
                "seccomp.security.alpha.kubernetes.io/defaultProfileName": f"localhost/{PROFILE}",
            },
        },
        "spec": {
            "privileged": False,
            "allowPrivilegeEscalation": False,
            "requiredDropCapabilities": ["ALL"],
            "hostNetwork": False,
            "hostPID": False,
            "hostIPC": False,
            "readOnlyRootFilesystem": True,
            "runAsUser": {"rule": "MustRunAsNonRoot"},
            "runAsGroup": {"rule": "MustRunAs", "ranges": [{"min": 1, "max": 65535}]},
            "fsGroup": {"rule": "MustRunAs", "ranges": [{"min": 1, "max": 65535}]},
            "supplementalGroups": {"rule": "MustRunAs", "ranges": [{"min": 1, "max": 65535}]},
            "seLinux": {"rule": "RunAsAny"},
            "volumes": [
                "configMap",
                "emptyDir",
                "projected",
                "secret",
                "downwardAPI",
                "persistentVolumeClaim",
            ],
        },
    }


def _service_account_client(kube_api: Any, namespace: str, account: str) -> client.ApiClient:
    """A client that authenticates with the account's own token (its legacy token Secret)."""
    core = client.CoreV1Api(kube_api)

    def token() -> str | None:
        sa = core.read_namespaced_service_account(account, namespace)
        for ref in sa.secrets or []:
            secret = core.read_namespaced_secret(ref.name, namespace)
            if (
                secret.type == "kubernetes.io/service-account-token"
                and secret.data
                and "token" in secret.data
            ):
                return base64.b64decode(secret.data["token"]).decode()
        return None

    bearer = wait_until("the service account's token", token, timeout=30)
    cfg = client.Configuration()
    cfg.host = kube_api.configuration.host
    cfg.ssl_ca_cert = kube_api.configuration.ssl_ca_cert
    cfg.api_key = {"authorization": f"Bearer {bearer}"}
    return client.ApiClient(cfg)


def test_a_restricted_psp_refuses_a_privileged_pod(
    kube_api: Any,
    namespace: str,
    restricted_policy: str,
    kube_cleanup: Callable[[Callable[[], object]], None],
) -> None:
    rbac = client.RbacAuthorizationV1Api(kube_api)
    psp_name = restricted_policy
    rbac.create_cluster_role(
        client.V1ClusterRole(
            metadata=client.V1ObjectMeta(name=psp_name),
            rules=[
                client.V1PolicyRule(
                    api_groups=["policy"],
                    resources=["podsecuritypolicies"],
                    verbs=["use"],
                    resource_names=[psp_name],
                )
            ],
        )
    )
    kube_cleanup(lambda: rbac.delete_cluster_role(psp_name))
    client.CoreV1Api(kube_api).create_namespaced_service_account(
        namespace, client.V1ServiceAccount(metadata=client.V1ObjectMeta(name="creator"))
    )
    rbac.create_namespaced_role(
        namespace,
        client.V1Role(
            metadata=client.V1ObjectMeta(name="pod-creator"),
            rules=[client.V1PolicyRule(api_groups=[""], resources=["pods"], verbs=["create"])],
        ),
    )
    subject = client.RbacV1Subject(kind="ServiceAccount", name="creator", namespace=namespace)
    for binding, kind, role in (("pods", "Role", "pod-creator"), ("psp", "ClusterRole", psp_name)):
        rbac.create_namespaced_role_binding(
            namespace,
            client.V1RoleBinding(
                metadata=client.V1ObjectMeta(name=binding),
                role_ref=client.V1RoleRef(api_group="rbac.authorization.k8s.io", kind=kind, name=role),
                subjects=[subject],
            ),
        )
    creator = client.CoreV1Api(_service_account_client(kube_api, namespace, "creator"))

    # The hardened spec passes the restricted policy: the refusals below are the policy's doing.
    creator.create_namespaced_pod(namespace, hardened_pod("fine", "none"), dry_run="All")

    def refused(pod: client.V1Pod) -> str:
        with pytest.raises(ApiException) as caught:
            creator.create_namespaced_pod(namespace, pod, dry_run="All")
        assert caught.value.status == 403
        body = caught.value.body or ""
        assert "PodSecurityPolicy: unable to admit pod" in body
        return str(body)

    privileged = hardened_pod("privileged", "none")
    privileged.spec.containers[0].security_context.privileged = True
    assert "Privileged containers are not allowed" in refused(privileged)

    root = hardened_pod("root", "none")
    root.spec.security_context.run_as_user = 0
    assert "running with the root UID is forbidden" in refused(root)

    host_path = hardened_pod("hostpath", "none")
    host_path.spec.volumes.append(
        client.V1Volume(name="host", host_path=client.V1HostPathVolumeSource(path="/"))
    )
    assert "hostPath volumes are not allowed" in refused(host_path)
