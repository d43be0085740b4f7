"""Shared values and helpers for the audit tests (fixtures live in conftest.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from broker.settings import AuditFsync, AuditSettings

# Distinctive values that must never appear in an audit file, whatever path they take.
CANARY = "CANARY-7f3a9c-secret-value"


def plain(
    path: Path, *, fsync: AuditFsync = AuditSettings.fsync, replica: str | None = None
) -> AuditSettings:
    """A plain hash chain: no signing key and no witness, so no checkpoint lines. The broker's
    own log always has a key; a test of the chain alone says it leaves it out."""
    if replica is None:
        return AuditSettings(path=path, key_file=None, witness_file=None, fsync=fsync)
    return AuditSettings(path=path, key_file=None, witness_file=None, fsync=fsync, replica=replica)


def read_events(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_bytes().splitlines()]


def request_fields(i: int = 0) -> dict[str, Any]:
    """A complete, valid mcp.request event's fields."""
    return {
        "request_id": f"req-{i:06d}",
        "tenant": "acme",
        "subject": "alice@example.com",
        "method": "tools/call",
        "tool": "search_documents",
        "arg_names": ["query", "max_results"],
        "header_names": ["Mcp-Protocol-Version", "Mcp-Session-Id"],
        "outcome": "ok",
        "reason": "ok",
        "duration_ms": 1.25,
        "bytes_in": 120,
        "bytes_out": 2048,
        "sandbox": "ctr-0123abcd",
        "sandbox_mode": "rootless",
        "limits_enforced": True,
        "image_digest": "sha256:" + "0123456789abcdef" * 4,
        "protocol": "2026-07-28",
        "status": 200,
    }
