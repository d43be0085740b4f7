"""Tenant provisioning: the host-side modes the sandboxes' confinement relies on.

A warm sandbox holds its sources and drop-box as descriptors passed by the broker, so a walk
up from them (`..`) is a real path into the data dir. Besides Landlock, the folders above them
must be closed (0o700, the broker's own): tests/docker/test_docker_pool.py shows the walk
stopping there from inside a container; this test pins the modes the broker itself sets.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from broker.settings import Settings
from broker.tenants import Tenants
from broker.types import DROPBOX_MODE


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    key = tmp_path / "dev.key"
    key.write_text("k" * 64)
    key.chmod(0o600)
    return Settings.from_env(
        {
            "DOCBROKER_DATA_DIR": str(tmp_path / "data"),
            "DOCBROKER_AUTH_ISSUER": "https://issuer.example",
            "DOCBROKER_AUTH_AUDIENCE": "docbroker",
            "DOCBROKER_AUTH_DEV_HS256_SECRET_FILE": str(key),
        }
    )


def _mode(path: str | Path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def test_provision_closes_every_folder_above_the_passed_ones(settings: Settings) -> None:
    tenants = Tenants(settings, os.urandom(32))
    # A looser tree left by an older broker is closed again on the next provisioning.
    (settings.tenants_dir / "acme" / "docs").mkdir(parents=True, mode=0o755)
    spec = tenants.provision("acme")

    assert _mode(settings.data_dir) == 0o700
    assert _mode(settings.tenants_dir / "acme") == 0o700
    assert _mode(spec.docs_root) == 0o700  # the folder right above the sources and the drop-box
    assert _mode(tenants.reports_dir("acme")) == 0o700
    assert _mode(spec.dropbox_dir) == DROPBOX_MODE
    assert _mode(spec.run_dir) == 0o1777
    assert _mode(spec.secret_file) == 0o444
    assert Path(spec.sources_dir).is_dir()
    assert settings.pool_dir == settings.run_dir / ".pool"  # warm slots: never a tenant's name


def test_replicas_provisioning_one_tenant_at_once_never_fail(settings: Settings) -> None:
    # Replicas share the data dir and start a tenant's first sandbox at the same moment: each
    # writes the secret file, and one's rename must not take the other's temporary file.
    import multiprocessing

    key = os.urandom(32)
    ctx = multiprocessing.get_context("fork")
    with ctx.Pool(4) as pool:
        specs = pool.starmap(_provision_many, [(settings, key)] * 4)
    assert all(specs)
    secrets_dir = settings.secrets_dir
    assert sorted(p.name for p in secrets_dir.iterdir()) == ["acme.key"]  # no temporary left


def _provision_many(settings: Settings, key: bytes) -> bool:
    tenants = Tenants(settings, key)
    for _ in range(200):
        tenants.provision("acme")
    return True
