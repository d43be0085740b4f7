"""The audit part of Settings.from_env: DOCBROKER_AUDIT_LOG, _FSYNC, _FSYNC_INTERVAL, the evidence
variables (_KEY_FILE, _WITNESS_FILE, _CHECKPOINT_EVERY, _CHECKPOINT_INTERVAL, _ROTATE_MB, _STDOUT)
and DOCBROKER_REPLICA_ID."""

from __future__ import annotations

from dataclasses import MISSING, fields
from pathlib import Path

import pytest

from broker.settings import AuditFsync, AuditSettings, Settings, SettingsError

BASE = {
    "DOCBROKER_AUTH_ISSUER": "https://issuer.example",
    "DOCBROKER_AUTH_AUDIENCE": "docbroker",
    "DOCBROKER_AUTH_JWKS_URL": "https://issuer.example/jwks.json",
    "DOCBROKER_DATA_DIR": "/var/lib/docbroker",
}


def test_defaults_write_every_line_and_fsync_on_an_interval() -> None:
    audit = Settings.from_env(BASE).audit
    assert audit.path == Path("/var/lib/docbroker/audit.jsonl")
    assert audit.fsync is AuditFsync.INTERVAL
    assert audit.fsync_interval_seconds == 0.2


def test_the_environments_defaults_are_the_settings_objects_own() -> None:
    """One set of defaults: a log built in code (a test's) behaves as the broker's own, and the
    broker's is signed, with checkpoints, unless someone says otherwise."""
    audit = Settings.from_env(BASE).audit
    assert audit == AuditSettings(path=audit.path, key_file=audit.key_file, witness_file=audit.witness_file)
    assert audit.key_file is not None and audit.witness_file is not None
    # No default of its own for what differs per broker: the files, in the data dir.
    required = [
        f.name for f in fields(AuditSettings) if f.default is MISSING and f.default_factory is MISSING
    ]
    assert required == ["path", "key_file", "witness_file"]


def test_environment_overrides() -> None:
    env = BASE | {
        "DOCBROKER_AUDIT_LOG": "/srv/audit/log.jsonl",
        "DOCBROKER_AUDIT_FSYNC": "always",
        "DOCBROKER_AUDIT_FSYNC_INTERVAL": "0.5",
    }
    audit = Settings.from_env(env).audit
    assert (audit.path, audit.fsync, audit.fsync_interval_seconds) == (
        Path("/srv/audit/log.jsonl"),
        AuditFsync.ALWAYS,
        0.5,
    )


def test_evidence_defaults_sign_checkpoints_and_rotate() -> None:
    settings = Settings.from_env(BASE)
    audit = settings.audit
    assert audit.key_file == Path("/var/lib/docbroker/audit-signing.key")
    assert audit.witness_file == Path("/var/lib/docbroker/audit-witness.jsonl")
    assert (audit.checkpoint_every, audit.checkpoint_interval_seconds) == (1000, 10.0)
    assert audit.rotate_bytes == 256 * 1024 * 1024 and audit.stdout is False
    assert settings.replica_id == audit.replica and audit.replica


def test_evidence_overrides() -> None:
    env = BASE | {
        "DOCBROKER_AUDIT_KEY_FILE": "/keys/audit.pem",
        "DOCBROKER_AUDIT_WITNESS_FILE": "/ship/witness.jsonl",
        "DOCBROKER_AUDIT_CHECKPOINT_EVERY": "50",
        "DOCBROKER_AUDIT_CHECKPOINT_INTERVAL": "2.5",
        "DOCBROKER_AUDIT_ROTATE_MB": "0",
        "DOCBROKER_AUDIT_STDOUT": "1",
        "DOCBROKER_REPLICA_ID": "broker-2",
    }
    audit = Settings.from_env(env).audit
    assert audit.key_file == Path("/keys/audit.pem") and audit.witness_file == Path("/ship/witness.jsonl")
    assert (audit.checkpoint_every, audit.checkpoint_interval_seconds, audit.rotate_bytes) == (50, 2.5, 0)
    assert audit.stdout is True and audit.replica == "broker-2"


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("DOCBROKER_AUDIT_FSYNC", "true"),
        ("DOCBROKER_AUDIT_FSYNC", "never"),
        ("DOCBROKER_AUDIT_FSYNC_INTERVAL", "0.001"),
        ("DOCBROKER_AUDIT_FSYNC_INTERVAL", "60"),
        ("DOCBROKER_AUDIT_FSYNC_INTERVAL", "soon"),
        ("DOCBROKER_AUDIT_CHECKPOINT_EVERY", "-5"),
        ("DOCBROKER_AUDIT_CHECKPOINT_INTERVAL", "0.01"),
        ("DOCBROKER_AUDIT_ROTATE_MB", "-1"),
        ("DOCBROKER_AUDIT_STDOUT", "maybe"),
        ("DOCBROKER_REPLICA_ID", "a/b"),
    ],
)
def test_invalid_values_name_the_variable(name: str, value: str) -> None:
    with pytest.raises(SettingsError) as err:
        Settings.from_env(BASE | {name: value})
    assert name in str(err.value) and value not in str(err.value)


def test_settings_object_validates_when_built() -> None:
    with pytest.raises(SettingsError):
        AuditSettings(Path("a"), None, None, fsync_interval_seconds=0)
    with pytest.raises(SettingsError):
        AuditSettings(Path("a"), None, None, fsync="always")  # type: ignore[arg-type]
