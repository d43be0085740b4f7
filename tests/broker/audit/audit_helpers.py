"""Shared values and helpers for the audit tests (fixtures live in conftest.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from broker.audit import AuditLog
from broker.audit.checkpoint import Signer, load_signing_key, public_pem
from broker.settings import AuditFsync, AuditSettings
from broker.testing import ROOT

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


@dataclass
class Replica:
    """One replica's files: its log, witness copy, signing key and the public key a team holds."""

    dir: Path
    name: str

    @property
    def log(self) -> Path:
        return self.dir / "audit.jsonl"

    @property
    def witness(self) -> Path:
        return self.dir / "witness.jsonl"

    @property
    def key_file(self) -> Path:
        return self.dir / "audit-signing.key"

    @property
    def signer(self) -> Signer:
        return load_signing_key(self.key_file)

    @property
    def public(self) -> Path:
        path = self.dir / "public.pem"
        if not path.exists():
            path.write_text(public_pem(self.signer.private.public_key()))
        return path

    def settings(self, every: int = 5) -> AuditSettings:
        return AuditSettings(
            path=self.log,
            key_file=self.key_file,
            witness_file=self.witness,
            replica=self.name,
            checkpoint_every=every,
        )

    def lines(self, path: Path | None = None) -> list[bytes]:
        return (path or self.log).read_bytes().splitlines(keepends=True)


async def write_log(tmp_path: Path, name: str = "r1", events: int = 22, every: int = 5) -> Replica:
    replica = Replica(tmp_path / name, name)
    async with await AuditLog.open(replica.settings(every)) as log:
        for i in range(events):
            await log.emit("mcp.request", **request_fields(i))
    return replica


def docbroker(
    *args: str | Path, env: dict[str, str] | None = None, stdin: str | None = None
) -> subprocess.CompletedProcess[str]:
    """`python -m broker ...` as a security team runs it: a fresh process, this checkout's code
    (or a broker's environment), never a traceback."""
    result = subprocess.run(
        [sys.executable, "-m", "broker", *map(str, args)],
        cwd=ROOT,
        env=env or {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PYTHONPATH": str(ROOT)},
        input=stdin,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert "Traceback" not in result.stderr, result.stderr
    return result
