"""SSE parsing CPU against the size of one event a sandbox sends in small chunks.

A hostile sandbox chooses how its stream is cut. Parsing must stay linear in the bytes sent:
CPU time x2 per doubling of the event, not x4 (issue 24 item 4: a parser that rebuilt and
searched its whole buffer on every chunk took seconds of the event loop for an event of
a megabyte in 100-byte chunks).

    python bench/sse_parse.py                    # this checkout's broker/protocol/sse.py
    python bench/sse_parse.py --compare 0b1a26a  # and the sse.py of that revision, side by side

Each row: one event of SIZE bytes fed through `sse.events()` (as the relay reads a sandbox's
stream) in CHUNK-byte pieces, the best CPU time (process time) of a few runs, and the ratio to
the row before. Runs in well under a minute (`--compare` with a quadratic parser: ~30 s).
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench._stats import fmt  # noqa: E402
from broker.protocol import sse  # noqa: E402

SIZES_KIB = (128, 256, 512, 1024)
LIMIT = 2 * 1024 * 1024


def module_at(revision: str) -> Any:
    """broker/protocol/sse.py as it was at `revision` (a module of its own)."""
    source = subprocess.run(
        ["git", "show", f"{revision}:broker/protocol/sse.py"], cwd=ROOT, capture_output=True, check=True
    ).stdout
    name = f"sse_at_{revision}"
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "sse.py"
        path.write_bytes(source)
        spec = importlib.util.spec_from_file_location(name, path)
        assert spec is not None and spec.loader is not None
        module = sys.modules[name] = importlib.util.module_from_spec(spec)  # dataclasses look it up
        spec.loader.exec_module(module)
    return module


def cpu_seconds(parser: Any, size: int, chunk: int, runs: int) -> float:
    event = b"data: " + b"A" * (size - 8) + b"\n\n"
    pieces = [event[i : i + chunk] for i in range(0, len(event), chunk)]

    async def stream() -> AsyncIterator[bytes]:
        for piece in pieces:
            yield piece

    async def parse() -> int:
        return len([e async for e in parser.events(stream(), LIMIT)])

    best = float("inf")
    for _ in range(runs):
        began = time.process_time()
        assert asyncio.run(parse()) == 1
        best = min(best, time.process_time() - began)
    return best


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--chunk", type=int, default=100, help="bytes per chunk (default 100)")
    ap.add_argument("--runs", type=int, default=5, help="runs per size; the best counts (default 5)")
    ap.add_argument("--compare", metavar="REV", help="also the sse.py of this git revision")
    args = ap.parse_args()

    parsers: list[tuple[str, Any, int]] = [("this tree", sse, args.runs)]
    if args.compare:
        parsers.append((args.compare, module_at(args.compare), 1))  # a quadratic one is slow
    print(f"one SSE event in {args.chunk}-byte chunks through sse.events(); best of the runs, CPU time")
    print(f"{'parser':<12} {'event':>9} {'chunks':>7} {'CPU ms':>10} {'x per doubling':>15}")
    print("-" * 57)
    ratios: dict[str, list[float]] = {}
    for label, parser, runs in parsers:
        previous = None
        for kib in SIZES_KIB:
            seconds = cpu_seconds(parser, kib * 1024, args.chunk, runs)
            ratio = seconds / previous if previous else float("nan")
            if previous:
                ratios.setdefault(label, []).append(ratio)
            chunks = -(-(kib * 1024) // args.chunk)
            print(f"{label:<12} {kib:>5} KiB {chunks:>7} {fmt(seconds * 1000, 1):>10} {fmt(ratio):>15}")
            previous = seconds
    print()
    for label, values in ratios.items():
        mean = sum(values) / len(values)
        verdict = "linear" if mean < 3 else "quadratic"
        print(f"{label}: mean ratio per doubling {fmt(mean)} ({verdict}: ~2 is linear, ~4 quadratic)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
