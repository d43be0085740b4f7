"""One real OpenID Provider and one broker signing approvers in with it, per test module."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from broker.testing import Broker
from tests.oidc.support import Provider, provider_and_broker


@pytest.fixture(scope="module")
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="module")
def oidc(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Provider, Broker]]:
    with provider_and_broker(tmp_path_factory.mktemp("oidc")) as pair:
        yield pair


@pytest.fixture(scope="module")
def broker(oidc: tuple[Provider, Broker]) -> Broker:
    return oidc[1]


@pytest.fixture(scope="module")
def provider(oidc: tuple[Provider, Broker]) -> Provider:
    return oidc[0]
