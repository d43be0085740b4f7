"""Every rendering validates against the Kubernetes versions we claim (`kubernetes-validate
--strict`: unknown fields are errors). The lab overlay is for 1.20, which the bundle does not
hold: its 1.20-only objects (policy/v1beta1) are checked live on the lab cluster, the rest of
it here like the others."""

from __future__ import annotations

from pathlib import Path

import kubernetes_validate
import pytest

from tests.k8s_manifests.render import CUSTOM_KINDS, all_renderings

VERSIONS = ("1.30.0", "1.34.0")
LAB_ONLY = {("policy/v1beta1", "PodDisruptionBudget"), ("policy/v1beta1", "PodSecurityPolicy")}


@pytest.mark.parametrize("version", VERSIONS)
def test_every_rendering_validates_strictly(tmp_path: Path, version: str) -> None:
    checked = 0
    for name, docs in all_renderings(tmp_path):
        for doc in docs:
            kind = (doc["apiVersion"], doc["kind"])
            if kind in CUSTOM_KINDS:
                assert name == "components/apiserver-cilium", f"{name} has a custom resource {kind}"
                continue
            if kind in LAB_ONLY:
                assert name == "overlays/lab", f"{name} has a 1.20-only {kind}"
                with pytest.raises(kubernetes_validate.SchemaNotFoundError):
                    kubernetes_validate.validate(doc, version, strict=True)
                continue
            try:
                kubernetes_validate.validate(doc, version, strict=True)
            except kubernetes_validate.ValidationError as e:
                raise AssertionError(
                    f"{name}: {doc['kind']}/{doc['metadata']['name']}: {e.message}"
                ) from None
            checked += 1
    assert checked > 50


def test_strict_validation_catches_a_misspelt_field() -> None:
    """The check above can fail: a field the schema does not know is an error."""
    bad = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "x"},
        "spec": {
            "selector": {"matchLabels": {"a": "b"}},
            "template": {
                "metadata": {"labels": {"a": "b"}},
                "spec": {"containers": [{"name": "c", "image": "i", "securityContex": {}}]},
            },
        },
    }
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(bad, VERSIONS[0], strict=True)
