"""`docbroker audit key` reads the replica's key and never makes one (issue 38): run against a
wrong path in a backup or a rotation, it used to create a new key, print its public half and
exit 0 — a key that signs nothing, handed to the auditors. `audit keygen` makes one, once."""

from __future__ import annotations

import os
from pathlib import Path

from broker.testing import ROOT
from tests.broker.cli.cli_helpers import cli, one_line_error


def _env(tmp_path: Path, key_file: Path) -> dict[str, str]:
    return {
        "PATH": os.environ["PATH"],
        "PYTHONPATH": str(ROOT),
        "DOCBROKER_DATA_DIR": str(tmp_path / "data"),
        "DOCBROKER_AUTH_ISSUER": "https://issuer.invalid",
        "DOCBROKER_AUTH_AUDIENCE": "docbroker",
        "DOCBROKER_AUTH_JWKS_FILE": str(tmp_path / "jwks.json"),
        "DOCBROKER_AUDIT_KEY_FILE": str(key_file),
    }


def test_audit_key_without_a_key_fails_in_one_line_and_creates_nothing(tmp_path: Path) -> None:
    key_file = tmp_path / "data" / "misspelt-audit-signing.key"
    result = cli(_env(tmp_path, key_file), "audit", "key")
    line = one_line_error(result, 1)
    assert "DOCBROKER_AUDIT_KEY_FILE" in line and "keygen" in line and str(key_file) not in line
    assert result.stdout == ""
    assert not key_file.exists() and not key_file.parent.exists()


def test_keygen_makes_the_key_once_and_key_prints_the_same_public_half(tmp_path: Path) -> None:
    key_file = tmp_path / "data" / "audit-signing.key"
    env = _env(tmp_path, key_file)
    made = cli(env, "audit", "keygen")
    assert made.returncode == 0, made.stderr
    assert made.stdout.startswith("-----BEGIN PUBLIC KEY-----")
    assert key_file.stat().st_mode & 0o777 == 0o600
    private = key_file.read_bytes()

    shown = cli(env, "audit", "key")
    assert shown.returncode == 0 and shown.stdout == made.stdout
    as_hex = cli(env, "audit", "key", "--format", "hex").stdout.split()
    assert len(as_hex) == 2 and len(as_hex[0]) == 16 and len(as_hex[1]) == 64

    again = cli(env, "audit", "keygen")
    assert "never replaces" in one_line_error(again, 1) and again.stdout == ""
    assert key_file.read_bytes() == private  # the key that signed stays
