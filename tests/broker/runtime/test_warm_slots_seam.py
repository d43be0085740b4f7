"""The warm slots reach the Docker daemon only through the backend's public container seam
(issue 36): no private member of the backend is touched from broker/runtime/docker/warm_slots.py,
so the backend can change its insides without the pool noticing."""

from __future__ import annotations

import ast
from pathlib import Path

import broker.runtime.docker.warm_slots as warm_slots
from broker.runtime.docker.backend import DockerBackend
from broker.runtime.docker.warm_slots import ContainerSeam


def _backend_members_used() -> set[str]:
    tree = ast.parse(Path(warm_slots.__file__).read_text(encoding="utf-8"))
    return {
        node.attr
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute)
        and isinstance(node.value, ast.Attribute)
        and node.value.attr == "_backend"
    }


def test_the_warm_slots_use_only_public_members_of_the_backend() -> None:
    used = _backend_members_used()
    assert used, "the walk found no use of the backend"
    assert not {name for name in used if name.startswith("_")}


def test_the_seam_is_what_the_slots_use_and_the_backend_offers() -> None:
    seam = {name for name in vars(ContainerSeam) if not name.startswith("_")}
    assert _backend_members_used() <= seam
    assert all(hasattr(DockerBackend, name) for name in seam)
