"""`docbroker audit prove` and `verify-proof`: hand one event, or a log's growth, to an auditor.

An inclusion proof carries one line of the log (an event: names, never values), its leaf index
(seq - 1), a signed checkpoint of that log and the RFC 6962 audit path from the line to the
checkpoint's tree head. A consistency proof carries two signed checkpoints of one log and the
RFC 6962 proof that the later tree extends the earlier one (nothing was rewritten in between).

    {"type": "inclusion", "v": 1, "line": "...", "index": 41,
     "checkpoint": {...}, "sig": "...", "path": ["<hex>", ...]}
    {"type": "consistency", "v": 1, "old": {"checkpoint": {...}, "sig": "..."},
     "new": {"checkpoint": {...}, "sig": "..."}, "path": ["<hex>", ...]}

Proving streams the lineage twice (find the records, then hash the proof's subtrees) and holds
O(log n) hashes: it works on logs far larger than memory. Verifying needs only the proof and the
replica's public key; it reads at most `MAX_PROOF_BYTES` (a proof holds one line and O(log n)
hashes), so a proof that is `/dev/zero` on stdin is refused, not buffered.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, Final

from broker.audit.checkpoint import CHECKPOINT_LABEL, Keyring
from broker.audit.evidence import group_files
from broker.audit.merkle import (
    consistency_ranges,
    hash_ranges,
    inclusion_ranges,
    leaf_hash,
    verify_consistency,
    verify_inclusion,
)
from broker.audit.nesting import MAX_DEPTH, too_deep
from broker.audit.schema import EVIDENCE_FIELDS, INVALID, SystemEvent
from broker.audit.sink import MAX_LINE_BYTES
from broker.audit.verify import _parse, _Record
from broker.files import UnsafeFileError, bounded_lines, open_regular_stream, printable
from broker.protocol.codec import loads_strict

FORMAT = 1
# The line, JSON-escaped inside the proof (at most doubled), and room for the rest.
MAX_PROOF_BYTES: Final = 2 * MAX_LINE_BYTES + 64 * 1024


class ProofError(Exception):
    """A proof cannot be made from these files (a fixed text; never a value from the log)."""


@dataclass(frozen=True)
class _Signed:
    seq: int
    body: dict[str, Any]
    sig: str

    def public(self) -> dict[str, Any]:
        return {"checkpoint": self.body, "sig": self.sig}


def _lines(paths: list[Path]) -> Iterator[tuple[Path, int, bytes]]:
    """(file, line number in it, line) of each file in turn; raises UnsafeFileError for a file
    that is not a regular one (a FIFO would hang the proof, `/dev/zero` flood it)."""
    for path in paths:
        with open_regular_stream(path) as stream:
            for number, raw in enumerate(bounded_lines(stream, MAX_LINE_BYTES), 1):
                yield path, number, raw


def _lineage(paths: list[Path]) -> list[Path]:
    groups = group_files(paths)
    if len(groups) != 1:
        raise ProofError("the files hold more than one log: give one replica's files")
    return next(iter(groups.values()))


def _scan(
    paths: list[Path], want_seq: int | None, roles: Callable[[dict[str, Any]], Iterable[str]]
) -> tuple[dict[str, _Signed], bytes | None]:
    """For each role (`roles` names those a checkpoint's body plays), the lineage's last
    checkpoint in it; and the line at `want_seq` (without newline). Only those few are kept:
    a year of checkpoints held in a list took gigabytes."""
    picked: dict[str, _Signed] = {}
    found: bytes | None = None
    expected = 1
    for path, number, raw in _lines(paths):
        record = _parse(raw)
        if isinstance(record, str):
            raise ProofError(
                f"the log does not verify at line {number} of {printable(path.name)} ({record}): "
                "run `docbroker audit verify`"
            )
        if record.seq != expected:
            raise ProofError("the log does not start at seq 1 or skips lines: give every file from the first")
        expected += 1
        if record.seq == want_seq:
            found = raw[:-1]
        if isinstance(record, _Record) and record.event == SystemEvent.CHECKPOINT and record.fields:
            for role in roles(record.fields["checkpoint"]):
                picked[role] = _Signed(record.seq, record.fields["checkpoint"], record.fields["sig"])
    return picked, found


def _proof_nodes(paths: list[Path], ranges: list[tuple[int, int]]) -> list[str]:
    leaves = (leaf_hash(raw[:-1]) for _, _, raw in _lines(paths))
    return [node.hex() for node in hash_ranges(leaves, ranges)]


def prove_inclusion(paths: list[Path], seq: int, checkpoint: int | None = None) -> dict[str, Any]:
    files = _lineage(paths)
    picked, line = _scan(
        files, seq, lambda b: ("covering",) if b["size"] >= seq and checkpoint in (None, b["n"]) else ()
    )
    if line is None:
        raise ProofError("no line with that seq in the files")
    chosen = picked.get("covering")
    if chosen is None:
        raise ProofError("no checkpoint covers that line yet (or no checkpoint with that number)")
    index, size = seq - 1, chosen.body["size"]
    return {
        "type": "inclusion",
        "v": FORMAT,
        "line": line.decode("ascii"),
        "index": index,
        **chosen.public(),
        "path": _proof_nodes(files, inclusion_ranges(index, size)),
    }


def prove_consistency(paths: list[Path], old: int, new: int | None = None) -> dict[str, Any]:
    files = _lineage(paths)

    def roles(body: dict[str, Any]) -> list[str]:
        # Without --to, every checkpoint is "new" in turn: the last one stays.
        wanted = (("old", old), ("new", body["n"] if new is None else new))
        return [role for role, n in wanted if body["n"] == n]

    picked, _ = _scan(files, None, roles)
    first, second = picked.get("old"), picked.get("new")
    if first is None or second is None:
        raise ProofError("no checkpoint with that number in the files")
    if first.body["size"] > second.body["size"]:
        raise ProofError("the first checkpoint must not cover more lines than the second")
    # Every tree extends the empty one (a log's first checkpoint): that proof is empty.
    ranges = consistency_ranges(first.body["size"], second.body["size"]) if first.body["size"] else []
    return {
        "type": "consistency",
        "v": FORMAT,
        "old": first.public(),
        "new": second.public(),
        "path": _proof_nodes(files, ranges),
    }


def verify_proof(proof: Any, keys: Keyring) -> tuple[bool, str]:
    """(ok, a one-line verdict). Checks the signatures first, then the RFC 6962 proof."""
    if not isinstance(proof, dict) or proof.get("v") != FORMAT:
        return False, "not a docbroker audit proof"
    path = proof.get("path")
    if not isinstance(path, list) or len(path) > 128 or not all(_is_hash(h) for h in path):
        return False, "proof path is not a list of sha256 hashes"
    nodes = [bytes.fromhex(h) for h in path]
    if proof.get("type") == "inclusion":
        body, problem = _signed(proof, keys)
        if body is None:
            return False, problem
        line, index = proof.get("line"), proof.get("index")
        if not isinstance(line, str) or not line.isascii() or type(index) is not int:
            return False, "inclusion proof without a line and an index"
        if not line.isascii():  # the writer escapes everything else: no line of a log has it
            return False, "the line is not an audit event at that index"
        record = _parse(line.encode("ascii", "replace") + b"\n")
        if isinstance(record, str) or record.seq != index + 1:
            return False, "the line is not an audit event at that index"
        root = bytes.fromhex(body["root"])
        if not verify_inclusion(index, body["size"], leaf_hash(line.encode("ascii")), nodes, root):
            return (
                False,
                "the line is NOT in the log under this checkpoint (path does not lead to its tree head)",
            )
        return True, (
            f"line seq {record.seq} is in log {body['log'][:8]} (replica {body['replica']}) "
            f"under checkpoint {body['n']} over {body['size']} lines"
        )
    if proof.get("type") == "consistency":
        old, problem = _signed(proof.get("old"), keys)
        if old is None:
            return False, f"old checkpoint: {problem}"
        new, problem = _signed(proof.get("new"), keys)
        if new is None:
            return False, f"new checkpoint: {problem}"
        if old["log"] != new["log"] or old["replica"] != new["replica"]:
            return False, "the checkpoints belong to different logs"
        if not verify_consistency(
            old["size"], new["size"], bytes.fromhex(old["root"]), bytes.fromhex(new["root"]), nodes
        ):
            return False, "the later checkpoint does NOT extend the earlier one (log rewritten in between)"
        return True, (
            f"checkpoint {new['n']} over {new['size']} lines extends checkpoint {old['n']} "
            f"over {old['size']} lines of log {old['log'][:8]} (replica {old['replica']})"
        )
    return False, "unknown proof type"


def _is_hash(value: object) -> bool:
    return type(value) is str and len(value) == 64 and all(c in "0123456789abcdef" for c in value)


def _signed(holder: Any, keys: Keyring) -> tuple[dict[str, Any] | None, str]:
    if not isinstance(holder, dict):
        return None, "missing checkpoint"
    body, sig = holder.get("checkpoint"), holder.get("sig")
    if EVIDENCE_FIELDS["checkpoint"](body) is INVALID or EVIDENCE_FIELDS["sig"](sig) is INVALID:
        return None, "not a valid checkpoint"
    assert isinstance(body, dict) and isinstance(sig, str)
    problem = keys.check(CHECKPOINT_LABEL, body, sig)
    if problem:
        return None, problem
    return body, ""


def read_proof(proof_file: str, stdin: BinaryIO) -> Any:
    """The proof document from a regular file or stdin (`-`), read to at most MAX_PROOF_BYTES.
    Raises ProofError (a fixed text) when it cannot be read or is no JSON document."""
    try:
        if proof_file == "-":
            data = stdin.read(MAX_PROOF_BYTES + 1)
        else:
            with open_regular_stream(proof_file) as stream:
                data = stream.read(MAX_PROOF_BYTES + 1)
    except UnsafeFileError as exc:
        raise ProofError(exc.reason) from None
    except OSError as exc:
        raise ProofError(exc.strerror or "error") from None
    if len(data) > MAX_PROOF_BYTES:
        raise ProofError(f"larger than {MAX_PROOF_BYTES} bytes, no proof is (refused)")
    if too_deep(data):
        raise ProofError(f"JSON nested more than {MAX_DEPTH} deep (refused)")
    try:
        return loads_strict(data.decode("ascii"))
    except ValueError:
        raise ProofError("not a JSON document in ASCII (a proof file, or - for stdin)") from None
