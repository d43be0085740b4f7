"""The audit tools stream: their memory does not grow with the witness or the log's checkpoints.

A witness held a dict per checkpoint: 1M checkpoints took 1.47 GiB to verify, a year of them
about 4.5 GiB (issue 24). Here a real log is cut back behind a witness grown to 200k checkpoints
(about 90 MB, well past the bound when held) and `docbroker audit verify` must still find the
cut, which needs every record, within the bound. `prove` kept every checkpoint of the log in a
list the same way: a real log with a checkpoint after every line must be proved within the bound
too. Timing and larger witnesses: bench/audit_witness_memory.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_audit_proofs import check

from broker.testing.audit_cli import grow_witness, run_audit
from tests.broker.audit.audit_helpers import write_log

pytestmark = pytest.mark.anyio
CHECKPOINTS = 200_000
BOUND_MIB = 100  # issue 24's target, whatever the witness's size
LOG_CHECKPOINTS = 60_000  # about 130 MiB when each is kept


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


async def test_prove_keeps_only_the_checkpoints_it_needs(tmp_path: Path) -> None:
    replica = await write_log(tmp_path, events=LOG_CHECKPOINTS, every=1)
    for args in (("--seq", "7"), ("--from", "2")):
        run = run_audit("prove", replica.log, *args, timeout=120)
        assert not run.hung and run.code == 0 and "Traceback" not in run.stderr, run.stderr
        assert check(json.loads(run.stdout), replica.public).returncode == 0
        assert run.peak_mib < BOUND_MIB, f"peak {run.peak_mib:.0f} MiB for {LOG_CHECKPOINTS} checkpoints"
