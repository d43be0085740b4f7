"""`docbroker audit …` run as a security team runs it, measured: for tests and `bench/`.

`run_audit` starts the CLI under a small wrapper process of its own, so the child's peak RSS
(`getrusage(RUSAGE_CHILDREN).ru_maxrss` of the wrapper) is that one run's and nothing else's;
a run that outlives its timeout is killed with its whole process group and reported as hung
(a FIFO or `/dev/zero` planted as a log must not hang the tools, and a test should say so
rather than leave a reader blocked). The child's address space is capped (`memory_cap`) so
that code that does read `/dev/zero` whole fails fast instead of taking the host's memory.

`grow_witness` makes a witness as long as a year of checkpoints, from one genuine record.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from broker.testing import ROOT

# Runs the CLI (argv[3:]) with its address space capped at argv[2] bytes, then writes its peak
# RSS in KiB to the file argv[1]; exits with the CLI's status.
_WRAPPER = """
import resource, subprocess, sys
cap = int(sys.argv[2])
def limit():
    resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
code = subprocess.call(sys.argv[3:], preexec_fn=limit)
with open(sys.argv[1], "w") as out:
    out.write(str(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss))
sys.exit(code)
"""


@dataclass(frozen=True)
class AuditRun:
    code: int | None  # None: hung, killed after the timeout
    stdout: str
    stderr: str
    peak_mib: float  # the CLI process's peak resident memory
    seconds: float

    @property
    def hung(self) -> bool:
        return self.code is None


def run_audit(
    *args: str | Path,
    stdin: bytes | None = None,
    timeout: float = 60.0,
    memory_cap: int = 2 << 30,
    root: Path = ROOT,
) -> AuditRun:
    """`python -m broker audit ARGS` from this checkout (or the one at `root`: bench's
    `--compare`), in a fresh process group."""
    with tempfile.TemporaryDirectory() as folder:
        peak_file = Path(folder) / "peak"
        command = [sys.executable, "-c", _WRAPPER, str(peak_file), str(memory_cap)]
        command += [sys.executable, "-m", "broker", "audit", *map(str, args)]
        started = time.monotonic()
        process = subprocess.Popen(
            command,
            cwd=root,
            env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PYTHONPATH": str(root)},
            stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
        try:
            out, err = process.communicate(stdin, timeout=timeout)
            code: int | None = process.returncode
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            out, err = process.communicate()
            code = None
        seconds = time.monotonic() - started
        peak = int(peak_file.read_text()) / 1024 if peak_file.exists() else 0.0
    return AuditRun(code, out.decode("utf-8", "replace"), err.decode("utf-8", "replace"), peak, seconds)


def grow_witness(witness: Path, count: int, *, start: int) -> None:
    """Append `count` checkpoint records to `witness`, of the log of its last checkpoint, at
    tree sizes `start`, `start + 1`, ….

    The records are in the witness's own form with made-up tree heads and the genuine record's
    signature (so they are checked by form, not signature: verify them without `--key`). Sizes
    past the log's end make `audit verify` report the log cut back, which needs every record.
    """
    last = None
    with witness.open("rb") as stream:
        for raw in stream:
            record = json.loads(raw)
            if "checkpoint" in record:
                last = record
    if last is None:
        raise ValueError("the witness holds no checkpoint to copy")
    body, sig = last["checkpoint"], last["sig"]
    # The writer's canonical form (keys sorted), as text around the three fields that change:
    # json.dumps per record would take most of a million-record run.
    a = f'{{"checkpoint":{{"key":"{body["key"]}","log":"{body["log"]}","n":'
    b = f',"prev":"{body["prev"]}","replica":"{body["replica"]}","root":"'
    c = '","size":'
    d = f',"time":"{body["time"]}","v":1}},"sig":"{sig}"}}\n'
    with witness.open("a", encoding="ascii") as out:
        batch: list[str] = []
        for i in range(count):
            size = start + i
            tree_head = hashlib.sha256(size.to_bytes(8, "big")).hexdigest()
            batch.append(f"{a}{body['n'] + 1 + i}{b}{tree_head}{c}{size}{d}")
            if len(batch) == 10_000:
                out.write("".join(batch))
                batch.clear()
        out.write("".join(batch))
