"""`kubectl kustomize` renders every overlay, and what it renders is what docs/kubernetes.md
and the issue-18 contract promise: names, labels, RBAC verbs, NetworkPolicies, the broker's
Deployment, and a lab overlay that differs from the base only where 1.20 needs it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.k8s_manifests.render import (
    K8S,
    OVERLAYS,
    find,
    key,
    kustomize,
    relative,
    render,
    render_with_component,
)

RESTRICTED = {
    f"pod-security.kubernetes.io/{mode}{suffix}": value
    for mode in ("enforce", "audit", "warn")
    for suffix, value in (("", "restricted"), ("-version", "latest"))
}


@pytest.fixture(scope="module")
def rendered() -> dict[str, list[dict[str, Any]]]:
    return {name: render(name) for name in OVERLAYS}


def broker_container(docs: list[dict[str, Any]]) -> dict[str, Any]:
    spec = find(docs, "StatefulSet", "docbroker-broker", "docbroker")["spec"]["template"]["spec"]
    (container,) = spec["containers"]
    return container


def config(docs: list[dict[str, Any]]) -> dict[str, str]:
    data: dict[str, str] = find(docs, "ConfigMap", "docbroker-config-", "docbroker")["data"]
    return data


@pytest.mark.parametrize("name", OVERLAYS)
def test_namespaces_enforce_restricted(rendered: dict[str, list[dict[str, Any]]], name: str) -> None:
    for ns in ("docbroker", "docbroker-tenants"):
        labels = find(rendered[name], "Namespace", ns)["metadata"]["labels"]
        assert {k: labels.get(k) for k in RESTRICTED} == RESTRICTED


@pytest.mark.parametrize("name", OVERLAYS)
def test_rbac_is_exactly_the_runtime_verbs_in_the_tenants_namespace(
    rendered: dict[str, list[dict[str, Any]]], name: str
) -> None:
    docs = rendered[name]
    roles = [d for d in docs if d["kind"] in ("Role", "ClusterRole")]
    broker_roles = [r for r in roles if r["kind"] == "Role"]
    assert [(r["metadata"]["namespace"], r["metadata"]["name"]) for r in broker_roles] == [
        ("docbroker-tenants", "docbroker-broker")
    ]
    rules = {
        (tuple(r["apiGroups"]), tuple(r["resources"])): sorted(r["verbs"]) for r in broker_roles[0]["rules"]
    }
    assert rules == {
        (("",), ("pods",)): sorted(["create", "get", "list", "watch", "patch", "delete"]),
        (("",), ("secrets",)): sorted(["create", "patch", "delete"]),
    }
    for role in roles:
        for rule in role["rules"]:
            for field in ("apiGroups", "resources", "verbs", "resourceNames"):
                assert "*" not in rule.get(field, []), f"wildcard in {role['metadata']['name']}"
            assert "pods/exec" not in rule["resources"]
    # The only ClusterRole anywhere is the lab's PodSecurityPolicy `use`.
    for role in (r for r in roles if r["kind"] == "ClusterRole"):
        assert role["rules"] == [
            {
                "apiGroups": ["policy"],
                "resources": ["podsecuritypolicies"],
                "resourceNames": ["docbroker-restricted"],
                "verbs": ["use"],
            }
        ]
    assert not [d for d in docs if d["kind"] == "ClusterRoleBinding"]
    binding = find(docs, "RoleBinding", "docbroker-broker", "docbroker-tenants")
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "Role",
        "name": "docbroker-broker",
    }
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "docbroker-broker", "namespace": "docbroker"}
    ]


@pytest.mark.parametrize("name", OVERLAYS)
def test_network_policies(rendered: dict[str, list[dict[str, Any]]], name: str) -> None:
    docs = rendered[name]
    for ns in ("docbroker", "docbroker-tenants"):
        deny = find(docs, "NetworkPolicy", "default-deny", ns)["spec"]
        assert deny == {"podSelector": {}, "policyTypes": ["Ingress", "Egress"]}
    tenant_policies = [
        d for d in docs if d["kind"] == "NetworkPolicy" and d["metadata"]["namespace"] == "docbroker-tenants"
    ]
    # No policy in the tenants namespace allows any egress.
    assert all(not p["spec"].get("egress") for p in tenant_policies)
    ingress = find(docs, "NetworkPolicy", "sandbox-from-broker", "docbroker-tenants")["spec"]
    assert ingress["podSelector"] == {"matchLabels": {"app.kubernetes.io/component": "sandbox"}}
    (rule,) = ingress["ingress"]
    assert rule["from"] == [
        {
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "docbroker"}},
            "podSelector": {
                "matchLabels": {
                    "app.kubernetes.io/name": "docbroker-broker",
                    "app.kubernetes.io/component": "broker",
                }
            },
        }
    ]
    assert rule["ports"] == [{"protocol": "TCP", "port": 8080}, {"protocol": "TCP", "port": 8081}]
    broker_in = find(docs, "NetworkPolicy", "broker-ingress", "docbroker")["spec"]
    (admitted,) = broker_in["ingress"]
    assert admitted["ports"] == [{"protocol": "TCP", "port": 8000}]
    if name == "overlays/managed":  # the ingress controller is the brokers' only client
        assert admitted["from"] == [
            {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "ingress-nginx"}}}
        ]
    else:
        assert "from" not in admitted
    egress_policies = {
        d["metadata"]["name"]: d["spec"]
        for d in docs
        if d["kind"] == "NetworkPolicy"
        and d["metadata"]["namespace"] == "docbroker"
        and "egress" in d["spec"]
    }
    # One policy per destination: an overlay patches or swaps each alone.
    expected = {"dns-egress", "broker-egress", "apiserver-egress", "database-egress"}
    if name == "overlays/managed":
        expected.add("identity-provider-egress")  # its JWKS URL
    assert set(egress_policies) == expected
    for policy in egress_policies.values():
        for rule in policy["egress"]:
            # Every egress rule names both where and which ports: nothing open-ended.
            assert rule.get("to") and rule.get("ports")
            for peer in rule["to"]:
                cidr = peer.get("ipBlock", {}).get("cidr")
                assert cidr is None or cidr.endswith("/32")
    # The database is reached by the brokers and the db-upgrade Job, and by nothing else.
    database = {"matchLabels": {"docbroker.io/database-client": "true"}}
    assert egress_policies["database-egress"]["podSelector"] == database
    for kind, name in (("StatefulSet", "docbroker-broker"), ("Job", "docbroker-db-upgrade")):
        labels = find(docs, kind, name, "docbroker")["spec"]["template"]["metadata"]["labels"]
        assert labels["docbroker.io/database-client"] == "true"
    brokers = {"matchLabels": {"app.kubernetes.io/name": "docbroker-broker"}}
    assert egress_policies["apiserver-egress"]["podSelector"] == brokers


@pytest.mark.parametrize("name", OVERLAYS)
def test_the_schema_is_migrated_by_a_job_of_the_broker_image_as_the_schema_owner(
    rendered: dict[str, list[dict[str, Any]]], name: str
) -> None:
    """First install and upgrade: `docbroker db upgrade` from the broker's own image, with no
    Kubernetes API token, as the role that owns the schema (its own Secret, not the brokers')."""
    docs = rendered[name]
    job = find(docs, "Job", "docbroker-db-upgrade", "docbroker")
    spec = job["spec"]["template"]["spec"]
    (container,) = spec["containers"]
    assert container["args"] == ["db", "upgrade"]
    assert container["image"] == broker_container(docs)["image"]
    assert spec["automountServiceAccountToken"] is False and spec["restartPolicy"] == "Never"
    assert spec["serviceAccountName"] == "docbroker-db-upgrade"
    # no Role for it: RBAC binds it to nothing but the lab's PodSecurityPolicy (a ClusterRole)
    bound = [r for r in docs if r["kind"] == "RoleBinding" and r["roleRef"]["kind"] == "Role"]
    assert not [r for r in bound if any(s["name"] == "docbroker-db-upgrade" for s in r["subjects"])]
    # Nothing in the template that changes between two applies of one release: a Job's
    # template is immutable, so a generated ConfigMap's hash there would fail every apply.
    assert "envFrom" not in container
    refs = [e["valueFrom"] for e in container["env"] if "valueFrom" in e]
    assert {"secretKeyRef": {"name": "docbroker-database-migrate", "key": "url"}} in refs or name.endswith(
        "lab"
    )


@pytest.mark.parametrize("name", OVERLAYS)
def test_broker_deployment(rendered: dict[str, list[dict[str, Any]]], name: str) -> None:
    docs = rendered[name]
    deployment = find(docs, "StatefulSet", "docbroker-broker", "docbroker")
    spec = deployment["spec"]["template"]["spec"]
    assert deployment["spec"]["replicas"] == int(config(docs)["DOCBROKER_REPLICAS"]) >= 2
    assert spec["serviceAccountName"] == "docbroker-broker" and spec["automountServiceAccountToken"] is True
    assert spec["topologySpreadConstraints"]
    container = broker_container(docs)
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert container["ports"] == [{"name": "http", "containerPort": 8000, "protocol": "TCP"}]
    env = {e["name"]: e for e in container["env"]}
    assert env["DOCBROKER_REPLICA_ID"]["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.name"}}
    cfg = config(docs)
    assert cfg["DOCBROKER_RUNTIME"] == "kubernetes" and cfg["DOCBROKER_PORT"] == "8000"
    assert cfg["DOCBROKER_KUBE_NAMESPACE"] == "docbroker-tenants"
    assert cfg["DOCBROKER_AUDIT_STDOUT"] == "true"
    # Key files live in the memory volume the init container fills from the Secret.
    mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
    files = ["DOCBROKER_MASTER_KEY_FILE", "DOCBROKER_AUDIT_KEY_FILE"]
    if not cfg.get("DOCBROKER_AUTH_JWKS_URL"):  # the managed overlay's keys come from the URL
        files.append("DOCBROKER_AUTH_JWKS_FILE")
    for var in files:
        assert cfg[var].startswith("/run/docbroker/keys/")
    assert mounts["/run/docbroker/keys"]["readOnly"] is True
    volumes = {v["name"]: v for v in spec["volumes"]}
    assert volumes["keys"]["emptyDir"]["medium"] == "Memory"
    assert volumes["keys-in"]["secret"]["secretName"] == "docbroker-keys"
    assert "emptyDir" in volumes[mounts["/tmp"]["name"]]
    # The data dir (the replica's audit chain and witness) is a volume of the replica's own that
    # outlives its Pods, not an emptyDir that goes with them.
    statefulset = find(docs, "StatefulSet", "docbroker-broker", "docbroker")["spec"]
    (claim,) = statefulset["volumeClaimTemplates"]
    assert mounts["/var/lib/docbroker"]["name"] == claim["metadata"]["name"] == "data"
    assert "data" not in volumes and claim["spec"]["accessModes"] == ["ReadWriteOnce"]
    # Rotation and retention keep the log inside it: (kept + live) x rotation size < the volume.
    size_mib = int(claim["spec"]["resources"]["requests"]["storage"].removesuffix("Gi")) * 1024
    rotate, keep = int(cfg["DOCBROKER_AUDIT_ROTATE_MB"]), int(cfg["DOCBROKER_AUDIT_KEEP_FILES"])
    assert keep >= 1 and (keep + 1) * rotate <= 0.75 * size_mib  # room for the witness and the rest
    assert statefulset["serviceName"] == "docbroker-broker-replicas"
    assert find(docs, "Service", "docbroker-broker-replicas", "docbroker")["spec"]["clusterIP"] == "None"
    # The broker chmods its data dir 0700, which only the owner may: the volume's mount point
    # is root's, so the data dir is a folder the broker creates inside it.
    assert cfg["DOCBROKER_DATA_DIR"].startswith("/var/lib/docbroker/")
    service = find(docs, "Service", "docbroker-broker", "docbroker")["spec"]
    assert service["ports"] == [{"name": "http", "port": 8000, "targetPort": "http", "protocol": "TCP"}]


def test_base_takes_the_database_url_from_a_secret(rendered: dict[str, list[dict[str, Any]]]) -> None:
    env = {e["name"]: e for e in broker_container(rendered["base"])["env"]}
    assert env["DOCBROKER_DATABASE_URL"]["valueFrom"] == {
        "secretKeyRef": {"name": "docbroker-database", "key": "url"}
    }
    assert find(rendered["base"], "PodDisruptionBudget", "docbroker-broker")["apiVersion"] == "policy/v1"


def test_production_overlay(rendered: dict[str, list[dict[str, Any]]]) -> None:
    docs = rendered["overlays/production"]
    deployment = find(docs, "StatefulSet", "docbroker-broker", "docbroker")
    assert deployment["spec"]["replicas"] == 3
    images = {
        c["image"]
        for c in deployment["spec"]["template"]["spec"]["initContainers"] + [broker_container(docs)]
    }
    assert images == {"registry.example.com/docbroker/docbroker-broker@sha256:" + "9b7e" * 16}  # by digest
    policies = find(docs, "ConfigMap", "docbroker-tenant-policies-", "docbroker")
    assert set(policies["data"]) == {"example.toml"}


def test_lab_overlay_differs_from_the_base_only_where_the_lab_needs_it(
    rendered: dict[str, list[dict[str, Any]]],
) -> None:
    def by_key(docs: list[dict[str, Any]]) -> dict[tuple[str, str, str, str], dict[str, Any]]:
        # Generated names carry a content hash: compare them without it.
        out = {}
        for d in docs:
            k = key(d)
            if d["kind"] == "ConfigMap":
                k = (*k[:3], k[3].rsplit("-", 1)[0])
            out[k] = d
        return out

    base, lab = by_key(rendered["base"]), by_key(rendered["overlays/lab"])
    assert set(base) - set(lab) == {("policy/v1", "PodDisruptionBudget", "docbroker", "docbroker-broker")}
    assert set(lab) - set(base) == {
        ("policy/v1beta1", "PodDisruptionBudget", "docbroker", "docbroker-broker"),
        ("policy/v1beta1", "PodSecurityPolicy", "", "docbroker-restricted"),
        ("rbac.authorization.k8s.io/v1", "ClusterRole", "", "docbroker-psp-restricted"),
        ("rbac.authorization.k8s.io/v1", "RoleBinding", "docbroker", "docbroker-psp-restricted"),
        ("rbac.authorization.k8s.io/v1", "RoleBinding", "docbroker-tenants", "docbroker-psp-restricted"),
        ("storage.k8s.io/v1", "StorageClass", "", "docbroker-lab"),
        ("v1", "ConfigMap", "docbroker", "docbroker-lab"),
    }
    changed = {k for k in base.keys() & lab.keys() if base[k] != lab[k]}
    assert changed == {
        ("apps/v1", "StatefulSet", "docbroker", "docbroker-broker"),
        ("batch/v1", "Job", "docbroker", "docbroker-db-upgrade"),  # the lab's PostgreSQL, as the brokers'
        ("v1", "ConfigMap", "docbroker", "docbroker-config"),
    }
    base_cfg = config(rendered["base"])
    lab_cfg = config(rendered["overlays/lab"])
    assert {k: v for k, v in lab_cfg.items() if base_cfg.get(k) != v} == {
        "DOCBROKER_KUBE_IMAGE_PULL_POLICY": "Never",
        "DOCBROKER_KUBE_SECCOMP": "localhost/docbroker/seccomp-tcp.json",
        "DOCBROKER_PUBLIC_URL": "http://docbroker-broker.docbroker:8000",
        "DOCBROKER_AUTH_ISSUER": "https://issuer.lab.invalid",
        "DOCBROKER_DATABASE_ALLOW_INSECURE_TRANSPORT": "true",  # PostgreSQL on the node, no TLS
    }
    spec = find(rendered["overlays/lab"], "StatefulSet", "docbroker-broker")["spec"]["template"]["spec"]
    assert {c["imagePullPolicy"] for c in spec["containers"] + spec["initContainers"]} == {"Never"}
    psp = find(rendered["overlays/lab"], "PodSecurityPolicy", "docbroker-restricted")
    allowed = psp["metadata"]["annotations"][
        "seccomp.security.alpha.kubernetes.io/allowedProfileNames"
    ].split(",")
    assert "localhost/" + lab_cfg["DOCBROKER_KUBE_SECCOMP"].removeprefix("localhost/") in allowed
    assert psp["spec"]["privileged"] is False and psp["spec"]["requiredDropCapabilities"] == ["ALL"]
    assert "hostPath" not in psp["spec"]["volumes"]


def test_a_run_fills_in_the_lab_node_address(tmp_path: Path) -> None:
    """The way the lab run (and docs/kubernetes.md) points the broker at its API server and
    PostgreSQL: an overlay of the lab overlay that merges the node's address."""
    (tmp_path / "kustomization.yaml").write_text(
        "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\n"
        f"resources: [{relative(K8S / 'overlays' / 'lab', tmp_path)}]\n"
        "configMapGenerator:\n- name: docbroker-lab\n  namespace: docbroker\n  behavior: merge\n"
        "  literals: [node-ip=10.99.0.1]\n"
    )
    docs = kustomize(tmp_path)
    lab = find(docs, "ConfigMap", "docbroker-lab-", "docbroker")
    assert lab["data"]["node-ip"] == "10.99.0.1"
    env = broker_container(docs)["env"]
    names = [e["name"] for e in env]
    by_name = {e["name"]: e for e in env}
    assert by_name["KUBERNETES_SERVICE_HOST"]["valueFrom"]["configMapKeyRef"] == {
        "name": lab["metadata"]["name"],
        "key": "node-ip",
    }
    url = by_name["DOCBROKER_DATABASE_URL"]["value"]
    assert (
        url
        == "postgresql://docbroker@$(DOCBROKER_LAB_POSTGRES_HOST):$(DOCBROKER_LAB_POSTGRES_PORT)/$(DOCBROKER_LAB_POSTGRES_DB)"
    )
    # $(VAR) expands only variables declared before it.
    for var in ("DOCBROKER_LAB_POSTGRES_HOST", "DOCBROKER_LAB_POSTGRES_PORT", "DOCBROKER_LAB_POSTGRES_DB"):
        assert names.index(var) < names.index("DOCBROKER_DATABASE_URL")


def test_tenant_example_component(tmp_path: Path) -> None:
    docs = render_with_component(tmp_path, "tenant-example")
    pvcs = {d["metadata"]["name"]: d for d in docs if d["kind"] == "PersistentVolumeClaim"}
    assert set(pvcs) == {"docbroker-tenant-example-sources", "docbroker-tenant-example-reports"}
    for pvc in pvcs.values():
        assert pvc["metadata"]["namespace"] == "docbroker-tenants"
        assert pvc["metadata"]["labels"]["docbroker.io/tenant"] == "example"
        assert pvc["metadata"]["labels"]["app.kubernetes.io/component"] == "sandbox"
    assert pvcs["docbroker-tenant-example-sources"]["spec"]["accessModes"] == ["ReadOnlyMany"]
    assert pvcs["docbroker-tenant-example-reports"]["spec"]["accessModes"] == ["ReadWriteOnce"]


@pytest.mark.parametrize(
    ("component", "variable", "value"),
    [
        ("runtime-class", "DOCBROKER_KUBE_RUNTIME_CLASS", "gvisor"),
        ("seccomp-localhost", "DOCBROKER_KUBE_SECCOMP", "localhost/docbroker/seccomp-tcp.json"),
        ("jwks-url", "DOCBROKER_AUTH_JWKS_FILE", ""),
    ],
)
def test_components_set_the_broker_config(tmp_path: Path, component: str, variable: str, value: str) -> None:
    assert config(render_with_component(tmp_path, component))[variable] == value


def egress_of(docs: list[dict[str, Any]], name: str) -> list[dict[str, Any]]:
    rules: list[dict[str, Any]] = find(docs, "NetworkPolicy", name, "docbroker")["spec"]["egress"]
    return rules


def test_the_api_server_port_is_443_or_6443_by_component(tmp_path: Path) -> None:
    """Managed clusters serve the API on 443, kubeadm-made ones on 6443: the base says 443, the
    `apiserver-port-6443` component the other; nothing else changes."""
    base = render("base")
    ((port,),) = [rule["ports"] for rule in egress_of(base, "apiserver-egress")]
    assert port == {"protocol": "TCP", "port": 443}
    other = render_with_component(tmp_path, "apiserver-port-6443")
    ((port,),) = [rule["ports"] for rule in egress_of(other, "apiserver-egress")]
    assert port == {"protocol": "TCP", "port": 6443}
    assert [d for d in other if d["kind"] != "NetworkPolicy"] == [
        d for d in base if d["kind"] != "NetworkPolicy"
    ]


def test_the_cilium_component_names_the_api_server_entity_instead_of_an_ip_block(tmp_path: Path) -> None:
    docs = render_with_component(tmp_path, "apiserver-cilium")
    assert not [
        d for d in docs if d["kind"] == "NetworkPolicy" and d["metadata"]["name"] == "apiserver-egress"
    ]
    cilium = find(docs, "CiliumNetworkPolicy", "apiserver-egress", "docbroker")
    assert cilium["apiVersion"] == "cilium.io/v2"
    assert set(cilium["spec"]) == {"endpointSelector", "egress"}
    assert cilium["spec"]["endpointSelector"] == {
        "matchLabels": {"app.kubernetes.io/name": "docbroker-broker"}
    }
    (rule,) = cilium["spec"]["egress"]
    assert rule["toEntities"] == ["kube-apiserver"]
    assert rule["toPorts"] == [
        {"ports": [{"port": "443", "protocol": "TCP"}, {"port": "6443", "protocol": "TCP"}]}
    ]


@pytest.mark.parametrize(
    ("component", "policy", "ports"),
    [
        ("egress-identity-provider", "identity-provider-egress", [443]),
        ("egress-webhooks", "webhooks-egress", [443]),
        ("egress-otlp", "otlp-egress", [4318]),
    ],
)
def test_each_optional_destination_is_a_component_of_one_policy(
    tmp_path: Path, component: str, policy: str, ports: list[int]
) -> None:
    """The provider, the webhook receiver and the OTLP collector: nothing opens them in the
    base (the brokers reach nothing they do not need); each component adds one policy, for the
    brokers only, naming where and which ports."""
    assert policy not in {d["metadata"]["name"] for d in render("base")}
    docs = render_with_component(tmp_path, component)
    spec = find(docs, "NetworkPolicy", policy, "docbroker")["spec"]
    assert spec["podSelector"] == {"matchLabels": {"app.kubernetes.io/name": "docbroker-broker"}}
    assert spec["policyTypes"] == ["Egress"]
    (rule,) = spec["egress"]
    assert rule["to"] and [p["port"] for p in rule["ports"]] == ports


def test_the_managed_overlay_has_what_a_managed_cluster_needs() -> None:
    """k8s/overlays/managed (docs/kubernetes.md, "A managed cluster, step by step"): an Ingress
    with TLS to the brokers' Service, the JWKS URL and its egress, pull secrets on every account
    that makes Pods, the runtime's default seccomp profile (no node step), ReadWriteOnce
    sources, the API server on 443, no placeholder address left."""
    docs = render("overlays/managed")
    cfg = config(docs)
    ingress = find(docs, "Ingress", "docbroker", "docbroker")["spec"]
    ((tls,), (rule,)) = ingress["tls"], ingress["rules"]
    assert tls["secretName"] == "docbroker-tls" and tls["hosts"] == [rule["host"]]
    assert cfg["DOCBROKER_PUBLIC_URL"] == f"https://{rule['host']}"
    (path,) = rule["http"]["paths"]
    assert path["backend"]["service"] == {"name": "docbroker-broker", "port": {"name": "http"}}
    assert cfg["DOCBROKER_AUTH_JWKS_URL"].startswith("https://") and cfg["DOCBROKER_AUTH_JWKS_FILE"] == ""
    assert find(docs, "NetworkPolicy", "identity-provider-egress", "docbroker")
    for namespace, account in (
        ("docbroker", "docbroker-broker"),
        ("docbroker", "docbroker-db-upgrade"),
        ("docbroker-tenants", "default"),
    ):
        sa = find(docs, "ServiceAccount", account, namespace)
        assert sa["imagePullSecrets"] == [{"name": "registry-credentials"}]
        assert sa["automountServiceAccountToken"] is False
    assert cfg["DOCBROKER_KUBE_SECCOMP"] == "RuntimeDefault"
    assert cfg["DOCBROKER_KUBE_SOURCES_ACCESS_MODE"] == "ReadWriteOnce"
    assert cfg["DOCBROKER_OPS_TOKEN_FILE"] == "/run/docbroker/keys/ops.token"
    ((port,),) = [
        r["ports"] for r in find(docs, "NetworkPolicy", "apiserver-egress", "docbroker")["spec"]["egress"]
    ]
    assert port["port"] == 443
    cidrs = [
        peer["ipBlock"]["cidr"]
        for d in docs
        if d["kind"] == "NetworkPolicy"
        for rule in d["spec"].get("egress", [])
        for peer in rule.get("to", [])
        if "ipBlock" in peer
    ]
    assert cidrs and not [c for c in cidrs if c.startswith("203.0.113.")]
