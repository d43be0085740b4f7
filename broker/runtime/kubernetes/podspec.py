"""The tenant's Pod and Secret as plain API objects (dicts), built from settings alone.

Pure functions: the backend sends them, tests run the restricted-profile check over them,
`docbroker tenant manifest` prints the Secret. The Pod, and why:

- `server` (uid 10001) runs the document tools on TCP 8080 with the bearer check on
  (DOCS_SANDBOX_KEY_FILE), under the project's seccomp profile when one is installed on the
  node (`localhost/...`), else RuntimeDefault (a fallback `describe()` reports). It mounts
  the sources PVC read-only, the drop-box (a folder of an emptyDir) read-write, and from the
  tenant's Secret only `approval-secret` and `sandbox-key`.
- `keeper` (uid 10002, the broker image) alone mounts the reports PVC and alone holds
  `keeper-key`: the server can create a report in the drop-box, and never reach one the
  keeper accepted (DESIGN §7): a volume a container does not mount does not exist for it.
- The drop-box folder (in an emptyDir), owned by the keeper, mode 1733: the server may create
  files in it, not list it, not remove what is not its own. The keeper's postStart hook makes
  it. The kubelet starts a Pod's containers in order and runs each one's postStart hook before
  it starts the next (1.20's kuberuntime_manager, SyncPod step 7), so the keeper comes first
  and the folder exists before the server's subPath mount would make it (as root, 0777). The
  keeper itself refuses to serve a drop-box that is not its own 1733. Why not an init
  container: it cost a second of every first call (another container's lifecycle, and the
  kubelet notices its exit only at its next relist, once a second), measured on the lab.
- Pod: no ServiceAccount token, no service links, non-root with non-zero gids, every
  capability dropped, no privilege escalation, read-only root fs, limits on every container,
  `restartPolicy: Never` (the broker replaces a crashed Pod: the lifecycle decides, not the kubelet).
"""

from __future__ import annotations

import base64
from typing import Any

from broker.master_key import keeper_key, sandbox_key, tenant_secret
from broker.runtime.kubernetes import names
from broker.settings import KubernetesSettings
from broker.types import DROPBOX_MODE

SERVER_UID = 10001
KEEPER_UID = 10002
POD_GID = 10001  # fsGroup too: the keeper reads the server's drop-box files (mode 0o040) by it
DOCS_ROOT = "/srv/docs"
SERVER_SECRETS = "/run/secrets/docbroker"
KEEPER_SECRETS = "/run/secrets/keeper"
KEEPER_DROPBOX_MOUNT = "/dropbox"
DROPBOX_FOLDER = "reports"  # inside the emptyDir; the server sees it as DOCS_ROOT/reports
KEEPER_REPORTS = "/reports"
SERVER_COMMAND = ["/opt/venv/bin/python", "-OO", "-m", "server", "--http", f"0.0.0.0:{names.MCP_PORT}"]
KEEPER_COMMAND = ["/opt/venv/bin/python", "-m", "broker.keeper", "--http", f"0.0.0.0:{names.KEEPER_PORT}"]
# mkdir under the umask, then chmod: the mode must be exactly 1733 whatever the umask. -I -S:
# no site-packages, no environment: the hook needs `os` only, and starts in milliseconds.
MAKE_DROPBOX = (
    "/opt/venv/bin/python",
    "-I",
    "-S",
    "-c",
    f"import os; p = '{KEEPER_DROPBOX_MOUNT}/{DROPBOX_FOLDER}'; "
    f"os.path.isdir(p) or os.mkdir(p); os.chmod(p, {DROPBOX_MODE:#o})",
)
# A limit of a whole CPU: the keeper's Python start-up is on every first call's path (the
# broker waits for both ports), and 250m made it four times slower. Idle, it uses next to none.
KEEPER_RESOURCES = {"cpu": "1", "memory": "96Mi"}
# The CPU the scheduler reserves per container: about an idle one's use. CPU requests equal
# to the limits would reserve a core per tenant Pod, and a node would fit as many idle tenants
# as it has cores; the limits still bound each one. Memory is reserved as limited (no overcommit).
CPU_REQUEST_MILLI = {"server": 50, "keeper": 10}


def seccomp_profile(setting: str) -> dict[str, str]:
    """The securityContext.seccompProfile for DOCBROKER_KUBE_SECCOMP."""
    if setting.startswith("localhost/"):
        return {"type": "Localhost", "localhostProfile": setting.removeprefix("localhost/")}
    return {"type": "RuntimeDefault"}


def _container_security(uid: int, seccomp: dict[str, str]) -> dict[str, Any]:
    return {
        "runAsNonRoot": True,
        "runAsUser": uid,
        "runAsGroup": POD_GID,
        "allowPrivilegeEscalation": False,
        "privileged": False,
        "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"]},
        "seccompProfile": seccomp,
    }


def _limits(resources: dict[str, str], cpu_request_milli: int | None = None) -> dict[str, Any]:
    requests = dict(resources)
    if cpu_request_milli is not None:
        requests["cpu"] = f"{min(cpu_request_milli, _millicores(resources['cpu']))}m"
    return {"limits": dict(resources), "requests": requests}


def _millicores(quantity: str) -> int:
    """A CPU quantity ("1", "0.5", "500m") in millicores, at least 1."""
    value = float(quantity[:-1]) if quantity.endswith("m") else float(quantity) * 1000
    return max(1, int(value))


def tenant_pod(settings: KubernetesSettings, tenant: str, *, instance: str, replica: str) -> dict[str, Any]:
    name = names.object_name(tenant)
    runtime_default = seccomp_profile("RuntimeDefault")
    server_env = [
        {"name": "DOCS_ROOT", "value": DOCS_ROOT},
        {"name": "DOCS_SCOPE", "value": tenant},
        {"name": "DOCS_SECRET_FILE", "value": f"{SERVER_SECRETS}/approval.key"},
        {"name": "DOCS_SANDBOX_KEY_FILE", "value": f"{SERVER_SECRETS}/sandbox.key"},
        # The SDK's Host check (DNS rebinding, a browser's attack): the pod IP, for clients
        # that name it, and `localhost`, which the broker's upstream client always sends. The
        # bearer is the guard on the pod network; the Host list only keeps browsers out.
        {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
        {"name": "DOCS_ALLOWED_HOSTS", "value": f"$(POD_IP):{names.MCP_PORT},localhost"},
    ]
    server = {
        "name": "server",
        "image": settings.server_image,
        "imagePullPolicy": settings.image_pull_policy,
        "command": SERVER_COMMAND,
        "env": server_env,
        "ports": [{"name": "mcp", "containerPort": names.MCP_PORT, "protocol": "TCP"}],
        "readinessProbe": {
            # TCP, not HTTP: every HTTP request needs the bearer, which the kubelet has not.
            "tcpSocket": {"port": names.MCP_PORT},
            "periodSeconds": 1,
            "failureThreshold": 3,
        },
        "resources": _limits(
            {"cpu": settings.cpu_limit, "memory": settings.memory_limit}, CPU_REQUEST_MILLI["server"]
        ),
        "securityContext": _container_security(SERVER_UID, seccomp_profile(settings.seccomp)),
        "volumeMounts": [
            {"name": "sources", "mountPath": f"{DOCS_ROOT}/sources", "readOnly": True},
            {"name": "dropbox", "mountPath": f"{DOCS_ROOT}/reports", "subPath": DROPBOX_FOLDER},
            {"name": "server-secret", "mountPath": SERVER_SECRETS, "readOnly": True},
            {"name": "tmp", "mountPath": "/tmp"},  # noqa: S108 - the sandbox's one scratch place
        ],
    }
    keeper = {
        "name": "keeper",
        "image": settings.keeper_image,
        "imagePullPolicy": settings.image_pull_policy,
        "command": KEEPER_COMMAND,
        "env": [
            {"name": "KEEPER_DROPBOX", "value": f"{KEEPER_DROPBOX_MOUNT}/{DROPBOX_FOLDER}"},
            {"name": "KEEPER_REPORTS", "value": KEEPER_REPORTS},
            {"name": "KEEPER_KEY_FILE", "value": f"{KEEPER_SECRETS}/keeper.key"},
        ],
        "ports": [{"name": "keeper", "containerPort": names.KEEPER_PORT, "protocol": "TCP"}],
        "readinessProbe": {
            "tcpSocket": {"port": names.KEEPER_PORT},
            "periodSeconds": 1,
            "failureThreshold": 3,
        },
        "lifecycle": {"postStart": {"exec": {"command": list(MAKE_DROPBOX)}}},
        "resources": _limits(KEEPER_RESOURCES, CPU_REQUEST_MILLI["keeper"]),
        "securityContext": _container_security(KEEPER_UID, runtime_default),
        "volumeMounts": [
            {"name": "dropbox", "mountPath": KEEPER_DROPBOX_MOUNT},
            {"name": "reports", "mountPath": KEEPER_REPORTS},
            {"name": "keeper-secret", "mountPath": KEEPER_SECRETS, "readOnly": True},
        ],
    }
    spec: dict[str, Any] = {
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "restartPolicy": "Never",
        "terminationGracePeriodSeconds": 5,
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": SERVER_UID,
            "runAsGroup": POD_GID,
            "fsGroup": POD_GID,
            "supplementalGroups": [POD_GID],  # explicit: a PSP would otherwise add its range's first gid
            "seccompProfile": runtime_default,
        },
        "containers": [keeper, server],  # this order: the keeper's hook makes the drop-box first
        "volumes": [
            {
                "name": "sources",
                "persistentVolumeClaim": {"claimName": names.sources_claim(tenant), "readOnly": True},
            },
            {"name": "reports", "persistentVolumeClaim": {"claimName": names.reports_claim(tenant)}},
            {"name": "dropbox", "emptyDir": {"sizeLimit": "16Mi"}},
            {"name": "tmp", "emptyDir": {"medium": "Memory", "sizeLimit": "8Mi"}},
            {
                "name": "server-secret",
                "secret": {
                    "secretName": name,
                    "defaultMode": 0o440,
                    "items": [
                        {"key": names.KEY_APPROVAL, "path": "approval.key"},
                        {"key": names.KEY_SANDBOX, "path": "sandbox.key"},
                    ],
                },
            },
            {
                "name": "keeper-secret",
                "secret": {
                    "secretName": name,
                    "defaultMode": 0o440,
                    "items": [{"key": names.KEY_KEEPER, "path": "keeper.key"}],
                },
            },
        ],
    }
    if settings.runtime_class:
        spec["runtimeClassName"] = settings.runtime_class
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": settings.namespace,
            "labels": {**names.common_labels(tenant, instance), names.REPLICA: names.label_value(replica)},
        },
        "spec": spec,
    }


def tenant_secret_object(master_key: bytes, tenant: str, *, namespace: str, instance: str) -> dict[str, Any]:
    """The tenant's Secret: the three per-tenant keys derived from the master key."""
    values = {
        names.KEY_APPROVAL: tenant_secret(master_key, tenant),
        names.KEY_SANDBOX: sandbox_key(master_key, tenant),
        names.KEY_KEEPER: keeper_key(master_key, tenant),
    }
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "type": "Opaque",
        "metadata": {
            "name": names.object_name(tenant),
            "namespace": namespace,
            "labels": names.common_labels(tenant, instance),
        },
        "data": {
            key: base64.b64encode(value.encode("ascii")).decode("ascii") for key, value in values.items()
        },
    }
