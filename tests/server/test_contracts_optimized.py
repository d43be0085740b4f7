"""The sandbox image runs the server with -OO, which drops docstrings; the broker does not.

The broker pins a sandbox's tool listing and compares it with the contract it computes itself,
so what the server publishes must not depend on docstrings. This runs the real server code
under -OO in a child interpreter and compares its listing with this process's.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from server.app import build_server
from server.workspace import Workspace

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


def _listing_here(root: Path) -> list[dict[str, Any]]:
    async def main() -> list[dict[str, Any]]:
        server = build_server("acme", "k" * 64, Workspace(root))
        tools = await server.list_tools()
        return [t.model_dump(mode="json", by_alias=True, exclude_none=True) for t in tools]

    return json.loads(json.dumps(asyncio.run(main()), sort_keys=True))


def test_listing_is_the_same_under_OO(tmp_path: Path) -> None:
    (tmp_path / "sources").mkdir()
    (tmp_path / "reports").mkdir()
    child = subprocess.run(
        [sys.executable, "-B", "-OO", "-c", LISTING, str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    optimized = json.loads(child.stdout)
    assert optimized["optimize"] == 2  # the child really ran without docstrings
    here = _listing_here(tmp_path)
    assert [t["name"] for t in here] == ["search_documents", "read_document", "save_report"]
    assert all(t["description"] and t["outputSchema"] for t in here)
    assert optimized["tools"] == here
