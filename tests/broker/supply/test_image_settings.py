"""DOCBROKER_IMAGE_RECORDS and DOCBROKER_IMAGE_TRUST_KEYS: the broker and `docbroker image`
read them the same way (broker/settings.py)."""

from __future__ import annotations

from pathlib import Path

from broker.settings import Settings, image_supply_from_env

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
