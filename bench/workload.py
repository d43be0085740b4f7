"""The workload every target is called with: the documents and the calls, the protocol."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
TENANT = "bench"
PROTOCOL = "2026-07-28"
LEGACY_PROTOCOL = "2025-11-25"
MCP_PROXY_SPEC = "mcp-proxy==0.13.0"  # pinned: a peer whose numbers move is no yardstick
DEFAULT_PROXY_VENV = (
    Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "docbroker-bench" / ("venv-mcp-proxy")
)

TARGET_ADDED_MS = 1.5
TARGET_THROUGHPUT = 0.85
TARGET_RATIO = 1 / 3

# The workload: alternate a search (reads every candidate) and a read of one document.
CALLS: tuple[tuple[str, dict[str, Any]], ...] = (
    ("search_documents", {"query": "budget", "max_results": 3}),
    ("read_document", {"filename": "doc2.md"}),
)
OK_MARKERS = (b'"status":"ok"', b'\\"status\\":\\"ok\\"')


def documents() -> dict[str, str]:
    """Six small Markdown files (about 3 KB each), the same for every server."""
    docs = {}
    for i in range(1, 7):
        topic = "budget review" if i % 2 == 0 else "quarterly plan"
        body = "\n".join(f"Line {n}: notes on the {topic} for region {i}, item {n}." for n in range(60))
        docs[f"doc{i}.md"] = f"# Document {i}\n\n{body}\n"
    return docs
