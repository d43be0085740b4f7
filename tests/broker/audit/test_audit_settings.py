"""The audit part of Settings.from_env: DOCBROKER_AUDIT_LOG, _FSYNC, _FSYNC_INTERVAL."""

from __future__ import annotations

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


def test_environment_overrides() -> None:
    env = BASE | {
        "DOCBROKER_AUDIT_LOG": "/srv/audit/log.jsonl",
        "DOCBROKER_AUDIT_FSYNC": "always",
        "DOCBROKER_AUDIT_FSYNC_INTERVAL": "0.5",
    }
    audit = Settings.from_env(env).audit
    assert audit == AuditSettings(Path("/srv/audit/log.jsonl"), AuditFsync.ALWAYS, 0.5)


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("DOCBROKER_AUDIT_FSYNC", "true"),
        ("DOCBROKER_AUDIT_FSYNC", "never"),
        ("DOCBROKER_AUDIT_FSYNC_INTERVAL", "0.001"),
        ("DOCBROKER_AUDIT_FSYNC_INTERVAL", "60"),
        ("DOCBROKER_AUDIT_FSYNC_INTERVAL", "soon"),
    ],
)
def test_invalid_values_name_the_variable(name: str, value: str) -> None:
    with pytest.raises(SettingsError) as err:
        Settings.from_env(BASE | {name: value})
    assert name in str(err.value) and value not in str(err.value)


def test_settings_object_validates_when_built() -> None:
    with pytest.raises(SettingsError):
        AuditSettings(Path("a"), fsync_interval_seconds=0)
    with pytest.raises(SettingsError):
        AuditSettings(Path("a"), fsync="always")  # type: ignore[arg-type]
