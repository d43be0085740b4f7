"""One real OpenID Provider and one broker signing approvers in with it, per test module."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from selenium import webdriver
from selenium.webdriver.chrome.service import Service

from broker.testing import Broker
from tests.oidc.support import Provider, provider_and_broker

CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")


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


@pytest.fixture
def chromium(tmp_path: Path) -> Iterator[webdriver.Chrome]:
    """Debian's headless Chromium (installed by ./dev setup), driven at its fixed paths, so
    Selenium Manager never downloads a browser. No browser: the test fails, it does not skip."""
    assert CHROMIUM.exists() and CHROMEDRIVER.exists(), "install Debian's chromium and chromium-driver"
    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    profile = tmp_path / "chromium-profile"
    for flag in (
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--no-first-run",
        "--window-size=1200,900",
        f"--user-data-dir={profile}",
    ):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(executable_path=str(CHROMEDRIVER)), options=options)
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)
