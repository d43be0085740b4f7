"""Time to make an approval's receipt from a large log, and to check it.

    python bench/receipt.py [--lines 100000 1000000] [--decisions 10]

Writes one replica's signed log of N lines with the real writer (`AuditLog`, a checkpoint every
1000 lines, a fixed clock advancing 1 ms per event): traffic, with one approval's lines spread
through it (requested in the first tenth, `--decisions` yeses through the middle, consumed and
written near the end). Then makes the receipt as `docbroker audit receipt` does
(`receipts.make_receipt`: the store's facts are given; the store's lookup is one query) and
checks it as `verify-receipt` does. Prints one table: lines, log MiB, seconds to make, the
receipt's KiB, seconds to check.

Targets (issue 37): a 1 M-line log in under 10 s; a 10-decision receipt under 64 KiB. Exit
status 0 PASS, 1 FAIL.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import logging
import secrets
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from broker.audit import AuditEvent, AuditLog
from broker.audit.checkpoint import Keyring, load_signing_key
from broker.audit.commitment import content_commitment
from broker.audit.receipt_check import check_receipt
from broker.audit.receipts import ApprovalFacts, make_receipt
from broker.settings import AuditSettings

TARGET_SECONDS, TARGET_KIB = 10.0, 64
START_NS, STEP_NS = 1_796_000_000 * 10**9, 1_000_000
REPORT = b"the report's bytes\n"
IDP, TENANT, APPROVAL = "https://idp.example", "acme", "f" * 32


TRAFFIC = {"tenant": TENANT, "subject": "user@example.com", "method": "tools/call",
           "tool": "search_documents", "outcome": "ok", "status": 200}  # fmt: skip


class Clock:
    def __init__(self) -> None:
        self.now = START_NS

    def __call__(self) -> int:
        self.now += STEP_NS
        return self.now


async def write_log(folder: Path, lines: int, decisions: int) -> ApprovalFacts:
    salt, sha = secrets.token_hex(32), hashlib.sha256(REPORT).hexdigest()
    story = {"approval_id": APPROVAL, "tenant": TENANT, "content_commitment": content_commitment(salt, sha)}
    rita = {"subject": "rita", "issuer": IDP}
    at: dict[int, list[tuple[AuditEvent, dict[str, Any]]]] = {
        lines // 10: [(AuditEvent.APPROVAL_REQUESTED, {"outcome": "waiting_approval", **rita, **story})]
    }
    for i in range(decisions):
        at[lines // 3 + i * (lines // (3 * max(decisions, 1)))] = [(
            AuditEvent.APPROVAL_DECIDED,
            {"outcome": "ok", "decision": "approved", "subject": f"approver-{i}", "issuer": IDP,
             "policy_hash": "ab" * 32, "policy_ids": ["examples.big_reports.two_approvers"],
             "approvers_required": decisions, **story},
        )]  # fmt: skip
    at[lines - lines // 10] = [
        (AuditEvent.APPROVAL_CONSUMED, {"outcome": "ok", **rita, **story}),
        (AuditEvent.MCP_REQUEST, {"outcome": "ok", "tool": "save_report", "subject": "rita", "tenant": TENANT,
                         "approval_id": APPROVAL, "method": "tools/call"}),
    ]  # fmt: skip
    settings = AuditSettings(
        path=folder / "audit.jsonl",
        key_file=folder / "key",
        witness_file=None,
        replica="r1",
        checkpoint_every=1000,
    )
    async with await AuditLog.open(settings, clock=Clock()) as log:
        written = 0
        while written < lines:
            for event, fields in at.get(written, [(AuditEvent.MCP_REQUEST, {})]):
                if event == AuditEvent.MCP_REQUEST and not fields:
                    fields = dict(TRAFFIC, request_id=f"req-{written:07d}")
                await log.emit(event, **fields)
                written += 1
    return ApprovalFacts(APPROVAL, TENANT, "q3.md", len(REPORT), sha, salt, IDP, "rita")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lines", type=int, nargs="+", default=[100_000, 1_000_000])
    parser.add_argument("--decisions", type=int, default=10)
    args = parser.parse_args()
    logging.getLogger("broker").setLevel(logging.ERROR)  # "created a new audit signing key"
    print(f"{'lines':>10} {'log MiB':>8} {'make s':>7} {'receipt KiB':>12} {'check s':>8}  verdict")
    passed = True
    for lines in args.lines:
        with tempfile.TemporaryDirectory() as name:
            folder = Path(name)
            facts = asyncio.run(write_log(folder, lines, args.decisions))
            files = sorted(folder.glob("audit.jsonl*"))
            size = sum(f.stat().st_size for f in files) / 2**20
            began = time.perf_counter()
            receipt = make_receipt(facts, files)
            made = time.perf_counter() - began
            kib = len(json.dumps(receipt, sort_keys=True, indent=1)) / 1024
            keys = Keyring([load_signing_key(folder / "key").private.public_key()])
            began = time.perf_counter()
            verdict = check_receipt(receipt, keys, REPORT, "q3.md")
            checked = time.perf_counter() - began
            ok = verdict.ok and len(receipt["decisions"]) == args.decisions
            if lines >= 1_000_000:
                passed = passed and ok and made < TARGET_SECONDS
            passed = passed and kib < TARGET_KIB
            print(f"{lines:>10} {size:>8.0f} {made:>7.2f} {kib:>12.1f} {checked:>8.3f}  "
                  f"{'OK' if ok else verdict.problem}")  # fmt: skip
    print(
        f"targets: 1 M lines < {TARGET_SECONDS:.0f} s, receipt < {TARGET_KIB} KiB: "
        + ("PASS" if passed else "FAIL")
    )
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
