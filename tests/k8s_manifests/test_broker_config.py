"""What the StatefulSet hands the broker is what the broker accepts: the rendered ConfigMap and
env of every overlay build a valid `Settings`, every `DOCBROKER_*` name in them is one the
settings read, and the init container's key copy gives files the broker's key loaders take."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from broker.audit.checkpoint import load_signing_key
from broker.master_key import MasterKeyError, load_master_key
from broker.settings import RuntimeKind, Settings
from tests.k8s_manifests.render import OVERLAYS, ROOT, find, render

KEYS_IN, KEYS = "/run/docbroker/keys-in", "/run/docbroker/keys"


def pod_spec(docs: list[dict[str, Any]]) -> dict[str, Any]:
    spec: dict[str, Any] = find(docs, "StatefulSet", "docbroker-broker", "docbroker")["spec"]["template"][
        "spec"
    ]
    return spec


def broker_env(docs: list[dict[str, Any]]) -> dict[str, str]:
    """The broker container's environment as the kubelet builds it: envFrom, then env, with
    downward-API, Secret and ConfigMap references resolved to stand-in values and `$(VAR)`
    expanded from the variables declared before."""
    spec = pod_spec(docs)
    (container,) = spec["containers"]
    maps = {d["metadata"]["name"]: d.get("data", {}) for d in docs if d["kind"] == "ConfigMap"}
    env: dict[str, str] = {}
    for source in container.get("envFrom", []):
        env.update(maps[source["configMapRef"]["name"]])
    for var in container.get("env", []):
        ref = var.get("valueFrom")
        if ref is None:
            env[var["name"]] = re.sub(
                r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", lambda m: env[m.group(1)], var["value"]
            )
        elif "fieldRef" in ref:
            env[var["name"]] = "docbroker-broker-5d8f7c9b4-x2x7q"  # metadata.name
        elif "secretKeyRef" in ref:
            env[var["name"]] = "postgresql://docbroker:pw@db.example.com:5432/docbroker?sslmode=verify-full"
        else:
            key = ref["configMapKeyRef"]
            env[var["name"]] = maps[key["name"]][key["key"]]
    return env


@pytest.mark.parametrize("name", OVERLAYS)
def test_every_overlay_builds_valid_broker_settings(name: str) -> None:
    env = broker_env(render(name))
    # The image's own ENV (deploy/broker.Dockerfile) comes first; the StatefulSet's override it.
    image_env = {
        "DOCBROKER_POLICIES_DIR": "/opt/docbroker/policies",
        "DOCBROKER_DATA_DIR": "/var/lib/docbroker",
    }
    settings = Settings.from_env({**image_env, **env})
    assert settings.runtime.kind is RuntimeKind.KUBERNETES
    assert (settings.server.host, settings.server.port) == ("0.0.0.0", 8000)  # noqa: S104 (the Pod's own address)
    assert settings.replica_id == "docbroker-broker-5d8f7c9b4-x2x7q"
    assert settings.database.url is not None
    assert str(settings.master_key_file).startswith(KEYS + "/")
    assert settings.audit.stdout is True


@pytest.mark.parametrize("name", OVERLAYS)
def test_every_variable_is_one_the_settings_read(name: str) -> None:
    source = "".join(p.read_text() for p in (ROOT / "broker" / "settings").glob("*.py"))
    env = broker_env(render(name))
    unknown = [
        k
        for k in env
        if k.startswith("DOCBROKER_")
        and not k.startswith("DOCBROKER_LAB_")
        and f'"{k.removeprefix("DOCBROKER_")}"' not in source
    ]
    assert unknown == []  # a misspelt name would be silently ignored by the broker


def test_the_lab_broker_reaches_the_api_server_and_postgresql_at_the_node() -> None:
    env = broker_env(render("overlays/lab"))
    # lab.env's values are .ci/kube-lab.sh's node address and API port, and the host seen from Pods.
    assert env["KUBERNETES_SERVICE_HOST"] == "10.244.77.1"
    assert env["KUBERNETES_SERVICE_PORT"] == "16443"
    assert env["DOCBROKER_DATABASE_URL"] == "postgresql://docbroker@10.244.76.1:5432/docbroker"


def secret_volume(root: Path, files: dict[str, bytes]) -> None:
    """The layout the kubelet gives a Secret volume: a timestamped dir, `..data` pointing at it,
    and each key a symlink through `..data`; group-readable as fsGroup leaves it."""
    stamp = root / "..2026_12_01_13_00_00.000000001"
    stamp.mkdir()
    for name, data in files.items():
        (stamp / name).write_bytes(data)
        (stamp / name).chmod(0o440)
        (root / name).symlink_to(Path("..data") / name)
    (root / "..data").symlink_to(stamp.name)


def test_the_key_copy_gives_files_the_broker_accepts(tmp_path: Path) -> None:
    (init,) = pod_spec(render("base"))["initContainers"]
    assert init["command"][:2] == ["/opt/venv/bin/python", "-c"]
    script = init["command"][2]
    mounts = {m["mountPath"]: m for m in init["volumeMounts"]}
    assert mounts[KEYS_IN]["readOnly"] is True and KEYS in mounts
    src, dst = tmp_path / "in", tmp_path / "out"
    src.mkdir()
    dst.mkdir()
    master = os.urandom(32).hex().encode() + b"\n"
    pem = Ed25519PrivateKey.generate().private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    secret_volume(src, {"master.key": master, "audit-signing.key": pem, "jwks.json": b'{"keys": []}'})
    # The Secret volume's links (and its group-readable files) are what the broker refuses:
    # the reason for the copy.
    with pytest.raises(MasterKeyError, match="symbolic link"):
        load_master_key(src / "master.key")
    with pytest.raises(MasterKeyError, match="readable by group"):
        load_master_key(src / "..data" / "master.key")
    done = subprocess.run(
        [sys.executable, "-c", script.replace(KEYS_IN, str(src)).replace(KEYS, str(dst))],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert sorted(p.name for p in dst.iterdir()) == ["audit-signing.key", "jwks.json", "master.key"]
    for path in dst.iterdir():
        assert not path.is_symlink() and path.stat().st_mode & 0o777 == 0o600
    assert load_master_key(dst / "master.key") == bytes.fromhex(master.decode())
    load_signing_key(dst / "audit-signing.key")
    # A restarted init container (the emptyDir survives it) copies again without failing.
    again = subprocess.run(
        [sys.executable, "-c", script.replace(KEYS_IN, str(src)).replace(KEYS, str(dst))],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert again.returncode == 0, again.stderr
