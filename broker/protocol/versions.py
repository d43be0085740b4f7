"""MCP protocol versions and the `_meta` keys the broker reads or writes."""

from __future__ import annotations

from typing import Final

# The stateless protocol: the version rides in each request's `_meta`, results carry their type.
MODERN: Final = "2026-07-28"
# The session-era protocol (`initialize`, `Mcp-Session-Id`), assumed when a client names none.
LEGACY: Final = "2025-11-25"

META_PROTOCOL: Final = "io.modelcontextprotocol/protocolVersion"
META_CAPABILITIES: Final = "io.modelcontextprotocol/clientCapabilities"
META_SERVER_INFO: Final = "io.modelcontextprotocol/serverInfo"
