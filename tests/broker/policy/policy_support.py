"""A real broker with shipped example policies in force (on SQLite or PostgreSQL), the hash of
its policy set, and the set it has in force."""

from __future__ import annotations

import contextlib
import shutil
from collections.abc import Iterator
from pathlib import Path

from broker.policy import Policies, PolicyEngine
from broker.testing import ROOT, Broker, make_broker
from tests.broker.cli.cli_helpers import cli
from tests.broker.pgtest import fresh_schema
from tests.broker.support import open_http

EXAMPLES = ROOT / "policies" / "examples"


@contextlib.contextmanager
def broker_with(tmp: Path, *examples: Path, env: dict[str, str] | None = None) -> Iterator[Broker]:
    """A started broker whose policies folder also holds `examples` (copied before it starts)."""
    broker = make_broker(tmp, env=env)
    for example in examples:
        shutil.copy(example, Path(broker.env["DOCBROKER_POLICIES_DIR"]) / example.name)
    broker.start()
    try:
        yield broker
    finally:
        broker.stop()


def set_hash(broker: Broker) -> str:
    """The hash of the set the broker's folder holds now (what its audit lines name)."""
    folder = Path(broker.env["DOCBROKER_POLICIES_DIR"])
    return PolicyEngine.load(folder, Policies.load(folder)).hash


@contextlib.contextmanager
def broker_on(
    tmp: Path, store: str, files: dict[str, str], env: dict[str, str] | None = None
) -> Iterator[Broker]:
    """A started broker whose approvals store is `store` ("sqlite", or "postgres": a fresh
    schema, upgraded as an operator does) and whose policies folder also holds `files`."""
    database = fresh_schema() if store == "postgres" else contextlib.nullcontext(None)
    with database as url:
        broker = make_broker(tmp, env={**(env or {}), **({"DOCBROKER_DATABASE_URL": url} if url else {})})
        for name, text in files.items():
            (Path(broker.env["DOCBROKER_POLICIES_DIR"]) / name).write_text(text)
        if url is not None:
            upgraded = cli(broker.env, "db", "upgrade")
            assert upgraded.returncode == 0, upgraded.stderr
        broker.start()
        try:
            yield broker
        finally:
            broker.stop()


def set_in_force(broker: Broker) -> str:
    """The hash of the set the running broker decides with (`/readyz`, for an operator)."""
    with open_http(broker) as http:
        state: str = http.get("/readyz", headers=broker.ops_headers).json()["checks"]["policy"]["set"]
    return state
