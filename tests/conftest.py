"""Fixtures for every test folder.

`chromium`: the real browser of the page tests (tests/broker/web, tests/oidc): Debian's headless
Chromium, driven at its fixed paths so Selenium Manager never downloads one. No browser: the
test fails, it does not skip.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from selenium import webdriver
from selenium.webdriver.chrome.service import Service

CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")
_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--window-size=1200,900",
)


@pytest.fixture
def chromium(tmp_path: Path) -> Iterator[webdriver.Chrome]:
    assert CHROMIUM.exists() and CHROMEDRIVER.exists(), "install Debian's chromium and chromium-driver"
    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    profile = tmp_path / "chromium-profile"
    for flag in (*_FLAGS, f"--user-data-dir={profile}"):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(executable_path=str(CHROMEDRIVER)), options=options)
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)
