"""The pod spec inside a rendered Kubernetes object: what the manifest tests check with
broker.runtime.podsecurity (the broker itself only ever checks the Pods it makes)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def pod_spec_of(obj: Mapping[str, Any]) -> tuple[Mapping[str, Any], Mapping[str, Any]] | None:
    """(pod metadata, pod spec) of a Pod or of a workload's pod template; None if it has none."""
    kind = obj.get("kind")
    spec = _mapping(obj.get("spec"))
    if kind == "Pod":
        return _mapping(obj.get("metadata")), spec
    if kind == "CronJob":
        spec = _mapping(_mapping(spec.get("jobTemplate")).get("spec"))
    template = spec.get("template")
    if kind in ("Deployment", "StatefulSet", "DaemonSet", "ReplicaSet", "Job", "CronJob", "PodTemplate"):
        template = obj.get("template") if kind == "PodTemplate" else template
        if isinstance(template, Mapping):
            return _mapping(template.get("metadata")), _mapping(template.get("spec"))
    return None


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}
