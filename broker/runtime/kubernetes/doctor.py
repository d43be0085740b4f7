"""`docbroker doctor` on a cluster: API reachable, RBAC exactly enough, namespaces labelled,
the NetworkPolicies as the base promises them (netpolicy.py), the seccomp profile on the nodes.

Each check returns (level, detail) for broker/doctor.py's report. RBAC is asked of the API
itself (SelfSubjectAccessReview, open to every authenticated user): for each verb the runtime
uses, and for what it must never have (reading secrets, exec into pods, wildcards). The
seccomp profile cannot be seen through the API, so a short Pod is started under it: the
kubelet refuses to start a container whose `Localhost` profile is missing.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from broker.runtime.base import BackendRefused
from broker.runtime.kubernetes import names, netpolicy
from broker.runtime.kubernetes.client import api_client, status_of
from broker.runtime.kubernetes.podspec import seccomp_profile
from broker.settings import KubernetesSettings

OK, WARN, FAIL = "OK", "WARN", "FAIL"
Check = tuple[str, Callable[[], tuple[str, str]]]

# (verb, resource, subresource) in the tenants namespace
NEEDED = [
    # patch: the last-use annotation (lastuse.py). It could also change a Pod's image, which
    # create and delete already allow: it grants nothing new.
    *(("pods", verb, "") for verb in ("create", "get", "list", "watch", "patch", "delete")),
    *(("secrets", verb, "") for verb in ("create", "patch", "delete")),
]
REFUSED = [
    *(("secrets", verb, "") for verb in ("get", "list", "watch")),
    ("pods", "create", "exec"),
    ("pods", "get", "exec"),
    ("pods", "create", "attach"),
    ("pods", "create", "portforward"),
    ("*", "*", ""),
]
PSA_LABELS = ("enforce", "audit", "warn")
PROBE_NAME = "docbroker-doctor-seccomp"
PROBE_SECONDS = 60.0


def cluster_checks(settings: KubernetesSettings) -> list[Check]:
    state: dict[str, Any] = {}

    def api() -> Any:
        if "api" not in state:
            state["api"] = api_client(settings.kubeconfig)
        return state["api"]

    checks: list[tuple[str, Callable[[Any], tuple[str, str]]]] = [
        ("kubernetes api", _reachable),
        ("rbac needed", lambda a: _rbac_needed(a, settings.namespace)),
        ("rbac refused", lambda a: _rbac_refused(a, settings.namespace)),
        ("namespaces", lambda a: _namespaces(a, settings.namespace)),
        ("network policies", lambda a: _network_policies(a, settings.namespace)),
        ("seccomp profile", lambda a: _seccomp(a, settings)),
    ]
    return [(what, _clean(check, api)) for what, check in checks]


def _clean(check: Callable[[Any], tuple[str, str]], api: Callable[[], Any]) -> Callable[[], tuple[str, str]]:
    """A check whose API call fails says so in one line (the status, or that nothing answered)."""

    def run() -> tuple[str, str]:
        try:
            return check(api())
        except BackendRefused as exc:
            return FAIL, str(exc)
        except Exception as exc:
            return FAIL, f"the Kubernetes API failed ({_why(exc)})"

    return run


def _reachable(api: Any) -> tuple[str, str]:
    from kubernetes import client

    try:
        version = client.VersionApi(api).get_code(_request_timeout=10)
    except Exception as exc:
        return FAIL, f"does not answer at {api.configuration.host} ({_why(exc)})"
    return OK, f"{version.git_version} at {api.configuration.host}"


def allowed(api: Any, namespace: str, resource: str, verb: str, subresource: str = "") -> bool:
    """Does the API grant these credentials `verb` on `resource` in `namespace`?"""
    from kubernetes import client

    attributes = client.V1ResourceAttributes(
        namespace=namespace, resource=resource, verb=verb, subresource=subresource or None
    )
    review = client.V1SelfSubjectAccessReview(
        spec=client.V1SelfSubjectAccessReviewSpec(resource_attributes=attributes)
    )
    answer: Any = client.AuthorizationV1Api(api).create_self_subject_access_review(
        review, _request_timeout=10
    )
    return bool(answer.status is not None and answer.status.allowed)


def _label(resource: str, verb: str, subresource: str) -> str:
    return f"{verb} {resource}{'/' + subresource if subresource else ''}"


def _rbac_needed(api: Any, namespace: str) -> tuple[str, str]:
    missing = [_label(*item) for item in NEEDED if not allowed(api, namespace, *item)]
    if missing:
        return FAIL, f"in {namespace} these credentials lack: {', '.join(missing)} (apply k8s/base/rbac.yaml)"
    return OK, f"pods create/get/list/watch/patch/delete, secrets create/patch/delete in {namespace}"


def _rbac_refused(api: Any, namespace: str) -> tuple[str, str]:
    granted = [_label(*item) for item in REFUSED if allowed(api, namespace, *item)]
    if granted:
        return FAIL, f"in {namespace} these credentials must not have: {', '.join(granted)}"
    return OK, f"no secret reads, no pods/exec, no wildcards in {namespace}"


def _namespaces(api: Any, tenants: str) -> tuple[str, str]:
    from kubernetes import client

    core: Any = client.CoreV1Api(api)
    unlabelled = []
    for namespace in (names.BROKER_NAMESPACE, tenants):
        try:
            labels = core.read_namespace(namespace, _request_timeout=10).metadata.labels or {}
        except Exception as exc:
            if status_of(exc) == 403:
                return WARN, "these credentials may not read namespaces (the broker's need not): " + (
                    "run doctor with an admin kubeconfig (DOCBROKER_KUBECONFIG) to check the labels"
                )
            if status_of(exc) == 404:
                return FAIL, f"namespace {namespace} does not exist (kubectl apply -k k8s/overlays/...)"
            raise
        if any(labels.get(f"pod-security.kubernetes.io/{mode}") != "restricted" for mode in PSA_LABELS):
            unlabelled.append(namespace)
    if unlabelled:
        return (
            FAIL,
            f"not labelled pod-security.kubernetes.io/enforce,audit,warn=restricted: {', '.join(unlabelled)}",
        )
    return OK, f"{names.BROKER_NAMESPACE}, {tenants}: Pod Security restricted (enforce, audit, warn)"


def _network_policies(api: Any, tenants: str) -> tuple[str, str]:
    """The NetworkPolicies of both namespaces read back and checked (netpolicy.py), the API
    server's egress against its real endpoints. Reading them needs more than the broker's own
    RBAC: with its credentials this is a warning, as for the namespaces."""
    from kubernetes import client

    networking: Any = client.NetworkingV1Api(api)
    policies: dict[str, list[dict[str, Any]]] = {}
    for namespace in (names.BROKER_NAMESPACE, tenants):
        try:
            items = networking.list_namespaced_network_policy(namespace, _request_timeout=10).items
        except Exception as exc:
            if status_of(exc) == 403:
                return WARN, "these credentials may not read NetworkPolicies (the broker's need not): " + (
                    "run doctor with an admin kubeconfig (DOCBROKER_KUBECONFIG) to check them"
                )
            raise
        policies[namespace] = [api.sanitize_for_serialization(item) for item in items]
    apiserver = _apiserver_endpoints(api)
    found = netpolicy.problems(
        policies,
        broker_namespace=names.BROKER_NAMESPACE,
        tenants_namespace=tenants,
        apiserver=apiserver,
        cilium_apiserver=_cilium_apiserver_policy(api),
    )
    if apiserver is None:  # unknown is said, never passed as reachable
        found.append(UNREAD_ENDPOINTS)
    if found:
        return (WARN if found == [UNREAD_ENDPOINTS] else FAIL), "; ".join(found)
    return OK, (
        f"default-deny in {names.BROKER_NAMESPACE} and {tenants}, no tenant egress, the API server "
        "reachable by its rule (enforced only by a CNI that enforces NetworkPolicy)"
    )


UNREAD_ENDPOINTS = (
    "the API server's endpoints (default/kubernetes) may not be read with these credentials: "
    "the brokers' egress rule to it is not checked"
)


def _apiserver_endpoints(api: Any) -> list[netpolicy.Endpoint] | None:
    """The `kubernetes` Service's endpoints (where NetworkPolicy sees the API server), or None."""
    from kubernetes import client

    try:
        endpoints = client.CoreV1Api(api).read_namespaced_endpoints(
            "kubernetes", "default", _request_timeout=10
        )
    except Exception as exc:
        if status_of(exc) == 403:
            return None  # not readable with these credentials: that part is not checked, and said
        raise  # the API failing is a failed check (`_clean`), never a pass
    return [
        netpolicy.Endpoint(address.ip, port.port)
        for subset in endpoints.subsets or ()
        for address in subset.addresses or ()
        for port in subset.ports or ()
        if (port.protocol or "TCP") == "TCP"
    ]


def _cilium_apiserver_policy(api: Any) -> bool:
    """Whether the apiserver-cilium component's CiliumNetworkPolicy is there (False when Cilium's
    resources do not exist or cannot be read)."""
    from kubernetes import client

    try:
        client.CustomObjectsApi(api).get_namespaced_custom_object(
            "cilium.io", "v2", names.BROKER_NAMESPACE, "ciliumnetworkpolicies", "apiserver-egress",
            _request_timeout=10,
        )  # fmt: skip
    except Exception as exc:
        if status_of(exc) in (403, 404):  # no such policy or no Cilium: the ipBlock rule must hold
            return False
        raise
    return True


def _seccomp(api: Any, settings: KubernetesSettings) -> tuple[str, str]:
    if not settings.seccomp.startswith("localhost/"):
        return WARN, (
            "RuntimeDefault (fallback): a compromised server may chmod, rename or delete its own "
            "drop-box files; install the project's profile (k8s/components/seccomp-localhost)"
        )
    problem = _probe_pod(api, settings)
    if problem:
        return FAIL, f"{settings.seccomp}: {problem}"
    return OK, f"{settings.seccomp}: a pod ran under it"


def _probe_pod(api: Any, settings: KubernetesSettings) -> str | None:
    """Start a one-shot Pod under the profile; None when it ran, else why not."""
    from kubernetes import client

    core: Any = client.CoreV1Api(api)
    security = {
        "runAsNonRoot": True,
        "runAsUser": 10001,
        "runAsGroup": 10001,
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"]},
        "seccompProfile": seccomp_profile(settings.seccomp),
    }
    pod: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": PROBE_NAME,
            "labels": {names.PART_OF: "docbroker", names.COMPONENT: "doctor"},  # not a sandbox
        },
        "spec": {
            "automountServiceAccountToken": False,
            "enableServiceLinks": False,
            "restartPolicy": "Never",
            "securityContext": {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}},
            "containers": [
                {
                    "name": "probe",
                    "image": settings.server_image,
                    "imagePullPolicy": settings.image_pull_policy,
                    "command": ["/opt/venv/bin/python", "-c", "pass"],
                    "resources": {"limits": {"cpu": "200m", "memory": "64Mi"}},
                    "securityContext": security,
                }
            ],
        },
    }
    if settings.runtime_class:
        pod["spec"]["runtimeClassName"] = settings.runtime_class
    _remove(core, settings.namespace)
    try:
        core.create_namespaced_pod(settings.namespace, pod, _request_timeout=10)
    except Exception as exc:
        return f"the probe pod was refused ({_why(exc)})"
    try:
        deadline = time.monotonic() + PROBE_SECONDS
        while time.monotonic() < deadline:
            status = core.read_namespaced_pod(PROBE_NAME, settings.namespace, _request_timeout=10).status
            if status.phase == "Succeeded":
                return None
            for cs in status.container_statuses or ():
                waiting = cs.state.waiting if cs.state is not None else None
                if waiting is not None and waiting.reason in ("CreateContainerError", "RunContainerError"):
                    return "the kubelet cannot start a container under it (is it installed on every node?)"
                if waiting is not None and waiting.reason in ("ErrImageNeverPull", "InvalidImageName"):
                    return f"the probe could not get {settings.server_image} ({waiting.reason})"
            if status.phase == "Failed":
                return "the probe pod failed under it"
            time.sleep(0.5)
        return "the probe pod did not finish in time"
    finally:
        _remove(core, settings.namespace)


def _remove(core: Any, namespace: str) -> None:
    try:
        core.delete_namespaced_pod(PROBE_NAME, namespace, grace_period_seconds=0, _request_timeout=10)
    except Exception as exc:
        if status_of(exc) != 404:
            raise


def _why(exc: BaseException) -> str:
    status = status_of(exc)
    return f"HTTP {status}" if status is not None else type(exc).__name__
