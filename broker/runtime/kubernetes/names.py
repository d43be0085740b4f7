"""The names and labels every docbroker object on Kubernetes carries (issue 18's contract).

Fixed here once, used by the backend, `docbroker tenant manifest` and `docbroker doctor`,
and by k8s/ (MANIFESTS) with the same spelling.
"""

from __future__ import annotations

import re

BROKER_NAMESPACE = "docbroker"
TENANTS_NAMESPACE = "docbroker-tenants"

PART_OF = "app.kubernetes.io/part-of"
COMPONENT = "app.kubernetes.io/component"
PUSH_COMPONENT = "sources-push"  # `tenant sources push`'s Pod: never a sandbox, never adopted
NAME = "app.kubernetes.io/name"
TENANT = "docbroker.io/tenant"
INSTANCE = "docbroker.io/instance"
REPLICA = "docbroker.io/replica"
# On the tenant's Pod: when any replica last used it (kubernetes/lastuse.py).
LAST_USED = "docbroker.io/last-used"

SANDBOX_NAME = "docbroker-sandbox"
MCP_PORT = 8080
KEEPER_PORT = 8081

# Keys of the tenant's Secret; each container mounts only its own (volume `items:`).
KEY_APPROVAL = "approval-secret"
KEY_SANDBOX = "sandbox-key"
KEY_KEEPER = "keeper-key"


def object_name(tenant: str) -> str:
    """The tenant's Pod and Secret (different kinds: one name)."""
    return f"docbroker-tenant-{tenant}"


def sources_claim(tenant: str) -> str:
    return f"{object_name(tenant)}-sources"


def reports_claim(tenant: str) -> str:
    return f"{object_name(tenant)}-reports"


def common_labels(tenant: str, instance: str) -> dict[str, str]:
    """Labels of every tenant object the broker or the manifest command makes."""
    return {
        PART_OF: "docbroker",
        COMPONENT: "sandbox",
        NAME: SANDBOX_NAME,
        TENANT: tenant,
        INSTANCE: instance,
    }


def label_value(text: str) -> str:
    """A replica id as a label value (63 of A-Z a-z 0-9 - _ ., alphanumeric at both ends)."""
    value = re.sub(r"[^A-Za-z0-9_.-]", "-", text)[:63].strip("-_.")
    return value or "unnamed"


def instance_selector(instance: str) -> str:
    """A label selector for this deployment's tenant Pods (discovery after a restart)."""
    return f"{PART_OF}=docbroker,{COMPONENT}=sandbox,{INSTANCE}={instance}"
