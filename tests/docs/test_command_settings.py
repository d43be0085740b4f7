"""What each command needs from the shell it runs in (issue 38): docs/operations.md's table of
commands and the variables they read is run here, row by row — each example with only the
variables its row names (and harmless defaults) set must get past its configuration (exit 2
is a usage or configuration error). `tenant sources push` with only `DOCBROKER_KUBECONFIG`, as
docs/kubernetes.md used to show it, fails that way: the images must be named by digest."""

from __future__ import annotations

import os
import re
import secrets
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from broker.testing import ROOT

PAGE = ROOT / "docs" / "operations.md"
DIGEST = "@sha256:" + "a" * 64


def rows() -> list[tuple[str, set[str]]]:
    """(example command, the variables its row names) of the table headed `| commands | example | reads |`."""
    text = PAGE.read_text(encoding="utf-8")
    table = text.split("| commands | example | reads |", 1)[1].split("\n\n", 1)[0]
    found = []
    for line in table.splitlines()[2:]:
        cells = line.split(" | ")
        example = re.fullmatch(r"`(docbroker [^`]+)`", cells[1].strip())
        assert example, line
        found.append((example.group(1), set(re.findall(r"DOCBROKER_[A-Z0-9_]*[A-Z0-9]\b", cells[2]))))
    return found


def unreachable_kubeconfig(path: Path) -> Path:
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.1:9"}}],
                "users": [{"name": "u", "user": {"token": "t"}}],
                "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
                "current-context": "x",
            }
        )
    )
    return path


def samples(tmp: Path) -> dict[str, str]:
    """A valid value for every variable a row may name (a row naming another fails here)."""
    master = tmp / "master.key"
    master.write_text(secrets.token_hex(32) + "\n")
    master.chmod(0o600)
    public = tmp / "release.pub"
    public.write_bytes(
        Ed25519PrivateKey.generate()
        .public_key()
        .public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    )
    return {
        "DOCBROKER_AUTH_ISSUER": "https://issuer.invalid",
        "DOCBROKER_AUTH_AUDIENCE": "docbroker",
        "DOCBROKER_AUTH_JWKS_FILE": str(tmp / "jwks.json"),
        "DOCBROKER_KUBECONFIG": str(unreachable_kubeconfig(tmp / "kubeconfig")),
        "DOCBROKER_KUBE_NAMESPACE": "docbroker-tenants",
        "DOCBROKER_INSTANCE": "default",
        "DOCBROKER_KUBE_SERVER_IMAGE": "registry.invalid/docbroker-server" + DIGEST,
        "DOCBROKER_KUBE_KEEPER_IMAGE": "registry.invalid/docbroker-broker" + DIGEST,
        "DOCBROKER_KUBE_IMAGE_PULL_POLICY": "IfNotPresent",
        "DOCBROKER_MASTER_KEY_FILE": str(master),
        "DOCBROKER_DOCKER_IMAGE": "docbroker-server:latest",
        "DOCBROKER_IMAGE_RECORDS": str(tmp / "records"),
        "DOCBROKER_IMAGE_TRUST_KEYS": str(public),
        "DOCBROKER_PUBLIC_URL": "https://docs.example.com",
        "DOCBROKER_HOST": "127.0.0.1",
        "DOCBROKER_PORT": "8080",
    }


# Named by a row, but with defaults that already work here, or only one of several choices.
OPTIONAL = {
    "DOCBROKER_DATA_DIR", "DOCBROKER_RUNTIME", "DOCBROKER_DATABASE_URL", "DOCBROKER_KUBE_RUNTIME_CLASS",
    "DOCBROKER_AUTH_JWKS_URL", "DOCBROKER_AUTH_DEV_HS256_SECRET_FILE", "DOCBROKER_DOCKER_HOST",
}  # fmt: skip


def run(tmp: Path, command: str, variables: set[str]) -> subprocess.CompletedProcess[str]:
    values = samples(tmp)
    env = {
        "PATH": os.environ["PATH"],
        "PYTHONPATH": str(ROOT),
        # Harmless everywhere: a data dir of the test's own, and no engine (nothing to reach).
        "DOCBROKER_DATA_DIR": str(tmp / "data"),
        "DOCBROKER_POLICIES_DIR": str(ROOT / "policies"),
        "DOCBROKER_DOCKER_HOST": "unix:///nonexistent/docker.sock",
    }
    for name in variables - OPTIONAL:
        assert name in values, f"no sample value for {name}: add one to this test"
        env[name] = values[name]
    (tmp / "acme-docs").mkdir(exist_ok=True)
    (tmp / "acme-docs" / "notes.md").write_text("quarterly numbers\n")
    return subprocess.run(
        [sys.executable, "-m", "broker", *shlex.split(command)[1:]],
        cwd=tmp,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
        check=False,
    )


@pytest.mark.parametrize(("command", "variables"), rows(), ids=[c for c, _ in rows()])
def test_each_command_runs_with_the_variables_its_row_names(
    tmp_path: Path, command: str, variables: set[str]
) -> None:
    done = run(tmp_path, command, variables)
    assert done.returncode != 2, (command, done.stderr)
    assert "Traceback" not in done.stderr


def test_the_table_lists_the_commands_that_need_more_than_files() -> None:
    examples = {c for c, _ in rows()}
    for needed in ("docbroker doctor", "docbroker tenant manifest acme --secret"):
        assert needed in examples
    assert any(c.startswith("docbroker tenant sources push") for c in examples)


def test_leaving_out_what_a_row_names_is_a_configuration_error(tmp_path: Path) -> None:
    # The check above can fail: with only a kubeconfig (what docs/kubernetes.md showed), the
    # push refuses its configuration; `doctor` without the issuer too.
    push = run(tmp_path, "docbroker tenant sources push acme acme-docs", {"DOCBROKER_KUBECONFIG"})
    assert push.returncode == 2 and "DOCBROKER_KUBE_SERVER_IMAGE" in push.stderr, push.stderr
    doctor = run(tmp_path, "docbroker doctor", set())
    assert doctor.returncode == 2 and "DOCBROKER_AUTH_ISSUER" in doctor.stderr, doctor.stderr
    # and the master key, wherever DOCBROKER_MASTER_KEY_FILE does not point: not found
    manifest = run(tmp_path, "docbroker tenant manifest acme --secret", set())
    assert manifest.returncode != 0 and "kind: Secret" not in manifest.stdout
