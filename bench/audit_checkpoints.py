"""What signed checkpoints add to the audit cost of one request, against the plain hash chain.

    python bench/audit_checkpoints.py [--events 200000] [--chunk 1000]

Two logs are written side by side with the real writer (`AuditLog.open`, the file sink, fsync
on its interval as in the broker): a plain chain, and one with evidence on at the broker's
defaults (an Ed25519 key, a checkpoint every 1000 lines and every 10 s, a witness file, rotation
at 256 MiB). The same events go to both in chunks of `--chunk`, the two configurations timed in
alternating order chunk by chunk, in CPU time of the writing thread. Per event it times what the
gateway pays: `emit` and the `settle` that follows an answer (the chain hash, and with evidence
the RFC 6962 leaf and tree nodes). Each signed chunk holds one checkpoint, so the figure is
amortized. Reported: medians and deciles over chunks, the paired difference, and the cost of
one checkpoint on its own (tree head, signature, the line, the witness copy).

Target (issue 19): ≤ 5 µs per event over the plain chain, amortized. Exit status 0 PASS, 1 FAIL.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from broker.audit import AuditLog
from broker.settings import AuditSettings

TARGET_US = 5.0


def fields(i: int) -> dict[str, Any]:
    return {
        "request_id": f"req-{i:08d}",
        "tenant": f"tenant-{i % 50}",
        "subject": f"user{i % 500}@example.com",
        "method": "tools/call",
        "tool": ("search_documents", "read_document", "save_report")[i % 3],
        "arg_names": ["max_results", "query"],
        "header_names": ["Mcp-Method", "Mcp-Name", "Mcp-Protocol-Version"],
        "outcome": "ok",
        "reason": "ok",
        "duration_ms": 1.25,
        "bytes_in": 180,
        "bytes_out": 2048,
        "sandbox": "ctr-0123abcd",
        "protocol": "2026-07-28",
        "status": 200,
    }


def settings(folder: Path, evidence: bool) -> AuditSettings:
    if not evidence:
        return AuditSettings(path=folder / "plain.jsonl", key_file=None, witness_file=None, rotate_bytes=0)
    return AuditSettings(
        path=folder / "signed.jsonl",
        key_file=folder / "audit-signing.key",
        witness_file=folder / "witness.jsonl",
        replica="bench",
        rotate_bytes=256 * 1024 * 1024,
    )


async def chunk_us(log: AuditLog, batch: list[dict[str, Any]]) -> float:
    """CPU time per event of `emit` + `settle` over one chunk (a thread-CPU clock: other
    processes on a shared machine do not count, waiting for a CPU neither)."""
    start = time.thread_time()
    for f in batch:
        await log.emit("mcp.request", **f)
        log.settle()
    return (time.thread_time() - start) / len(batch) * 1e6


async def checkpoint_us(folder: Path, times: int = 200) -> float:
    log = await AuditLog.open(settings(folder, True))
    try:
        samples = []
        for i in range(times):
            await log.emit("mcp.request", **fields(i))
            log.settle()
            start = time.perf_counter()
            log._checkpoint_if_due(1)  # the same call the timer thread makes, minus the thread hop
            samples.append(time.perf_counter() - start)
    finally:
        await log.close()
    return statistics.median(samples) * 1e6


async def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--events", type=int, default=200_000, help="events per configuration")
    parser.add_argument(
        "--chunk", type=int, default=1000, help="events per timed chunk (one checkpoint each)"
    )
    args = parser.parse_args()
    plain: list[float] = []
    signed: list[float] = []
    with tempfile.TemporaryDirectory(prefix="audit-bench-") as tmp:
        folder = Path(tmp)
        logs = {
            False: await AuditLog.open(settings(folder, False)),
            True: await AuditLog.open(settings(folder, True)),
        }
        try:
            for k in range(args.events // args.chunk):
                batch = [fields(k * args.chunk + i) for i in range(args.chunk)]
                # Paired chunks in alternating order, so drifts of the machine hit both alike.
                for evidence in (False, True) if k % 2 == 0 else (True, False):
                    (signed if evidence else plain).append(await chunk_us(logs[evidence], batch))
            checkpoints = logs[True].stats.checkpoints
        finally:
            for log in logs.values():
                await log.close()
        one_checkpoint = await checkpoint_us(folder / "one")
    added = [s - p for s, p in zip(signed, plain, strict=True)]
    median_added = statistics.median(added)
    verdict = "PASS" if median_added <= TARGET_US else "FAIL"
    chunks = len(added)
    print(f"audit CPU per request (emit + settle): {chunks} paired chunks of {args.chunk} events, median")
    print(f"{'':36} {'µs/event':>9} {'p10':>7} {'p90':>7}")
    for name, values in (
        ("plain chain", plain),
        ("checkpoints on (every 1000 / 10 s)", signed),
        ("added", added),
    ):
        deciles = statistics.quantiles(values, n=10)
        print(f"{name:36} {statistics.median(values):9.2f} {deciles[0]:7.2f} {deciles[-1]:7.2f}")
    print(f"target: added <= {TARGET_US:.0f} µs amortized: {verdict}")
    print(f"one checkpoint (tree head, Ed25519 signature, line, witness copy): {one_checkpoint:.1f} µs")
    print(f"checkpoints written: {checkpoints} for {chunks * args.chunk} events")
    return 0 if verdict == "PASS" else 1


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
