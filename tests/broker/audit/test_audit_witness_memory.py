"""`audit verify --witness` streams the witness: its memory does not grow with the witness.

A witness held a dict per checkpoint: 1M checkpoints took 1.47 GiB to verify, a year of them
about 4.5 GiB (issue 24). Here a real log is cut back behind a witness grown to 200k checkpoints
(about 90 MB, well past the bound when held) and `docbroker audit verify` must still find the
cut, which needs every record, within the bound. Timing and larger witnesses:
bench/audit_witness_memory.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from test_audit_evidence import write_log

from broker.testing.audit_cli import grow_witness, run_audit

pytestmark = pytest.mark.anyio
CHECKPOINTS = 200_000
BOUND_MIB = 100  # issue 24's target, whatever the witness's size


async def test_a_witness_of_200k_checkpoints_is_verified_in_bounded_memory(tmp_path: Path) -> None:
    replica = await write_log(tmp_path, events=22, every=5)
    lines = len(replica.lines())
    shipped = sum(1 for _ in replica.witness.open("rb"))
    grow_witness(replica.witness, CHECKPOINTS, start=lines + 1)

    run = run_audit("verify", replica.log, "--witness", replica.witness, timeout=120)
    assert not run.hung and "Traceback" not in run.stderr, run.stderr
    assert run.code == 1, run.stdout
    assert f"log cut back: the witness holds a checkpoint over {lines + CHECKPOINTS} lines" in run.stdout
    assert f"witness OK: {shipped + CHECKPOINTS} records" in run.stdout
    assert run.peak_mib < BOUND_MIB, f"peak {run.peak_mib:.0f} MiB for {CHECKPOINTS} checkpoints"
