"""Check logs (`docbroker audit verify`) (rotated sets, several replicas) against keys and witnesses.

Per file, in order, the first thing wrong wins:

- the hash chain, line by line, as `verify.verify_stream` (edited, removed, reordered, inserted,
  torn lines), and across files: a file must start where the one before it ended, or a rotated
  file is missing from the middle;
- each checkpoint: its signature by a given key (a chain rewritten without the key fails here),
  its log id and replica (one copied from another log or replica), its number and `prev` (an old
  one replayed, or one removed), its tree size (its position) and tree head (the RFC 6962 root
  over every line before it, recomputed here);
- gap records: their signature, log id and replica; each one is reported with its counts;
- the witness checkpoints (`--witness`): each must be one this log has, with the same tree head
  at the same size — a log that ends before a checkpoint the witness holds was cut back.

Every file is opened as a regular file or refused (a planted FIFO or link to `/dev/zero` would
hang or flood the check) and read a bounded line at a time. A witness is streamed, never held
(broker/audit/witness_reader.py): memory stays flat whatever its length
(bench/audit_witness_memory.py).

Files are grouped into lineages by the log id in their first line (every file the broker writes
starts with a checkpoint), and ordered by sequence number, so they can be given in any order.
Messages are fixed texts with numbers: never a value from a line.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

from broker.audit.chain import GENESIS
from broker.audit.checkpoint import CHECKPOINT_LABEL, GAP_LABEL, Keyring, record_hash
from broker.audit.merkle import Frontier
from broker.audit.schema import SystemEvent
from broker.audit.sink import MAX_LINE_BYTES
from broker.audit.verify import _blame, _Lines, _links, _parse, _Record
from broker.audit.witness_reader import Cursor, Witness, WitnessVerdict, check_unmatched, open_witness
from broker.files import UnsafeFileError, open_regular_stream, printable


@dataclass
class FileVerdict:
    path: str
    ok: bool = True
    lines: int = 0
    first_bad_line: int | None = None
    problem: str | None = None
    log: str | None = None  # log id (from its checkpoints)
    replica: str | None = None
    first_seq: int | None = None
    last_seq: int | None = None
    head: str | None = None  # sha256 of the last line
    checkpoints: int = 0
    last_checkpoint_seq: int | None = None  # seq of the last verified checkpoint line
    gaps: list[dict[str, Any]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def fail(self, line: int | None, problem: str) -> None:
        if self.ok:
            self.ok, self.first_bad_line, self.problem = False, line, problem

    def summary(self) -> str:
        if not self.ok:
            where = (
                f"at line {self.first_bad_line} of {self.lines}" if self.first_bad_line else "after its end"
            )
            return f"audit log BROKEN {where}: {self.problem} ({printable(self.path)})"
        parts = [f"audit log OK: {self.lines} lines"]
        if self.first_seq is not None:
            parts.append(f"seq {self.first_seq}-{self.last_seq}")
        if self.log:
            parts.append(f"log {self.log[:8]} replica {self.replica}")
        parts.append(f"{self.checkpoints} checkpoints")
        if self.last_checkpoint_seq is not None and self.last_seq is not None:
            parts.append(f"{self.last_seq - self.last_checkpoint_seq} lines after the last")
        parts += [
            f"gap: {g['refused']} refused, {g['lost']} lost, {g['from']} to {g['to']}" for g in self.gaps
        ]
        parts += self.notes
        parts.append(f"head {self.head}")
        return ", ".join(parts) + f" ({printable(self.path)})"


@dataclass
class Report:
    files: list[FileVerdict]
    witnesses: list[WitnessVerdict]

    @property
    def ok(self) -> bool:
        return all(f.ok for f in self.files) and all(w.ok for w in self.witnesses)


@dataclass
class _Lineage:
    """The running state of one log lineage while its files are read in order."""

    seq: int = 0
    head: str = GENESIS
    tree: Frontier | None = None  # None until anchored (start of the log, or a checkpoint)
    log: str | None = None
    replica: str | None = None
    count: int = 0  # number of the last checkpoint
    last_hash: str | None = None  # its record_hash (None: unknown, files before it not given)
    continuous: bool = False  # the previous file verified to its end
    # One per witness, walking that witness's checkpoints of `log` in step with `tree`
    # (None: not started, since the log is not known yet or the tree was anchored afresh).
    cursors: list[Cursor] | None = None


def verify_logs(
    paths: list[Path],
    keys: Keyring,
    witnesses: list[Path] | None = None,
    replica: str | None = None,
) -> Report:
    """Verify `paths` (any order) with `keys`. Raises UnsafeFileError or OSError if a witness
    cannot be read."""
    held: list[Witness] = []
    try:
        for path in witnesses or []:
            held.append(open_witness(path, keys))
        verdicts = {str(p): FileVerdict(str(p)) for p in paths}
        groups: dict[str, list[tuple[int, Path]]] = {}
        for path in paths:
            try:
                group, first_seq = _first_line(path)
            except (OSError, UnsafeFileError) as exc:
                verdicts[str(path)].fail(None, cannot_read(exc))
                continue
            groups.setdefault(group, []).append((first_seq, path))
        for members in groups.values():
            lineage = _Lineage()
            last: FileVerdict | None = None
            for _, path in sorted(members):
                last = verdicts[str(path)]
                try:
                    with open_regular_stream(path) as stream:
                        _verify_file(stream, last, lineage, keys, replica, held)
                except (OSError, UnsafeFileError) as exc:
                    last.fail(None, cannot_read(exc))
                    lineage.continuous = False
            if last is not None:
                _check_cut(last, lineage, held)
        check_unmatched({v.log for v in verdicts.values() if v.log}, held)
    finally:
        for witness in held:
            witness.stream.close()
    return Report(files=[verdicts[str(p)] for p in paths], witnesses=[w.verdict for w in held])


def cannot_read(exc: OSError | UnsafeFileError) -> str:
    return f"cannot read: {exc.reason if isinstance(exc, UnsafeFileError) else exc.strerror or 'error'}"


def group_files(paths: list[Path]) -> dict[str, list[Path]]:
    """The files of each lineage, in order (for `prove`). Raises UnsafeFileError or OSError."""
    groups: dict[str, list[tuple[int, Path]]] = {}
    for path in paths:
        group, first_seq = _first_line(path)
        groups.setdefault(group, []).append((first_seq, path))
    return {group: [p for _, p in sorted(members)] for group, members in groups.items()}


def _first_line(path: Path) -> tuple[str, int]:
    """(group, first seq): the log id of a first-line checkpoint, else the file itself."""
    with open_regular_stream(path) as stream:
        raw = stream.readline(MAX_LINE_BYTES + 1)
    parsed = _parse(raw) if raw else None
    if isinstance(parsed, _Record):
        if parsed.event == SystemEvent.CHECKPOINT and parsed.fields is not None:
            return "log:" + parsed.fields["checkpoint"]["log"], parsed.seq
        return "file:" + str(path), parsed.seq
    return "file:" + str(path), 0


def _verify_file(
    stream: BinaryIO,
    verdict: FileVerdict,
    lineage: _Lineage,
    keys: Keyring,
    replica: str | None,
    witnesses: list[Witness],
) -> None:
    lines = _Lines(stream)
    before: _Record | None = None
    while (raw := lines.next()) is not None:
        n = lines.count
        parsed = _parse(raw, leaf=True)
        if isinstance(parsed, str):
            verdict.fail(n, parsed)
            break
        if before is None:
            problem = _start(parsed, lineage, verdict)
            if problem:
                verdict.fail(n, problem)
                break
        elif not _links(before, parsed):
            line, problem = _blame(before, parsed, lines.peek(), n)
            verdict.fail(line, problem)
            break
        if parsed.fields is not None:
            problem = _check_system_line(parsed, lineage, keys, replica, verdict)
            if problem:
                verdict.fail(n, problem)
                break
        if lineage.tree is not None:
            lineage.tree.append_hash(parsed.leaf)
            problem = _check_witness_at(lineage, witnesses)
            if problem:
                verdict.fail(n, problem)
                break
        lineage.seq, lineage.head = parsed.seq, parsed.hash
        verdict.last_seq, verdict.head = parsed.seq, parsed.hash
        before = parsed
    verdict.lines = lines.count_all() if not verdict.ok else lines.count
    lineage.continuous = verdict.ok
    if verdict.ok and keys and verdict.checkpoints == 0 and verdict.lines:
        verdict.fail(None, "no signed checkpoint: unsigned log, or its checkpoints were removed")
    if verdict.lines == 0 and verdict.ok:
        verdict.head = GENESIS


def _start(record: _Record, lineage: _Lineage, verdict: FileVerdict) -> str | None:
    """Anchor the file: continue the previous one, start the log, or start mid-lineage."""
    verdict.first_seq = record.seq
    if lineage.continuous:
        if record.seq == lineage.seq + 1 and record.prev == lineage.head:
            return None
        return "does not continue the previous file: a rotated file is missing before this one"
    lineage.tree, lineage.cursors = None, None  # anchored afresh: the witnesses walk again
    if record.seq == 1 and record.prev == GENESIS:
        lineage.tree, lineage.count, lineage.last_hash = Frontier(), 0, GENESIS
        return None
    if lineage.seq:  # an earlier file of this lineage was given but broke: its end is unknown
        verdict.notes.append("verified from its own start (the file before it is broken)")
    else:
        verdict.notes.append(f"starts at seq {record.seq}: earlier files not given")
    if record.event == SystemEvent.CHECKPOINT and record.fields is not None:
        body, nodes = record.fields["checkpoint"], record.fields["frontier"]
        try:
            tree = Frontier(body["size"], [bytes.fromhex(h) for h in nodes])
        except ValueError:
            return "checkpoint frontier does not fit its tree size"
        if tree.root().hex() != body["root"] or body["size"] != record.seq - 1:
            return "checkpoint frontier does not match its tree head or position"
        lineage.tree, lineage.count, lineage.last_hash = tree, body["n"] - 1, None
    return None


def _check_system_line(
    record: _Record, lineage: _Lineage, keys: Keyring, replica: str | None, verdict: FileVerdict
) -> str | None:
    fields = record.fields
    assert fields is not None
    if record.event == SystemEvent.CHECKPOINT:
        body = fields["checkpoint"]
        problem = _check_record(CHECKPOINT_LABEL, body, fields["sig"], lineage, keys, replica)
        if problem:
            return problem
        if lineage.last_hash is not None:
            if body["n"] <= lineage.count:
                return "checkpoint replayed: its number is not after the previous checkpoint's"
            if body["n"] != lineage.count + 1:
                return "checkpoint numbers jump: checkpoints removed before this one"
            if body["prev"] != lineage.last_hash:
                return "checkpoint does not link to the previous checkpoint (replayed or rewritten)"
        if lineage.tree is None:  # a file given without its start: anchor on this checkpoint
            try:  # the frontier is not signed: its length may not fit the signed size
                tree = Frontier(body["size"], [bytes.fromhex(h) for h in fields["frontier"]])
            except ValueError:
                return "checkpoint frontier does not fit its tree size"
            if tree.root().hex() != body["root"] or body["size"] != record.seq - 1:
                return "checkpoint frontier does not match its tree head or position"
            lineage.tree = tree
        if body["size"] != lineage.tree.size:
            return "checkpoint tree size does not match its position in the log"
        if body["root"] != lineage.tree.root().hex():
            return "checkpoint tree head does not match the lines before it (lines rewritten)"
        if fields["frontier"] != [node.hex() for node in lineage.tree.nodes]:
            return "checkpoint frontier does not match the lines before it"
        lineage.count, lineage.last_hash = body["n"], record_hash(body)
        lineage.log, lineage.replica = body["log"], body["replica"]
        verdict.log, verdict.replica = body["log"], body["replica"]
        verdict.checkpoints += 1
        verdict.last_checkpoint_seq = record.seq
        return None
    body = fields["gap"]
    problem = _check_record(GAP_LABEL, body, fields["sig"], lineage, keys, replica)
    if problem:
        return problem
    if lineage.tree is not None and body["size"] != lineage.tree.size:
        return "gap record's tree size does not match its position in the log"
    verdict.gaps.append({k: body[k] for k in ("from", "to", "refused", "lost")})
    return None


def _check_record(
    label: bytes, body: dict[str, Any], sig: str, lineage: _Lineage, keys: Keyring, replica: str | None
) -> str | None:
    if keys:
        problem = keys.check(label, body, sig)
        if problem:
            return problem
    if replica is not None and body["replica"] != replica:
        return "checkpoint or gap record of another replica (--replica)"
    if lineage.log is not None and body["log"] != lineage.log:
        return "checkpoint or gap record of another log (copied in or replayed)"
    if lineage.replica is not None and body["replica"] != lineage.replica:
        return "checkpoint or gap record of another replica (copied in or replayed)"
    return None


def _check_witness_at(lineage: _Lineage, witnesses: list[Witness]) -> str | None:
    """The log's tree has just grown by one line: compare it with every witness checkpoint at
    this size (witness records of sizes the tree passed before it was anchored go unchecked)."""
    assert lineage.tree is not None
    if lineage.log is None or not witnesses:
        return None
    if lineage.cursors is None:
        lineage.cursors = [Cursor(w, lineage.log) for w in witnesses]
    tree, root = lineage.tree, None
    for cursor in lineage.cursors:
        for held in cursor.upto(tree.size):
            if held.size == tree.size:
                root = root or tree.root().hex()
                if held.root != root:
                    return "witness checkpoint disagrees with the log here: lines before it were rewritten"
    return None


def _check_cut(last: FileVerdict, lineage: _Lineage, witnesses: list[Witness]) -> None:
    if lineage.log is None or not last.ok or lineage.tree is None or not witnesses:
        return
    size = lineage.tree.size
    cursors = lineage.cursors or [Cursor(w, lineage.log) for w in witnesses]
    beyond = max((held.size for c in cursors for held in c.upto(None)), default=0)
    if beyond > size:
        last.fail(
            None, f"log cut back: the witness holds a checkpoint over {beyond} lines, the log has {size}"
        )
