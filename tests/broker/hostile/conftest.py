"""Fixtures for the attacker's-side tests: the real broker in front of a hostile server.

Each test module declares `TENANTS` (tenant ids are the lies; see
tests/fixtures/hostile_server.py) and may declare `BROKER_ENV` and `PREWARM`. The
module-scoped `hostile` fixture is that module's own real broker (`python -m broker serve`,
local runtime) whose sandboxes run the hostile server instead of the real one.

A broker takes seconds to start (it imports the MCP SDK) and so does each sandbox, so every
module's broker is started at the beginning of the session, side by side, and the `PREWARM`
tenants' sandboxes (default: all) are started and pinned at once too.
"""

from __future__ import annotations

import shlex
import sys
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import ModuleType

import pytest

from broker.testing import ROOT, Broker, make_broker
from tests.broker.hostile.hostile_helpers import BREAKER_COOLDOWN, BREAKER_THRESHOLD, CALL_TIMEOUT, Rpc

HOSTILE_SERVER = ROOT / "tests" / "fixtures" / "hostile_server.py"
DEFAULT_ENV = {
    "DOCBROKER_LOCAL_SERVER_COMMAND": shlex.join([sys.executable, str(HOSTILE_SERVER)]),
    "DOCBROKER_CALL_TIMEOUT": str(CALL_TIMEOUT),
    "DOCBROKER_BREAKER_THRESHOLD": str(BREAKER_THRESHOLD),
    "DOCBROKER_BREAKER_COOLDOWN": str(BREAKER_COOLDOWN),
}
SOURCES = {
    "notes.md": "hello docbroker world\n",
    "plan.md": "# Plan\nship the broker\n",
    "crash.md": "survived\n",  # reading it kills some hostile servers
    "pause.md": "took a while\n",  # reading it takes 0.8 s in every hostile server
}


@pytest.fixture(scope="module")
def anyio_backend() -> str:
    return "asyncio"


def _prepare(module: ModuleType, tmp: Path) -> Broker:
    tenants: tuple[str, ...] = module.TENANTS
    env = {**DEFAULT_ENV, **getattr(module, "BROKER_ENV", {})}
    broker = make_broker(tmp, env=env, tenants=tenants)
    for tenant in tenants:
        sources = broker.sources(tenant)
        sources.mkdir(parents=True)
        for name, text in SOURCES.items():
            (sources / name).write_text(text)
    return broker


def _prewarm(broker: Broker, tenant: str) -> None:
    """Start the tenant's sandbox and pin its tools. Tried again if the first start is slow
    (many start at once): an answered request also resets the tenant's circuit breaker."""
    for _ in range(3):
        if Rpc(broker, tenant).post("server/discover").status == 200:
            return


@pytest.fixture(scope="session")
def _hostile_brokers(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[ModuleType, Broker]]:
    modules = list(
        dict.fromkeys(item.module for item in request.session.items if "hostile" in item.fixturenames)
    )
    brokers: dict[ModuleType, Broker] = {}
    folders = threading.Lock()

    def start(module: ModuleType) -> None:
        # Once more with a new port and folder if the first start fails: another test run on
        # the host may have taken the port between free_port() and the broker's bind.
        for attempt in (1, 2):
            with folders:
                tmp = tmp_path_factory.mktemp("hostile-broker")
            broker = brokers[module] = _prepare(module, tmp)
            try:
                broker.start()
                return
            except RuntimeError:
                broker.stop()
                if attempt == 2:
                    raise

    try:
        with ThreadPoolExecutor(max(len(modules), 1)) as pool:
            list(pool.map(start, modules))
        warm = [(b, t) for m, b in brokers.items() for t in getattr(m, "PREWARM", m.TENANTS)]
        if warm:
            with ThreadPoolExecutor(len(warm)) as pool:
                list(pool.map(lambda job: _prewarm(*job), warm))
        yield brokers
    finally:
        with ThreadPoolExecutor(max(len(brokers), 1)) as pool:
            list(pool.map(Broker.stop, brokers.values()))


@pytest.fixture(scope="module")
def hostile(request: pytest.FixtureRequest, _hostile_brokers: dict[ModuleType, Broker]) -> Broker:
    return _hostile_brokers[request.module]
