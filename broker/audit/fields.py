"""Audit fields the broker builds from its own objects, shaped in one place."""

from __future__ import annotations

from typing import Any

from broker.audit.schema import AuditEvent
from broker.types import Outcome

MAX_SANDBOX_CHARS = 64


def sandbox_field(backend_id: str) -> str:
    """A sandbox as the audit names it: the backend's id, cut to the field's length."""
    return backend_id[:MAX_SANDBOX_CHARS]


def sandbox_event(event: AuditEvent, tenant: str, sandbox_id: str, details: dict[str, Any]) -> dict[str, Any]:
    """The fields of a runtime's `sandbox.*` event (runtime.lifecycle's `on_event` arguments)."""
    fields: dict[str, Any] = {
        "outcome": Outcome.OK if event == AuditEvent.SANDBOX_STARTED else Outcome.ERROR,
        "tenant": tenant,
        "sandbox": sandbox_field(sandbox_id),
        "reason": details.get("reason", event.split(".")[1]),
    }
    if "mode" in details:
        fields["sandbox_mode"] = details["mode"]
    limits = details.get("limits_enforced")
    if limits is not None:  # Docker reports memory/cpu/pids separately: all must hold
        fields["limits_enforced"] = all(limits.values()) if isinstance(limits, dict) else bool(limits)
    digest = details.get("image_digest")
    if digest:  # the image it runs, by content: which build a tenant's documents met
        fields["image_digest"] = digest
    return fields
