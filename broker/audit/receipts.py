"""`docbroker audit receipt`: one approval's story, with the proof of each line (DESIGN §16).

A receipt answers "this file in the reports folder: who approved it, under which policy, and
is it byte for byte what they saw?" offline, from one JSON document:

    {"type": "docbroker.receipt", "v": 1,
     "approval": {"id", "tenant", "filename", "bytes", "sha256", "salt", "content_commitment",
                  "requester": {"issuer", "subject"}, "required"},
     "requested": {"time", "line"},
     "decisions": [{"approver": {"issuer", "subject"}, "decision", "time", "policy_hash",
                    "policy_ids", "line"}, ...],
     "consumption": {"time", "line"} | null,
     "write": {"outcome", "time", "line"} | null,
     "proofs": [<an `audit prove` inclusion proof>, ...]}

Each `line` is an index into `proofs`: the audit line itself, its RFC 6962 inclusion proof and
the signed checkpoint of its replica's log (each replica signs with its own key). The lines
carry the content commitment, never the file name or the content; the receipt adds the file
name and the salt, for the people allowed to see the report.

Making one streams each replica's log once (rotated files in order), keeping one leaf hash
per line (32 bytes) and only the lines of this approval and the last checkpoint: a log of a
million lines takes a few seconds (bench/receipt.py). Checking one is broker/audit/receipt_check.py.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from broker.audit.commitment import content_commitment
from broker.audit.evidence import group_files
from broker.audit.merkle import inclusion_ranges, node_hash
from broker.audit.proofs import FORMAT as PROOF_FORMAT
from broker.audit.proofs import ProofError, _lines
from broker.audit.schema import AuditEvent, SystemEvent
from broker.audit.sink import MAX_LINE_BYTES
from broker.files import open_regular_stream
from broker.protocol.codec import loads_strict

RECEIPT_TYPE: Final = "docbroker.receipt"
FORMAT: Final = 1
# The save's own line: a write that was sent (or may have been); not the "waiting" answers.
WRITE_OUTCOMES: Final = frozenset({"ok", "failed", "result_unknown"})
_STEP: Final = {
    AuditEvent.APPROVAL_REQUESTED: 0,
    AuditEvent.APPROVAL_DECIDED: 1,
    AuditEvent.APPROVAL_CONSUMED: 2,
    AuditEvent.MCP_REQUEST: 3,
}
_CHUNK: Final = 4 << 20
_CHECKPOINT_NEEDLE: Final = b'"event":"' + SystemEvent.CHECKPOINT.encode() + b'"'


@dataclass(frozen=True)
class ApprovalFacts:
    """What the approvals store knows of the record (plain values: no store here)."""

    approval_id: str
    tenant: str
    filename: str
    size: int
    sha256: str
    salt: str
    requester_issuer: str
    requester_subject: str


class _Levels:
    """Every perfect subtree's hash of one log, level by level (32 bytes a node, in one
    bytearray per level): any RFC 6962 subtree is then O(log n) node hashes away."""

    def __init__(self, leaves: bytearray) -> None:
        self.size = len(leaves) // 32
        self.levels = [leaves]
        level = leaves
        while len(level) >= 64:
            sha256 = hashlib.sha256  # merkle.node_hash, in one comprehension
            up = bytearray(
                b"".join(
                    [sha256(b"\x01" + level[at : at + 64]).digest() for at in range(0, len(level) - 63, 64)]
                )
            )
            self.levels.append(up)
            level = up

    def root(self, start: int, end: int) -> bytes:
        """MTH of leaves [start, end) (RFC 6962 §2.1), `end` within the tree."""
        n = end - start
        if n & (n - 1) == 0 and start % n == 0:  # a perfect, aligned subtree: stored
            j = n.bit_length() - 1
            at = (start >> j) * 32
            return bytes(self.levels[j][at : at + 32])
        k = 1 << ((n - 1).bit_length() - 1)
        return node_hash(self.root(start, start + k), self.root(start + k, end))


@dataclass
class _Log:
    """One replica's log as the scan left it: the lines of this approval, the last checkpoint."""

    leaves: bytearray
    found: list[tuple[int, str]]  # (index, line)
    checkpoint: dict[str, Any] | None = None
    sig: str = ""


def _chunks(files: list[Path]) -> Iterator[bytes]:
    """The lineage's complete lines, a few MiB of them at a time, joined by newlines (no final
    one): a line at a time, Python's per-line cost was most of a receipt's time. A torn tail
    (no newline) is no line of the log."""
    for path in files:
        with open_regular_stream(path) as stream:
            rest = b""
            while chunk := stream.read(_CHUNK):
                data = rest + chunk
                cut = data.rfind(b"\n")
                if cut < 0:
                    if len(data) > MAX_LINE_BYTES:
                        raise ProofError("a line of the log is longer than any line the broker writes")
                    rest = data
                    continue
                rest = data[cut + 1 :]
                yield data[:cut]


def _scan(files: list[Path], needle: bytes) -> _Log:
    log = _Log(bytearray(), [])
    base, sha256 = 0, hashlib.sha256
    for body in _chunks(files):
        lines = body.split(b"\n")
        # merkle.leaf_hash, in one comprehension: this runs for every line of the log.
        log.leaves += b"".join([sha256(b"\x00" + line).digest() for line in lines])
        if needle in body:
            log.found += [
                (base + i, line.decode("ascii", "replace")) for i, line in enumerate(lines) if needle in line
            ]
        at = body.rfind(_CHECKPOINT_NEEDLE)
        if at >= 0:  # only the lineage's last checkpoint is wanted: the chunk's last one
            start = body.rfind(b"\n", 0, at) + 1
            end = body.find(b"\n", at)
            fields = loads_strict(body[start : end if end >= 0 else len(body)].decode("ascii", "replace"))
            if fields.get("seq") == base + body.count(b"\n", 0, start) + 1:
                log.checkpoint, log.sig = fields["checkpoint"], fields["sig"]
        base += len(lines)
    return log


def _first_seq(files: list[Path]) -> int | None:
    for _, _, raw in _lines(files[:1]):
        value = loads_strict(raw.decode("ascii", "replace"))
        return value.get("seq") if isinstance(value, dict) else None
    return None


def _proofs(log: _Log) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """(event, inclusion proof) of each line of the story found, under the log's last
    checkpoint. Other lines naming the approval (a view, a refused decision — or the request
    for this very receipt) need no checkpoint yet: they are not in it."""
    story = [(index, line, event) for index, line in log.found if _wanted(event := loads_strict(line))]
    if not story:
        return []
    if log.checkpoint is None or log.checkpoint["size"] <= story[-1][0]:
        raise ProofError(
            "a line of this approval is not under a signed checkpoint yet: retry after the log's "
            "next checkpoint (DOCBROKER_AUDIT_CHECKPOINT_INTERVAL)"
        )
    size = log.checkpoint["size"]
    levels = _Levels(log.leaves[: size * 32])
    out = []
    for index, line, event in story:
        proof = {
            "type": "inclusion",
            "v": PROOF_FORMAT,
            "line": line,
            "index": index,
            "checkpoint": log.checkpoint,
            "sig": log.sig,
            "path": [levels.root(s, e).hex() for s, e in inclusion_ranges(index, size)],
        }
        out.append((event, proof))
    return out


def _wanted(event: dict[str, Any]) -> bool:
    name, outcome = event.get("event"), event.get("outcome")
    if name == AuditEvent.APPROVAL_DECIDED:
        return outcome == "ok"  # a refused decision (not permitted, not viewed) is no decision
    if name == AuditEvent.MCP_REQUEST:
        return outcome in WRITE_OUTCOMES
    return name in (AuditEvent.APPROVAL_REQUESTED, AuditEvent.APPROVAL_CONSUMED)


def _person(event: dict[str, Any]) -> dict[str, str]:
    return {"issuer": event.get("issuer", ""), "subject": event.get("subject", "")}


def _story(lines: list[tuple[dict[str, Any], dict[str, Any]]]) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """The lines a receipt tells, in order: the request, every decision, and only the last
    consumption and the last write (a consumption given back went unwritten; a retry wrote)."""
    last = {
        name: max((i for i, (e, _) in enumerate(lines) if e["event"] == name), default=None)
        for name in (AuditEvent.APPROVAL_CONSUMED, AuditEvent.MCP_REQUEST)
    }
    first = next((i for i, (e, _) in enumerate(lines) if e["event"] == AuditEvent.APPROVAL_REQUESTED), None)
    keep = {first, *last.values()} - {None}
    return [
        item for i, item in enumerate(lines)
        if i in keep or item[0]["event"] == AuditEvent.APPROVAL_DECIDED
    ]  # fmt: skip


def make_receipt(facts: ApprovalFacts, paths: Iterable[Path]) -> dict[str, Any]:
    """The receipt of one approval from the store's facts and every replica's log files
    (rotated sets, any order). Raises ProofError (a fixed text), UnsafeFileError or OSError."""
    needle = b'"approval_id":"' + facts.approval_id.encode("ascii") + b'"'
    lines: list[tuple[dict[str, Any], dict[str, Any]]] = []
    for files in group_files(list(paths)).values():
        if _first_seq(files) != 1:
            raise ProofError("a log's files do not start at seq 1: give every file from the first")
        lines += _proofs(_scan(files, needle))
    # Replicas' clocks tick in milliseconds: within one, the story's own order decides.
    lines.sort(
        key=lambda item: (item[0]["ts"], _STEP[item[0]["event"]], item[0].get("replica", ""), item[0]["seq"])
    )
    if not facts.salt:
        raise ProofError("the approval has no content salt (it was made before receipts): no receipt")
    lines = _story(lines)
    if not lines or lines[0][0]["event"] != AuditEvent.APPROVAL_REQUESTED:
        raise ProofError("no approval.requested line for this approval in the logs")
    commitment = content_commitment(facts.salt, facts.sha256)
    decisions, consumption, write, required = [], None, None, 1
    for at, (event, _) in enumerate(lines):
        if event["event"] == AuditEvent.APPROVAL_DECIDED:
            decisions.append({
                "approver": _person(event),
                "decision": event.get("decision"),
                "time": event["ts"],
                "policy_hash": event.get("policy_hash"),
                "policy_ids": event.get("policy_ids", []),
                "line": at,
            })  # fmt: skip
            if event.get("decision") == "approved":
                required = max(required, event.get("approvers_required", 1))
        elif event["event"] == AuditEvent.APPROVAL_CONSUMED:
            consumption = {"time": event["ts"], "line": at}
        elif event["event"] == AuditEvent.MCP_REQUEST:
            write = {"outcome": event["outcome"], "time": event["ts"], "line": at}
    return {
        "type": RECEIPT_TYPE,
        "v": FORMAT,
        "approval": {
            "id": facts.approval_id,
            "tenant": facts.tenant,
            "filename": facts.filename,
            "bytes": facts.size,
            "sha256": facts.sha256,
            "salt": facts.salt,
            "content_commitment": commitment,
            "requester": {"issuer": facts.requester_issuer, "subject": facts.requester_subject},
            "required": required,
        },
        "requested": {"time": lines[0][0]["ts"], "line": 0},
        "decisions": decisions,
        "consumption": consumption,
        "write": write,
        "proofs": [proof for _, proof in lines],
    }
