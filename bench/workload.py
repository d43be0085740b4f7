"""The workload every target is called with: the documents and the calls, the protocol."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from broker.protocol.versions import META_CAPABILITIES, META_PROTOCOL, MODERN

REPO = Path(__file__).resolve().parents[1]
TENANT = "bench"
PROTOCOL = MODERN
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


def call_body(tool: str, arguments: dict[str, Any], request_id: int = 1) -> dict[str, Any]:
    """One tools/call as a 2026-07-28 client sends it: version and capabilities in its `_meta`."""
    meta = {META_PROTOCOL: PROTOCOL, META_CAPABILITIES: {}}
    params = {"name": tool, "arguments": arguments, "_meta": meta}
    return {"jsonrpc": "2.0", "id": request_id, "method": "tools/call", "params": params}


def routing_headers(tool: str) -> dict[str, str]:
    """The version, and the method and tool repeated for the edge (2026-07-28)."""
    return {"mcp-protocol-version": PROTOCOL, "mcp-method": "tools/call", "mcp-name": tool}


def call_headers(tool: str) -> dict[str, str]:
    """The headers sent with a call: the media types, and its routing headers."""
    media = {"accept": "application/json, text/event-stream", "content-type": "application/json"}
    return media | routing_headers(tool)


def documents() -> dict[str, str]:
    """Six small Markdown files (about 3 KB each), the same for every server."""
    docs = {}
    for i in range(1, 7):
        topic = "budget review" if i % 2 == 0 else "quarterly plan"
        body = "\n".join(f"Line {n}: notes on the {topic} for region {i}, item {n}." for n in range(60))
        docs[f"doc{i}.md"] = f"# Document {i}\n\n{body}\n"
    return docs
