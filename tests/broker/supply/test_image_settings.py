"""DOCBROKER_IMAGE_RECORDS and DOCBROKER_IMAGE_TRUST_KEYS: the broker and `docbroker image`
read them the same way (broker/settings/supply.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from broker.settings import Settings, SettingsError, image_supply_from_env
from broker.testing import make_broker
from tests.broker.support import serve_once

BROKER_ENV = {"DOCBROKER_AUTH_ISSUER": "https://idp.test", "DOCBROKER_AUTH_AUDIENCE": "docbroker",
              "DOCBROKER_AUTH_JWKS_URL": "https://idp.test/jwks"}  # fmt: skip


def test_records_default_to_the_data_dir_and_no_key_is_trusted(tmp_path: Path) -> None:
    env = {"DOCBROKER_DATA_DIR": str(tmp_path)}
    supply = image_supply_from_env(env)
    assert supply.records_dir == tmp_path / "images"
    assert supply.trust_keys == ()
    assert Settings.from_env(BROKER_ENV | env).supply == supply


def test_trust_keys_are_a_comma_separated_list_of_paths(tmp_path: Path) -> None:
    env = {
        "DOCBROKER_IMAGE_RECORDS": str(tmp_path / "records"),
        "DOCBROKER_IMAGE_TRUST_KEYS": f" {tmp_path}/old.pub, {tmp_path}/new.pub ,",
    }
    supply = image_supply_from_env(env)
    assert supply.records_dir == tmp_path / "records"
    assert supply.trust_keys == (tmp_path / "old.pub", tmp_path / "new.pub")
    assert Settings.from_env(BROKER_ENV | env).supply == supply


# --- issue 34 item 13: keys that would check nothing stop the broker ------------------------------

KUBERNETES = {
    "DOCBROKER_RUNTIME": "kubernetes",
    "DOCBROKER_KUBE_SERVER_IMAGE": "docbroker-server@sha256:" + "ab" * 32,
    "DOCBROKER_KUBE_KEEPER_IMAGE": "docbroker-broker@sha256:" + "cd" * 32,
    # A broker Pod keeps its approvals in PostgreSQL (SQLite there is refused first).
    "DOCBROKER_DATABASE_URL": "postgresql://docbroker@/docbroker?host=/run/postgresql",
}


@pytest.mark.parametrize("value", ["", "  ", ",", " , ,"])
def test_keys_set_to_nothing_are_refused_not_read_as_trust_off(tmp_path: Path, value: str) -> None:
    """`DOCBROKER_IMAGE_TRUST_KEYS=$RELEASE_KEYS` with the shell variable unset must not start a
    broker that checks nothing (it once did, with a warning only)."""
    env = {"DOCBROKER_DATA_DIR": str(tmp_path), "DOCBROKER_IMAGE_TRUST_KEYS": value}
    for read in (image_supply_from_env, lambda e: Settings.from_env(BROKER_ENV | e)):
        with pytest.raises(SettingsError) as caught:
            read(env)
        message = "DOCBROKER_IMAGE_TRUST_KEYS is set but names no file: name one, or unset it"
        assert str(caught.value) == message


def test_keys_on_kubernetes_are_refused_in_one_line(tmp_path: Path) -> None:
    """The node pulls a tenant Pod's image, the broker never sees it: keys there were ignored."""
    env = KUBERNETES | {"DOCBROKER_IMAGE_TRUST_KEYS": str(tmp_path / "release.pub")}
    with pytest.raises(SettingsError) as caught:
        Settings.from_env(BROKER_ENV | env)
    assert str(caught.value).startswith("DOCBROKER_IMAGE_TRUST_KEYS does nothing with DOCBROKER_RUNTIME=")
    Settings.from_env(BROKER_ENV | KUBERNETES)  # without them: starts as before
    # `docbroker image verify` still reads them
    assert image_supply_from_env(env).trust_keys == (tmp_path / "release.pub",)

    broker = make_broker(tmp_path / "broker")
    broker.env.update(env)
    done = serve_once(broker)
    assert done.returncode != 0 and "Traceback" not in done.stderr
    [line] = done.stderr.strip().splitlines()
    assert "DOCBROKER_IMAGE_TRUST_KEYS does nothing with DOCBROKER_RUNTIME=kubernetes" in line
