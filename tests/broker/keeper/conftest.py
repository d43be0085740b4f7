"""Fixtures of the keeper tests: a real keeper subprocess per test (`keeper_support.py`)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.broker.keeper.keeper_support import Keeper, start_keeper, wait_serving


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def keeper(tmp_path: Path) -> Iterator[Keeper]:
    running = wait_serving(start_keeper(tmp_path))
    yield running
    running.stop()
