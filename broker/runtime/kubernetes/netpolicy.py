"""The broker's own reading of its NetworkPolicies (`docbroker doctor`, "network policies").

What the API can show, checked against what k8s/base promises: a default-deny in both
namespaces, no egress at all for the tenants' Pods, no placeholder address left from the base
(203.0.113.0/24), and an egress rule that reaches the API server at its real address and port
(the `kubernetes` Service's endpoints, which NetworkPolicy matches after translation: 443 on
most managed clusters, 6443 on kubeadm ones), or a Cilium policy naming the `kube-apiserver`
entity instead. Whether the CNI enforces any of it cannot be seen through the API.

Pure: policies and endpoints in, problems out (the doctor reads them from the API; the
offline tests give the rendered manifests).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

PLACEHOLDERS = ipaddress.IPv4Network("203.0.113.0/24")  # TEST-NET-3: the base's, routed nowhere
BROKER_LABELS = {
    "app.kubernetes.io/name": "docbroker-broker",
    "app.kubernetes.io/component": "broker",
    "app.kubernetes.io/part-of": "docbroker",
    "docbroker.io/database-client": "true",
}


@dataclass(frozen=True)
class Endpoint:
    ip: str
    port: int


def problems(
    policies: Mapping[str, Sequence[Mapping[str, Any]]],
    *,
    broker_namespace: str,
    tenants_namespace: str,
    apiserver: Sequence[Endpoint] | None,
    cilium_apiserver: bool = False,
) -> list[str]:
    """What is wrong, one fixed text each (empty: nothing). `policies`: namespace → its
    NetworkPolicies as the API serialises them; `apiserver`: None when they could not be read."""
    found: list[str] = []
    for namespace in (broker_namespace, tenants_namespace):
        if not any(_denies_all(p) for p in policies.get(namespace, ())):
            found.append(f"no default-deny (all Pods, Ingress and Egress) in {namespace}")
    open_egress = [_name(p) for p in policies.get(tenants_namespace, ()) if _spec(p).get("egress")]
    if open_egress:
        found.append(f"the tenants' Pods must have no egress; allowed by: {', '.join(sorted(open_egress))}")
    placeholders = sorted(
        {_name(p) for ps in policies.values() for p in ps for cidr in _cidrs(p) if _placeholder(cidr)}
    )
    if placeholders:
        found.append(f"placeholder addresses (203.0.113.x) left in: {', '.join(placeholders)}")
    if apiserver and not cilium_apiserver:
        brokers = [p for p in policies.get(broker_namespace, ()) if _selects_brokers(p)]
        unreached = [e for e in apiserver if not any(_reaches(p, e) for p in brokers)]
        if unreached:
            at = ", ".join(f"{e.ip}:{e.port}" for e in unreached)
            found.append(
                f"no egress rule lets the brokers reach the API server at {at} "
                "(apiserver-egress: its address and port; on Cilium the apiserver-cilium component)"
            )
    return found


def _spec(policy: Mapping[str, Any]) -> Mapping[str, Any]:
    spec: Mapping[str, Any] = policy.get("spec") or {}
    return spec


def _name(policy: Mapping[str, Any]) -> str:
    return str((policy.get("metadata") or {}).get("name", "?"))


def _denies_all(policy: Mapping[str, Any]) -> bool:
    spec = _spec(policy)
    selector = spec.get("podSelector") or {}
    return (
        not selector.get("matchLabels")
        and not selector.get("matchExpressions")
        and {"Ingress", "Egress"} <= set(spec.get("policyTypes") or ())
        and not spec.get("ingress")
        and not spec.get("egress")
    )


def _selects_brokers(policy: Mapping[str, Any]) -> bool:
    selector = _spec(policy).get("podSelector") or {}
    if selector.get("matchExpressions"):
        return False  # not ours: the base selects by labels only
    labels = selector.get("matchLabels") or {}
    return all(BROKER_LABELS.get(k) == v for k, v in labels.items())


def _cidrs(policy: Mapping[str, Any]) -> Iterable[str]:
    for rule in _spec(policy).get("egress") or ():
        for peer in rule.get("to") or ():
            block = peer.get("ipBlock")
            if block and block.get("cidr"):
                yield str(block["cidr"])


def _placeholder(cidr: str) -> bool:
    try:
        network = ipaddress.ip_network(cidr, strict=False)
    except (ValueError, TypeError):
        return False
    return isinstance(network, ipaddress.IPv4Network) and network.subnet_of(PLACEHOLDERS)


def _reaches(policy: Mapping[str, Any], endpoint: Endpoint) -> bool:
    address = ipaddress.ip_address(endpoint.ip)
    for rule in _spec(policy).get("egress") or ():
        ports = rule.get("ports") or ()
        if ports and not any(_port_matches(p, endpoint.port) for p in ports):
            continue
        peers = rule.get("to") or ()
        if not peers:
            return True  # to anywhere on these ports
        for peer in peers:
            block = peer.get("ipBlock")
            if block and _in_block(address, block):
                return True
    return False


def _port_matches(port: Mapping[str, Any], number: int) -> bool:
    if (port.get("protocol") or "TCP") != "TCP":
        return False
    value = port.get("port")
    if value is None:
        return True  # every port
    if not isinstance(value, int):
        return False  # a named port: never the API server's
    end = port.get("endPort") or value
    return bool(value <= number <= end)


def _in_block(address: ipaddress.IPv4Address | ipaddress.IPv6Address, block: Mapping[str, Any]) -> bool:
    try:
        if address not in ipaddress.ip_network(block["cidr"], strict=False):
            return False
        return not any(address in ipaddress.ip_network(e, strict=False) for e in block.get("except") or ())
    except (ValueError, TypeError):
        return False
