"""Throughput of `docbroker audit verify`, `audit query` and `audit export` on a generated log.

    python bench/audit_throughput.py [--mb 1024] [--keep DIR]

Writes a log of about `--mb` MiB in a temporary folder with the real writer (`AuditLog`, the
same pipeline, chain and file sink the broker uses; a fixed clock advancing 20 ms per event) and
a mix of events shaped like a busy broker's: tools/call of the three tools, tools/list, denials,
approvals and sandbox events over 50 tenants and 500 subjects. Then runs each command as a
security team would, the real CLI in a child process with its output sent to /dev/null, and
prints one table: lines read, wall time, the child's CPU time, lines per CPU second and MiB/s.
The CPU column is the one to compare across runs on a shared machine; wall time includes
waiting for a CPU.

The temporary folder is removed at the end unless `--keep` names a folder to write into.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import resource
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from broker.audit import AuditEvent, AuditLog  # noqa: E402
from broker.audit.processors import rfc3339_ms  # noqa: E402
from broker.settings import AuditSettings  # noqa: E402

START_NS = 1_796_000_000 * 10**9
STEP_NS = 20_000_000  # 50 events a second
TENANTS = [f"tenant-{i:02d}" for i in range(50)]
SUBJECTS = [f"user{i:03d}@example.com" for i in range(500)]
TOOLS = {
    "search_documents": ["max_results", "query"],
    "read_document": ["filename"],
    "save_report": ["content", "filename"],
}


class Clock:
    def __init__(self) -> None:
        self.now = START_NS

    def __call__(self) -> int:
        return self.now


def event(rng: random.Random, i: int) -> tuple[AuditEvent, dict[str, Any]]:
    tenant, subject = rng.choice(TENANTS), rng.choice(SUBJECTS)
    base: dict[str, Any] = {"request_id": f"req-{i:010d}", "tenant": tenant, "subject": subject}
    roll = rng.random()
    if roll < 0.02:
        return AuditEvent.SANDBOX_STARTED, {
            "tenant": tenant,
            "sandbox": f"ctr-{i:08x}",
            "sandbox_mode": "rootless",
        }
    if roll < 0.025:
        return AuditEvent.SANDBOX_FAILED, {"tenant": tenant, "sandbox": f"ctr-{i:08x}", "reason": "crashed"}
    if roll < 0.05:
        return AuditEvent.AUTH_DENIED, {
            "outcome": "denied",
            "reason": "expired",
            "status": 401,
            "request_id": base["request_id"],
        }
    if roll < 0.08:
        return AuditEvent.APPROVAL_DECIDED, base | {
            "approval_id": f"apr-{i:08x}",
            "decision": "approved",
            "outcome": "ok",
        }
    tool = rng.choice(list(TOOLS))
    call = base | {
        "method": "tools/call",
        "tool": tool,
        "arg_names": TOOLS[tool],
        "header_names": ["Mcp-Protocol-Version", "Mcp-Session-Id"],
        "duration_ms": round(rng.uniform(0.5, 40), 3),
        "bytes_in": rng.randrange(100, 4000),
        "bytes_out": rng.randrange(100, 60000),
        "sandbox": f"ctr-{rng.randrange(1 << 32):08x}",
        "protocol": "2026-07-28",
        "status": 200,
    }
    if roll < 0.12:
        return AuditEvent.POLICY_DENIED, call | {
            "outcome": "denied",
            "reason": "tool_not_allowed",
            "status": 403,
        }
    if roll < 0.15:
        return AuditEvent.MCP_REQUEST, call | {
            "method": "tools/list",
            "tool": None,
            "arg_names": None,
            "outcome": "ok",
        }
    outcome, reason = ("ok", "ok") if roll < 0.97 else ("failed", "upstream_error")
    return AuditEvent.MCP_REQUEST, call | {"outcome": outcome, "reason": reason}


async def generate(path: Path, target_bytes: int) -> int:
    rng, clock = random.Random(19), Clock()
    lines = 0
    async with await AuditLog.open(
        AuditSettings(path=path, key_file=None, witness_file=None, rotate_bytes=0), clock=clock
    ) as log:
        while True:
            for _ in range(10_000):
                clock.now += STEP_NS
                name, fields = event(rng, lines)
                await log.emit(name, **fields)
                lines += 1
            if path.stat().st_size >= target_bytes:
                return lines


@dataclass
class Row:
    name: str
    lines: int
    wall: float
    cpu: float
    size: int
    ok: bool = True

    @property
    def lines_per_cpu_s(self) -> float:
        return self.lines / self.cpu if self.cpu else 0.0

    @property
    def mib_per_cpu_s(self) -> float:
        return self.size / (1 << 20) / self.cpu if self.cpu else 0.0

    def summary(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "lines": self.lines,
            "wall_s": self.wall,
            "cpu_s": self.cpu,
            "lines_per_cpu_s": self.lines_per_cpu_s,
            "mib_per_cpu_s": self.mib_per_cpu_s,
            "ok": self.ok,
        }

    def render(self) -> str:
        rate, mib = self.lines_per_cpu_s, self.mib_per_cpu_s
        return (
            f"| {self.name} | {self.lines:,} | {self.wall:.1f} | {self.cpu:.1f} | {rate:,.0f} | {mib:,.0f} |"
        )


def run(name: str, args: list[str], lines: int, size: int) -> Row:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    with open(os.devnull, "wb") as sink:
        done = subprocess.run(
            [sys.executable, "-m", "broker.cli", "audit", *args],
            stdout=sink,
            stderr=subprocess.PIPE,
            cwd=ROOT,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
            check=False,
        )
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        sys.stderr.write(f"{name}: exit {done.returncode}: {done.stderr.decode(errors='replace')[:300]}\n")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return Row(name, lines, wall, cpu, size, done.returncode == 0)


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--mb", type=int, default=1024, help="size of the generated log in MiB")
    parser.add_argument("--keep", type=Path, help="write the log into this folder and keep it")
    parser.add_argument("--json", type=Path, help="also write the results as JSON here")
    opts = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="audit-bench-") as tmp:
        folder = opts.keep or Path(tmp)
        path = folder / "audit.jsonl"
        path.unlink(missing_ok=True)
        started = time.perf_counter()
        lines = asyncio.run(generate(path, opts.mb << 20))
        size = path.stat().st_size
        took = time.perf_counter() - started
        print(
            f"generated {lines:,} lines, {size / (1 << 20):,.0f} MiB, with the real writer in {took:.0f} s "
            f"({lines / took:,.0f} lines/s, including the hash chain)\n"
        )
        middle = rfc3339_ms(START_NS + lines // 2 * STEP_NS)
        f = str(path)
        commands = [
            ("verify", ["verify", f]),
            ("query --json (all lines)", ["query", "--json", f]),
            ("query --json --tenant (1 of 50)", ["query", "--json", "--tenant", "tenant-07", f]),
            ("query --json --since (second half)", ["query", "--json", "--since", middle, f]),
            ("query table --outcome denied", ["query", "--outcome", "denied", f]),
            ("query table --subject (1 of 500)", ["query", "--subject", "user042@example.com", f]),
            (
                "export --format ocsf --tenant (1 of 50)",
                ["export", "--format", "ocsf", "--tenant", "tenant-07", f],
            ),
            ("export --format ocsf (all lines)", ["export", "--format", "ocsf", f]),
        ]
        print("| command | lines read | wall s | CPU s | lines / CPU s | MiB / CPU s |")
        print("|---|---:|---:|---:|---:|---:|")
        rows = []
        for name, args in commands:
            rows.append(run(name, args, lines, size))
            print(rows[-1].render(), flush=True)
    if opts.json:
        summary = {
            "lines": lines,
            "size_bytes": size,
            "generate_s": took,
            "commands": [r.summary() for r in rows],
        }
        opts.json.write_text(json.dumps(summary, indent=2))
    return 0 if all(r.ok for r in rows) else 1


if __name__ == "__main__":
    # Stopped (make_report's timeout): unwind through the clean-up, as Ctrl-C would.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    sys.exit(main())
