"""`docbroker doctor`'s network-policy check on the live lab: it reads the lab overlay's
NetworkPolicies and the API server's real endpoints back from the cluster, and says what is
wrong with them there (the lab keeps the base's placeholders: its bridge CNI enforces nothing);
with the broker's own credentials, which may not read policies, it is a warning."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from broker.runtime.kubernetes import names
from broker.runtime.kubernetes.client import api_client
from broker.runtime.kubernetes.doctor import UNREAD_ENDPOINTS, _apiserver_endpoints, _network_policies
from broker.testing.kubernetes_lab import Lab, _token_kubeconfig
from tests.kubernetes.conftest import wait_until

pytestmark = pytest.mark.kubernetes
NS = names.TENANTS_NAMESPACE


def test_the_doctor_reads_the_policies_and_the_api_server_endpoints_from_the_cluster(lab: Lab) -> None:
    endpoints = _apiserver_endpoints(lab.admin)
    assert endpoints, "the admin reads the kubernetes Service's endpoints"
    level, detail = _network_policies(lab.admin, NS)
    assert level == "FAIL"
    assert "placeholder addresses (203.0.113.x) left in: apiserver-egress, database-egress" in detail
    for endpoint in endpoints:  # the real API server, which the placeholder rule does not reach
        assert f"{endpoint.ip}:{endpoint.port}" in detail
    assert "no default-deny" not in detail and "must have no egress" not in detail  # those hold
    broker = api_client(lab.broker_kubeconfig)
    try:
        level, detail = _network_policies(broker, NS)
    finally:
        broker.close()
    assert level == "WARN" and "may not read NetworkPolicies" in detail


def test_endpoints_it_may_not_read_are_said_not_checked_never_passed(
    lab: Lab, namespace: str, tmp_path: Path, kube_cleanup: Callable[[Callable[[], object]], None]
) -> None:
    """Credentials that may read the NetworkPolicies but not the API server's endpoints: the
    API server's rule is reported as not checked (it was passed as reachable, silently)."""
    from kubernetes import client

    core, rbac = client.CoreV1Api(lab.admin), client.RbacAuthorizationV1Api(lab.admin)
    account = "policy-reader"
    core.create_namespaced_service_account(namespace, {"metadata": {"name": account}})
    rule = {"apiGroups": ["networking.k8s.io"], "resources": ["networkpolicies"], "verbs": ["list"]}
    for ns in (names.BROKER_NAMESPACE, NS):
        meta = {"name": f"{namespace}-policy-reader", "namespace": ns}
        rbac.create_namespaced_role(ns, {"metadata": meta, "rules": [rule]})
        kube_cleanup(lambda ns=ns, name=meta["name"]: rbac.delete_namespaced_role(name, ns))
        subject = {"kind": "ServiceAccount", "name": account, "namespace": namespace}
        role_ref = {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": meta["name"]}
        binding = {"metadata": meta, "subjects": [subject], "roleRef": role_ref}
        rbac.create_namespaced_role_binding(ns, binding)
        kube_cleanup(lambda ns=ns, name=meta["name"]: rbac.delete_namespaced_role_binding(name, ns))
    kubeconfig = tmp_path / "reader.kubeconfig"
    kubeconfig.write_text(_token_kubeconfig(lab.admin, lab.kubeconfig, account, namespace))
    reader = api_client(kubeconfig)
    try:
        assert _apiserver_endpoints(reader) is None  # 403: may not read them
        level, detail = wait_until(
            "the Roles in force", lambda: _readable(_network_policies(reader, NS)), timeout=30
        )
    finally:
        reader.close()
    assert level == "FAIL"  # the lab's placeholders, read with these credentials
    assert UNREAD_ENDPOINTS in detail


def _readable(verdict: tuple[str, str]) -> tuple[str, str] | None:
    return None if "may not read NetworkPolicies" in verdict[1] else verdict
