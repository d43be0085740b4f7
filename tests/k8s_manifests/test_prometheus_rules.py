"""The alert rules component (issue 38): `k8s/components/prometheus-rules` renders with the base,
its PrometheusRule fits the Prometheus Operator's schema (strictly: an unknown field is an
error), every metric and label its rules name is one the broker exports, and every alert is
explained in docs/audit.md's "Troubleshooting" and nothing more is.

kubernetes-validate bundles no CRD schemas: the PrometheusRule part of
monitoring.coreos.com/v1 the rules use is written out below. PromQL itself is checked for its
names, brackets and range durations only (no PromQL parser runs offline here)."""

from __future__ import annotations

import re
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
from prometheus_client.parser import text_string_to_metric_families

from broker.metrics import AUDIT_COUNTERS, Metrics
from tests.k8s_manifests.render import ROOT, find, render_with_component

COMPONENT = "prometheus-rules"
_STRINGS = {"type": "object", "additionalProperties": {"type": "string"}}
_RULE = {
    "type": "object",
    "additionalProperties": False,
    "required": ["expr"],
    "oneOf": [{"required": ["alert"]}, {"required": ["record"]}],
    "properties": {
        "alert": {"type": "string", "pattern": "^[A-Za-z_][A-Za-z0-9_]*$"},
        "record": {"type": "string"},
        "expr": {"type": ["string", "integer"]},
        "for": {"type": "string", "pattern": "^(0|([0-9]+(ms|s|m|h|d|w|y))+)$"},
        "keep_firing_for": {"type": "string"},
        "labels": _STRINGS,
        "annotations": _STRINGS,
    },
}
PROMETHEUS_RULE = {  # monitoring.coreos.com/v1, the fields of PrometheusRuleSpec
    "type": "object",
    "additionalProperties": False,
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "properties": {
        "apiVersion": {"const": "monitoring.coreos.com/v1"},
        "kind": {"const": "PrometheusRule"},
        "metadata": {"type": "object"},
        "spec": {
            "type": "object",
            "additionalProperties": False,
            "properties": {
                "groups": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "additionalProperties": False,
                        "required": ["name"],
                        "properties": {
                            "name": {"type": "string", "minLength": 1},
                            "interval": {"type": "string"},
                            "query_offset": {"type": "string"},
                            "limit": {"type": "integer"},
                            "labels": _STRINGS,
                            "partial_response_strategy": {"type": "string"},
                            "rules": {"type": "array", "items": _RULE},
                        },
                    },
                }
            },
        },
    },
}
FUNCTIONS = {"increase", "rate", "absent", "sum", "max", "min", "by", "and", "or", "unless"}


@pytest.fixture(scope="module")
def rendered(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    return render_with_component(tmp_path_factory.mktemp(COMPONENT), COMPONENT)


@pytest.fixture(scope="module")
def rules(rendered: list[dict[str, Any]]) -> list[dict[str, Any]]:
    rule = find(rendered, "PrometheusRule", "docbroker", "docbroker")
    return [r for group in rule["spec"]["groups"] for r in group["rules"]]


def exported() -> dict[str, set[str]]:
    """What a broker's /metrics holds: every sample name, with the label names it carries."""
    metrics = Metrics(lambda: 0, lambda: 0, lambda: 0, lambda: {})
    metrics.policy_reloads.labels("failed").inc()  # labelled families show once a child exists
    metrics.webhook("dropped")
    metrics.observe("tools/call", "read_document", "ok", 0.01)
    metrics.cut("read_timeout")
    names: dict[str, set[str]] = {}
    for family in text_string_to_metric_families(metrics.render().decode()):
        for sample in family.samples:
            names.setdefault(sample.name, set()).update(sample.labels)
    return names


def test_the_rule_fits_the_operators_schema_and_the_rest_validates(rendered: list[dict[str, Any]]) -> None:
    (rule,) = [d for d in rendered if d["kind"] == "PrometheusRule"]
    jsonschema.validate(rule, PROMETHEUS_RULE)
    for doc in rendered:
        if doc is not rule:  # the base's objects, as tests/k8s_manifests/test_validate.py checks them
            kubernetes_validate.validate(doc, "1.34.0", strict=True)
    with pytest.raises(jsonschema.ValidationError):  # the schema can fail: a misspelt field
        jsonschema.validate({**rule, "spec": {"groups": [{"name": "g", "rulez": []}]}}, PROMETHEUS_RULE)


def test_every_rule_names_metrics_and_labels_the_broker_exports(rules: list[dict[str, Any]]) -> None:
    names = exported()
    assert {f"{name}_total" for name, _ in AUDIT_COUNTERS.values()} <= names.keys()
    for rule in rules:
        expr = str(rule["expr"])
        assert expr.count("(") == expr.count(")") and expr.count("[") == expr.count("]"), expr
        assert expr.count("{") == expr.count("}"), expr
        for duration in re.findall(r"\[([^\]]*)\]", expr):
            assert re.fullmatch(r"([0-9]+(ms|s|m|h|d|w|y))+", duration), expr
        used = re.findall(r"\b(docbroker_[a-z0-9_]+)(?:\{([^}]*)\})?", expr)
        assert used, rule["alert"]
        for metric, matchers in used:
            assert metric in names, (rule["alert"], metric)
            labels = set(re.findall(r"([a-z_]+)\s*=~?", matchers))
            assert labels <= names[metric], (rule["alert"], metric, labels)
        words = set(re.findall(r"\b([a-z_]+)\s*\(", expr)) - {m for m, _ in used}
        assert words <= FUNCTIONS, (rule["alert"], words)
        assert rule["labels"]["severity"] in ("warning", "critical")
        assert rule["annotations"]["runbook"] == "docs/audit.md#troubleshooting"


def test_every_alert_is_explained_in_the_troubleshooting_section(rules: list[dict[str, Any]]) -> None:
    text = (ROOT / "docs" / "audit.md").read_text(encoding="utf-8")
    section = text.split("\n## Troubleshooting\n", 1)[1].split("\n## ", 1)[0]
    explained = set(re.findall(r"^\| `(Docbroker[A-Za-z]+)`", section, re.MULTILINE))
    assert explained == {r["alert"] for r in rules}
    # and every audit counter the broker exports is in the section's table
    for name, _ in AUDIT_COUNTERS.values():
        assert f"`{name}_total`" in section, name
