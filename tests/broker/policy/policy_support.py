"""A real broker with shipped example policies in force, and the hash of its policy set."""

from __future__ import annotations

import contextlib
import shutil
from collections.abc import Iterator
from pathlib import Path

from broker.policy import Policies, PolicyEngine
from broker.testing import ROOT, Broker, make_broker

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
