"""broker/runtime/kubernetes/netpolicy.py, the doctor's reading of the NetworkPolicies, on what
k8s/ renders: the base's placeholders are found, the production overlay passes on the cluster
it was written for and fails on one whose API server is on another port, and each promise the
base makes (default-deny, no tenant egress) is missed when broken."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

from broker.runtime.kubernetes.netpolicy import Endpoint, problems
from tests.k8s_manifests.render import render, render_with_component

BROKER, TENANTS = "docbroker", "docbroker-tenants"


def by_namespace(docs: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    found: dict[str, list[dict[str, Any]]] = {}
    for doc in docs:
        if doc["kind"] == "NetworkPolicy":
            found.setdefault(doc["metadata"]["namespace"], []).append(doc)
    return found


def check(policies: dict[str, list[dict[str, Any]]], *apiserver: Endpoint, cilium: bool = False) -> list[str]:
    return problems(
        policies,
        broker_namespace=BROKER,
        tenants_namespace=TENANTS,
        apiserver=list(apiserver) or None,
        cilium_apiserver=cilium,
    )


def test_the_production_overlay_passes_where_its_api_server_is() -> None:
    policies = by_namespace(render("overlays/production"))
    assert check(policies, Endpoint("10.0.0.1", 6443)) == []
    # the same overlay on a managed cluster whose API server serves on 443, or elsewhere
    assert check(policies, Endpoint("10.0.0.1", 443)) == [
        "no egress rule lets the brokers reach the API server at 10.0.0.1:443 "
        "(apiserver-egress: its address and port; on Cilium the apiserver-cilium component)"
    ]
    assert "10.0.9.9:6443" in check(policies, Endpoint("10.0.9.9", 6443))[0]


def test_the_base_placeholders_are_found() -> None:
    found = check(by_namespace(render("base")), Endpoint("10.0.0.1", 443))
    assert found[0] == "placeholder addresses (203.0.113.x) left in: apiserver-egress, database-egress"
    assert "10.0.0.1:443" in found[1]


def test_the_cilium_component_is_taken_for_the_api_server_rule(tmp_path: Path) -> None:
    policies = by_namespace(render_with_component(tmp_path, "apiserver-cilium"))
    without = check(policies, Endpoint("10.0.0.1", 443))
    assert any("reach the API server" in p for p in without)
    assert not any(
        "reach the API server" in p for p in check(policies, Endpoint("10.0.0.1", 443), cilium=True)
    )


def test_a_missing_default_deny_and_tenant_egress_are_found() -> None:
    policies = by_namespace(render("overlays/production"))
    broken = copy.deepcopy(policies)
    broken[TENANTS] = [p for p in broken[TENANTS] if p["metadata"]["name"] != "default-deny"]
    leak = copy.deepcopy(next(p for p in broken[TENANTS] if p["metadata"]["name"] == "sandbox-from-broker"))
    leak["metadata"]["name"] = "leak"
    leak["spec"] = {
        "podSelector": {},
        "policyTypes": ["Egress"],
        "egress": [{"to": [{"ipBlock": {"cidr": "0.0.0.0/0"}}]}],
    }
    broken[TENANTS].append(leak)
    assert check(broken, Endpoint("10.0.0.1", 6443)) == [
        "no default-deny (all Pods, Ingress and Egress) in docbroker-tenants",
        "the tenants' Pods must have no egress; allowed by: leak",
    ]


def test_the_managed_overlay_passes_on_its_cluster() -> None:
    assert check(by_namespace(render("overlays/managed")), Endpoint("172.16.0.2", 443)) == []
