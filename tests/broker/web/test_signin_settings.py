"""The OpenID Provider's settings (issue 34 item 4): the issuer over https unless it is on this
machine, as the JWKS URL and the webhook URL already are; the client secret file held to the
mode of every other secret file (broker/files.py)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from broker.settings import OidcSettings, Settings, SettingsError, WebhookSettings
from broker.web.oidc import load_client_secret
from broker.web.webhooks import load_secret

BROKER_ENV = {
    "DOCBROKER_AUTH_ISSUER": "https://idp.test",
    "DOCBROKER_AUTH_AUDIENCE": "docbroker",
    "DOCBROKER_AUTH_JWKS_URL": "https://idp.test/jwks",
    "DOCBROKER_PUBLIC_URL": "https://docbroker.example.com",
    "DOCBROKER_OIDC_CLIENT_ID": "docbroker",
}


@pytest.mark.parametrize(
    "issuer", ["http://idp.example.com", "http://10.0.0.5:8080/realms/acme", "ftp://idp.example.com"]
)
def test_an_issuer_over_plain_http_is_refused(issuer: str) -> None:
    """Discovery, the keys and the code exchange come from the issuer: over http anyone on the
    path answers them, and signs in as anyone."""
    with pytest.raises(SettingsError) as caught:
        Settings.from_env(BROKER_ENV | {"DOCBROKER_OIDC_ISSUER": issuer})
    assert str(caught.value) == "DOCBROKER_OIDC_ISSUER must be an https URL (http only on loopback)"


@pytest.mark.parametrize(
    "issuer", ["https://login.example.com/tenant/v2.0", "http://127.0.0.1:9000", "http://localhost:9000"]
)
def test_an_https_or_loopback_issuer_is_accepted(issuer: str) -> None:
    oidc = Settings.from_env(BROKER_ENV | {"DOCBROKER_OIDC_ISSUER": issuer}).oidc
    assert oidc is not None and oidc.issuer == issuer


def secret_file(tmp_path: Path, mode: int) -> Path:
    path = tmp_path / "client.secret"
    path.write_text("s3cret-value-of-the-client\n")
    path.chmod(mode)
    return path


@pytest.mark.parametrize("mode", [0o644, 0o640, 0o604, 0o660])
def test_a_client_secret_file_others_may_read_is_refused(tmp_path: Path, mode: int) -> None:
    path = secret_file(tmp_path, mode)
    settings = OidcSettings(issuer="https://idp.test", client_id="d", client_secret_file=path)
    with pytest.raises(SettingsError) as caught:
        load_client_secret(settings)
    message = str(caught.value)
    assert message == "DOCBROKER_OIDC_CLIENT_SECRET_FILE must not be readable by group or others (chmod 600)"


def test_a_private_client_secret_file_is_read_through_a_link(tmp_path: Path) -> None:
    """A Kubernetes Secret volume is links to its files: followed, and the file itself checked."""
    os.symlink(secret_file(tmp_path, 0o600), tmp_path / "link")
    settings = OidcSettings(issuer="https://idp.test", client_id="d", client_secret_file=tmp_path / "link")
    assert load_client_secret(settings) == "s3cret-value-of-the-client"
    (tmp_path / "client.secret").chmod(0o644)
    with pytest.raises(SettingsError, match="chmod 600"):
        load_client_secret(settings)


def test_the_webhook_secret_file_is_held_to_the_same_mode(tmp_path: Path) -> None:
    settings = WebhookSettings(url="https://hooks.example.com/x", secret_file=secret_file(tmp_path, 0o644))
    with pytest.raises(SettingsError) as caught:
        load_secret(settings)
    message = "DOCBROKER_WEBHOOK_SECRET_FILE must not be readable by group or others (chmod 600)"
    assert str(caught.value) == message
    settings.secret_file.chmod(0o600)
    assert load_secret(settings) == b"s3cret-value-of-the-client"
