"""Fixtures for the auth tests: one set of real keys per session, a JWKS file, the HS256 dev
secret, and Authenticators on a fixed clock."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from broker.auth import Authenticator, key_source
from broker.settings import AuthSettings
from tests.broker.auth.jwt_forge import AUDIENCE, DEV_SECRET, ISSUER, NOW, TENANTS, Forge, make_forge


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="session")
def forge() -> Forge:
    return make_forge()  # RSA generation is the slow part: once per session


@pytest.fixture
def jwks_file(tmp_path: Path, forge: Forge) -> Path:
    path = tmp_path / "jwks.json"
    path.write_text(json.dumps(forge.jwks()))
    return path


@pytest.fixture
def dev_secret_file(tmp_path: Path) -> Path:
    path = tmp_path / "dev.key"
    path.write_bytes(DEV_SECRET + b"\n")
    os.chmod(path, 0o600)
    return path


@pytest.fixture
def make_auth() -> Callable[..., Authenticator]:
    """An Authenticator on the fixed clock `NOW`, for the given AuthSettings overrides."""

    def make(known_tenant: Callable[[str], bool] = TENANTS.__contains__, **overrides: Any) -> Authenticator:
        settings = AuthSettings(**{"issuer": ISSUER, "audience": AUDIENCE, **overrides})
        return Authenticator(settings, known_tenant, key_source(settings), clock=lambda: NOW)

    return make


@pytest.fixture
def auth(make_auth: Callable[..., Authenticator], jwks_file: Path) -> Authenticator:
    return make_auth(jwks_file=jwks_file)


@pytest.fixture
def dev_auth(make_auth: Callable[..., Authenticator], dev_secret_file: Path) -> Authenticator:
    return make_auth(dev_hs256_secret_file=dev_secret_file)
