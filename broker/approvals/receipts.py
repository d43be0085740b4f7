"""A written report's receipt, as the REST API and the CLI serve it (DESIGN §16).

The receipt itself is the audit's (broker/audit/receipts.py, plain values); here the approvals
store's record becomes those values, and the API finds the logs it can read: this replica's,
and those of replicas writing into the same folder (a shared data dir or audit volume). Where
replicas keep their logs apart, `docbroker audit receipt` is given every replica's files.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from broker.approvals.store import Approval
from broker.audit.proofs import ProofError
from broker.audit.receipts import ApprovalFacts, make_receipt
from broker.audit.sink import rotated_files
from broker.files import UnsafeFileError

# The broker's own names for a replica's log and its rotations (broker/settings/audit.py), not its
# witness copy (same checkpoints: it would pass for the log).
_LOG_NAME = re.compile(r"audit(-(?!witness|signing)[A-Za-z0-9_.:-]+)?\.jsonl")


def facts(record: Approval) -> ApprovalFacts:
    return ApprovalFacts(
        approval_id=record.id,
        tenant=record.tenant,
        filename=record.filename,
        size=record.bytes,
        sha256=record.sha256,
        salt=record.salt,
        requester_issuer=record.requester.issuer,
        requester_subject=record.requester.id,
    )


def readable_logs(own: Path) -> list[Path]:
    """This replica's log files and its peers' beside it, rotated files first."""
    logs = {own} | {p for p in own.parent.iterdir() if _LOG_NAME.fullmatch(p.name) and p.is_file()}
    return [f for log in sorted(logs) for f in [*rotated_files(log), log]]


def complete_receipt(record: Approval, own_log: Path) -> dict[str, Any] | None:
    """The receipt of a written report from the logs this replica reads; None while it cannot
    be whole (a line not yet under a checkpoint, or on a log out of reach)."""
    try:
        receipt = make_receipt(facts(record), readable_logs(own_log))
    except (ProofError, UnsafeFileError, OSError):
        return None
    write = receipt["write"]
    if receipt["consumption"] is None or write is None or write["outcome"] != "ok":
        return None
    yes = {(d["approver"]["issuer"], d["approver"]["subject"]) for d in receipt["decisions"]}
    return receipt if len(yes) >= receipt["approval"]["required"] else None
