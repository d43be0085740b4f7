"""`docbroker doctor`'s network-policy check on the live lab: it reads the lab overlay's
NetworkPolicies and the API server's real endpoints back from the cluster, and says what is
wrong with them there (the lab keeps the base's placeholders: its bridge CNI enforces nothing);
with the broker's own credentials, which may not read policies, it is a warning."""

from __future__ import annotations

import pytest

from broker.runtime.kubernetes import names
from broker.runtime.kubernetes.client import api_client
from broker.runtime.kubernetes.doctor import _apiserver_endpoints, _network_policies
from broker.testing.kubernetes_lab import Lab

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
