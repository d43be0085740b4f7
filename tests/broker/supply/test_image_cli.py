"""`docbroker image keygen`, and `image build|verify` refusing bad keys before any Docker work:
the real command line in a subprocess (the Docker side is tests/docker/test_image_supply.py)."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

from broker.supply.provenance import load_signing_key, load_trust_keys
from broker.testing import ROOT

# A daemon that cannot answer: a command that got as far as Docker would say so instead.
NO_DAEMON = "unix:///nonexistent/docker.sock"


def cli(*args: str, records: Path) -> subprocess.CompletedProcess[str]:
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "PYTHONPATH": str(ROOT),
        "DOCBROKER_DOCKER_HOST": NO_DAEMON,
        "DOCBROKER_IMAGE_RECORDS": str(records),
    }
    return subprocess.run([sys.executable, "-m", "broker", "image", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=60)  # fmt: skip


def test_keygen_writes_a_pair_and_never_replaces_a_key(tmp_path: Path) -> None:
    key = tmp_path / "release.key"
    done = cli("keygen", "--out", str(key), records=tmp_path)
    assert done.returncode == 0, done.stderr
    key_id = load_signing_key(key).key_id
    assert load_trust_keys([tmp_path / "release.key.pub"])[0].key_id == key_id
    assert done.stdout.strip().startswith(f"release key {key_id}:")
    assert str(tmp_path) not in done.stdout  # names no file
    assert stat.S_IMODE(key.stat().st_mode) == 0o600
    again = cli("keygen", "--out", str(key), records=tmp_path)
    assert (
        again.returncode == 1
        and again.stderr.strip()
        == "docbroker image keygen: release.key: exists (refused: choose another name)"
    )
    assert load_signing_key(key).key_id == key_id


def test_build_refuses_a_bad_signing_key_before_building(tmp_path: Path) -> None:
    key = tmp_path / "release.key"
    assert cli("keygen", "--out", str(key), records=tmp_path).returncode == 0
    os.chmod(key, 0o644)
    done = cli("build", "server", "--sign-key", str(key), records=tmp_path)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        "docbroker image build: signing key release.key: must not be readable by group or others (chmod 600)"
    ]  # one line, and nothing built: no progress from the base, the wheelhouse or the daemon
    done = cli("build", "server", "--sign-key", str(tmp_path / "release.key.pub"), records=tmp_path)
    assert done.returncode == 2 and "release.key.pub: must not be readable" in done.stderr


def test_verify_refuses_a_bad_trust_key_before_reading_the_image(tmp_path: Path) -> None:
    (tmp_path / "release.pub").write_text("-----BEGIN PUBLIC KEY-----\nAAAA\n-----END PUBLIC KEY-----\n")
    done = cli("verify", "--key", str(tmp_path / "release.pub"), records=tmp_path)
    assert done.returncode == 2
    assert done.stderr.strip() == "docbroker image verify: trust key release.pub: not a PEM public key"
    # with a good key it gets as far as Docker, and says so in one line
    assert cli("keygen", "--out", str(tmp_path / "k"), records=tmp_path).returncode == 0
    done = cli("verify", "--key", str(tmp_path / "k.pub"), records=tmp_path)
    assert done.returncode == 1 and "Traceback" not in done.stderr
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith("docbroker image verify: NOT verified: the Docker daemon does not answer")
