"""Fixtures of the keeper tests: a real keeper subprocess per test (`keeper_support.py`)."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
for path in (HERE, HERE.parents[2]):
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))

from keeper_support import Keeper, start_keeper, wait_serving  # noqa: E402


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def keeper(tmp_path: Path) -> Iterator[Keeper]:
    running = wait_serving(start_keeper(tmp_path))
    yield running
    running.stop()
