"""The sandbox image runs the server with -OO, which drops docstrings; the broker does not.

The broker pins a sandbox's tool listing and compares it with the contract it computes itself,
so what the server publishes must not depend on docstrings. This runs the real server code in
two child interpreters, one plain and one under -OO, and compares their listings.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

# Prints the listing exactly as the SDK serialises it on the wire.
LISTING = r"""
import asyncio, json, sys
from pathlib import Path
from server.app import build_server
from server.workspace import Workspace

async def main():
    server = build_server("acme", "k" * 64, Workspace(Path(sys.argv[1])))
    tools = await server.list_tools()
    print(json.dumps({
        "optimize": sys.flags.optimize,
        "tools": [t.model_dump(mode="json", by_alias=True, exclude_none=True) for t in tools],
    }, sort_keys=True))

asyncio.run(main())
"""


def _listing(root: Path, *flags: str) -> dict[str, Any]:
    child = subprocess.run(
        [sys.executable, "-B", *flags, "-c", LISTING, str(root)],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    listing: dict[str, Any] = json.loads(child.stdout)
    return listing


def test_listing_is_the_same_under_OO(tmp_path: Path) -> None:
    (tmp_path / "sources").mkdir()
    (tmp_path / "reports").mkdir()
    plain, optimized = _listing(tmp_path), _listing(tmp_path, "-OO")
    assert (plain["optimize"], optimized["optimize"]) == (0, 2)  # the second really ran without docstrings
    tools = plain["tools"]
    assert [t["name"] for t in tools] == ["search_documents", "read_document", "save_report"]
    assert all(t["description"] and t["outputSchema"] for t in tools)
    assert optimized["tools"] == tools


def test_the_real_listing_is_what_the_broker_admits(tmp_path: Path) -> None:
    """The broker admits only its own contract (DESIGN §11): the real server, as the image runs
    it (-OO), must pass admission whole, and publish exactly the contract's descriptors."""
    from broker.gateway.admission import admit
    from server import contracts as c

    (tmp_path / "sources").mkdir()
    (tmp_path / "reports").mkdir()
    tools = _listing(tmp_path, "-OO")["tools"]
    admission = admit(tools)
    assert admission.rejected == []
    assert sorted(admission.tools) == sorted(c.TOOL_NAMES)
    assert tools == [c.tool_descriptor(t["name"]) for t in tools]
