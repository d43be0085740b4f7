"""Peak memory of `docbroker audit verify --witness` as the witness grows.

    python bench/audit_witness_memory.py [--checkpoints 100000 1000000] [--compare DIR]

A real log is written with the real writer (22 events, a signed checkpoint every 5 lines,
a witness file); its witness is then grown to N checkpoints of the same log past the log's
end, as a year of checkpoints shipped off the host would be after the log was cut back
(broker.testing.audit_cli.grow_witness). `audit verify LOG --witness W` runs in a fresh child,
and its peak RSS (ru_maxrss) and wall time are printed; the verdict must be "log cut back",
which needs every record read. Without `--key`: the grown records carry a copied signature, and
signatures cost time, not memory. `--compare DIR` runs another checkout's CLI on the same files.

Target (issue 24): ≤ 100 MiB whatever N (before: 1.47 GiB for 1M checkpoints). Exit status
0 PASS, 1 FAIL.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from broker.audit import AuditEvent, AuditLog
from broker.settings import AuditSettings
from broker.testing import ROOT
from broker.testing.audit_cli import grow_witness, run_audit
from broker.types import Outcome

TARGET_MIB = 100.0


async def write_log(folder: Path) -> tuple[Path, Path, int]:
    """(log, witness, lines in the log)."""
    log, witness = folder / "audit.jsonl", folder / "witness.jsonl"
    settings = AuditSettings(
        path=log, key_file=folder / "key", witness_file=witness, replica="r1", checkpoint_every=5
    )
    async with await AuditLog.open(settings) as audit:
        for i in range(22):
            await audit.emit(
                AuditEvent.MCP_REQUEST, request_id=f"req-{i:06d}", tenant="acme", outcome=Outcome.OK
            )
    return log, witness, len(log.read_bytes().splitlines())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoints", type=int, nargs="+", default=[100_000, 1_000_000])
    parser.add_argument("--compare", type=Path, help="another checkout, run on the same files")
    args = parser.parse_args()
    logging.getLogger("broker").setLevel(logging.ERROR)  # "created a new audit signing key"
    roots = [("this tree", ROOT)] + ([("compare", args.compare.resolve())] if args.compare else [])
    print(f"{'checkpoints':>12} {'witness MiB':>12}  {'tree':<10} {'peak MiB':>9} {'seconds':>8}  verdict")
    passed = True
    with tempfile.TemporaryDirectory() as folder:
        log, witness, lines = asyncio.run(write_log(Path(folder)))
        grown = 0
        for count in sorted(args.checkpoints):
            grow_witness(witness, count - grown, start=lines + 1 + grown)
            grown = count
            size = witness.stat().st_size / 2**20
            for name, root in roots:
                run = run_audit(
                    "verify", log, "--witness", witness, timeout=600, memory_cap=8 << 30, root=root
                )
                verdict = "cut back found" if run.code == 1 and "log cut back" in run.stdout else "WRONG"
                if name == "this tree":
                    passed = passed and verdict != "WRONG" and run.peak_mib <= TARGET_MIB
                figures = f"{run.peak_mib:>9.1f} {run.seconds:>8.1f}"
                print(f"{count:>12} {size:>12.0f}  {name:<10} {figures}  {verdict}")
    print(f"target: ≤ {TARGET_MIB:.0f} MiB peak whatever the witness's size: {'PASS' if passed else 'FAIL'}")
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
