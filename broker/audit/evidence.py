"""`docbroker audit verify`: check logs (rotated sets, several replicas) against keys and witnesses.

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
hang or flood the check) and read a bounded line at a time. A witness is streamed, never held:
it is read once to check each record (a line that is not JSON breaks it: one byte glued to each
record would otherwise hide them all, and with them a cut tail), then once per log alongside
that log's lines — the broker appends a log's checkpoints in tree order, so one cursor per
witness walks in step with the tree, and a witness whose sizes go back is broken — and once
more for logs no given file holds. Memory stays flat whatever the witness's length
(bench/audit_witness_memory.py).

Files are grouped into lineages by the log id in their first line (every file the broker writes
starts with a checkpoint), and ordered by sequence number, so they can be given in any order.
Messages are fixed texts with numbers: never a value from a line.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, BinaryIO, Final, NamedTuple

import orjson

from broker.audit.chain import GENESIS
from broker.audit.checkpoint import CHECKPOINT_LABEL, GAP_LABEL, Keyring, record_hash
from broker.audit.merkle import Frontier
from broker.audit.schema import EVIDENCE_FIELDS, INVALID, SystemEvent
from broker.audit.sink import MAX_LINE_BYTES
from broker.audit.verify import _blame, _Lines, _links, _parse, _Record
from broker.files import UnsafeFileError, bounded_lines, open_regular_stream, printable

EXIT_OK, EXIT_BROKEN, EXIT_USAGE = 0, 1, 2
_UNMATCHED = "holds checkpoints of a log that no given file holds (replaced, swapped or deleted)"
_FEW_LOGS = 64  # a witness holds one log per replica's lineage; more are read again, not held


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
class WitnessVerdict:
    path: str
    ok: bool = True
    records: int = 0
    problem: str | None = None

    def summary(self) -> str:
        if self.ok:
            return f"witness OK: {self.records} records ({printable(self.path)})"
        return f"witness BROKEN: {self.problem} ({printable(self.path)})"


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
    cursors: list[_Cursor] | None = None


def verify_logs(
    paths: list[Path],
    keys: Keyring,
    witnesses: list[Path] | None = None,
    replica: str | None = None,
) -> Report:
    """Verify `paths` (any order) with `keys`. Raises UnsafeFileError or OSError if a witness
    cannot be read."""
    held: list[_Witness] = []
    try:
        for path in witnesses or []:
            held.append(_check_witness(path, keys))
        verdicts = {str(p): FileVerdict(str(p)) for p in paths}
        groups: dict[str, list[tuple[int, Path]]] = {}
        for path in paths:
            try:
                group, first_seq = _first_line(path)
            except (OSError, UnsafeFileError) as exc:
                verdicts[str(path)].fail(None, _cannot_read(exc))
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
                    last.fail(None, _cannot_read(exc))
                    lineage.continuous = False
            if last is not None:
                _check_cut(last, lineage, held)
        _check_unmatched_witnesses(list(verdicts.values()), held)
    finally:
        for witness in held:
            witness.stream.close()
    return Report(files=[verdicts[str(p)] for p in paths], witnesses=[w.verdict for w in held])


def _cannot_read(exc: OSError | UnsafeFileError) -> str:
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
    witnesses: list[_Witness],
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
            tree = Frontier(body["size"], [bytes.fromhex(h) for h in fields["frontier"]])
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


def _check_witness_at(lineage: _Lineage, witnesses: list[_Witness]) -> str | None:
    """The log's tree has just grown by one line: compare it with every witness checkpoint at
    this size (witness records of sizes the tree passed before it was anchored go unchecked)."""
    assert lineage.tree is not None
    if lineage.log is None or not witnesses:
        return None
    if lineage.cursors is None:
        lineage.cursors = [_Cursor(w, lineage.log) for w in witnesses]
    tree, root = lineage.tree, None
    for cursor in lineage.cursors:
        for held in cursor.upto(tree.size):
            if held.size == tree.size:
                root = root or tree.root().hex()
                if held.root != root:
                    return "witness checkpoint disagrees with the log here: lines before it were rewritten"
    return None


def _check_cut(last: FileVerdict, lineage: _Lineage, witnesses: list[_Witness]) -> None:
    if lineage.log is None or not last.ok or lineage.tree is None or not witnesses:
        return
    size = lineage.tree.size
    cursors = lineage.cursors or [_Cursor(w, lineage.log) for w in witnesses]
    beyond = max((held.size for c in cursors for held in c.upto(None)), default=0)
    if beyond > size:
        last.fail(
            None, f"log cut back: the witness holds a checkpoint over {beyond} lines, the log has {size}"
        )


def _check_unmatched_witnesses(files: list[FileVerdict], witnesses: list[_Witness]) -> None:
    """A witness's log that no given file holds: replaced, swapped or deleted (give a replica's
    witness with that replica's files)."""
    logs = {f.log for f in files if f.log}
    for witness in (w for w in witnesses if w.verdict.ok):  # its own first problem is the one told
        if witness.logs is not None:
            first = [number for log, number in witness.logs.items() if log not in logs]
            if first:
                witness.fail(min(first), _UNMATCHED, numbered=False)
            continue
        for number, held in witness.checkpoints():
            if held.log not in logs:
                witness.fail(number, _UNMATCHED, numbered=False)
                break


class _Held(NamedTuple):
    log: str
    size: int
    root: str


_HELD_TYPES: Final = {"log": str, "size": int, "root": str}


class _Witness:
    """One witness file: opened once (what was checked is what is walked), its verdict, and how
    many of its lines may be used — those before its first bad one."""

    def __init__(self, path: Path) -> None:
        self.verdict = WitnessVerdict(str(path))
        self.stream = open_regular_stream(path)
        self.usable = 0
        self._broken_at: int | None = None
        # The logs its checkpoints are of, with the line each first appears on; None once
        # there are more than _FEW_LOGS (then they are found by reading the witness again).
        self.logs: dict[str, int] | None = {}

    def saw(self, number: int, record: dict[str, Any]) -> None:
        body = record.get("checkpoint")
        if body is None or self.logs is None:
            return
        self.logs.setdefault(body["log"], number)
        if len(self.logs) > _FEW_LOGS:
            self.logs = None

    def fail(self, number: int, problem: str, *, numbered: bool = True) -> None:
        """Line `number` breaks the witness; the earliest such line is the one reported."""
        if self._broken_at is not None and self._broken_at <= number:
            return
        self._broken_at, self.usable = number, min(self.usable, number - 1)
        self.verdict.ok = False
        self.verdict.problem = f"line {number}: {problem}" if numbered else problem

    def lines(self) -> Iterator[tuple[int, bytes]]:
        """(line number, line) from the start, each bounded in length."""
        self.stream.seek(0)
        yield from enumerate(bounded_lines(self.stream, MAX_LINE_BYTES), 1)

    def checkpoints(self) -> Iterator[tuple[int, _Held]]:
        """(line number, checkpoint) of the usable lines. Checked by `_check_witness`, so only
        the types used are checked again: the file may have changed since (a record that no
        longer fits breaks the witness rather than this verifier)."""
        for number, raw in self.lines():
            if number > self.usable:
                return
            line, problem = _witness_line(raw)
            record = _as_witness_record(line)
            if problem is None and record is None:
                continue  # an ordinary audit line
            body = record.get("checkpoint") if isinstance(record, dict) else None
            if body is None and isinstance(record, dict) and "gap" in record:
                continue
            if type(body) is not dict or any(type(body.get(k)) is not t for k, t in _HELD_TYPES.items()):
                self.fail(number, "record changed while being read")
                return
            yield number, _Held(body["log"], body["size"], body["root"])


class _Cursor:
    """One witness's checkpoints of one log, handed out in step with the log's growing tree.

    The broker appends a log's checkpoints in the order of their tree sizes, so records whose
    sizes go back are a broken witness (edited, or its log cut back and written again), and one
    pass over the witness serves the whole log in O(1) memory."""

    def __init__(self, witness: _Witness, log: str) -> None:
        self._witness, self._log = witness, log
        self._records = witness.checkpoints()
        self._next: tuple[int, _Held] | None = None
        self._last: _Held | None = None
        self._done = False

    def upto(self, size: int | None) -> Iterator[_Held]:
        """The checkpoints up to tree size `size` (None: all that are left), each once."""
        while (ahead := self._peek()) is not None and (size is None or ahead.size <= size):
            self._next = None
            yield ahead

    def _peek(self) -> _Held | None:
        while self._next is None and not self._done:
            found = next(self._records, None)
            if found is None:
                self._done = True
                break
            number, held = found
            if held.log != self._log:
                continue
            if self._last is not None and held.size < self._last.size:
                self._witness.fail(number, "a log's checkpoints out of tree order (edited, or log cut back)")
                self._done = True
            elif self._last is not None and held.size == self._last.size and held.root != self._last.root:
                self._witness.fail(number, "two tree heads for one size")
                self._done = True
            else:
                self._next, self._last = (number, held), held
        return self._next[1] if self._next is not None else None


def _check_witness(path: Path, keys: Keyring) -> _Witness:
    """Open the witness at `path` and check every record: the first bad line breaks it. Raises
    UnsafeFileError (not a regular file, or cannot be opened) or OSError."""
    witness = _Witness(path)
    try:
        for number, raw in witness.lines():
            line, problem = _witness_line(raw)
            if problem is None:
                record = _as_witness_record(line)
                if record is None:  # an ordinary audit line: a copy of stdout can serve as the witness
                    witness.usable = number
                    continue
                problem = _witness_problem(record, keys)
            if problem:
                witness.fail(number, problem)
                break
            witness.usable = number
            witness.verdict.records += 1
            witness.saw(number, record)
    except BaseException:
        witness.stream.close()
        raise
    return witness


def _witness_line(raw: bytes) -> tuple[Any, str | None]:
    """(the parsed line, None), or (None, why it is a broken witness line)."""
    if len(raw) > MAX_LINE_BYTES:
        return None, "line too long"
    if not raw.endswith(b"\n"):
        return None, "line has no newline (truncated write or tampering)"
    try:
        # orjson refuses nesting past 1024 (no recursion error); the record's fields are
        # checked one by one next. Much faster than the standard parser on a year of records.
        return orjson.loads(raw), None
    except orjson.JSONDecodeError:
        return None, "not a JSON line (or nested too deep)"


_WITNESSED: Final[dict[str, str]] = {SystemEvent.CHECKPOINT: "checkpoint", SystemEvent.GAP: "gap"}


def _as_witness_record(line: Any) -> Any:
    """The witness record in a line: the witness file's own, or the evidence of a full audit
    line (as `DOCBROKER_AUDIT_STDOUT` ships them); None for an ordinary event."""
    if isinstance(line, dict) and "event" in line:
        event = line["event"]
        kind = _WITNESSED.get(event) if type(event) is str else None  # a list is no dict key
        return {kind: line.get(kind), "sig": line.get("sig")} if kind else None
    return line


def _witness_problem(record: Any, keys: Keyring | None) -> str | None:
    if not isinstance(record, dict) or not (
        {"checkpoint", "sig"} == record.keys() or {"gap", "sig"} == record.keys()
    ):
        return "not a checkpoint or gap record"
    kind = "checkpoint" if "checkpoint" in record else "gap"
    for key in (kind, "sig"):
        if EVIDENCE_FIELDS[key](record[key]) is INVALID:
            return "not a valid checkpoint or gap record"
    if keys:
        return keys.check(
            CHECKPOINT_LABEL if kind == "checkpoint" else GAP_LABEL, record[kind], record["sig"]
        )
    return None


def load_keys(key_specs: list[str], command: str) -> Keyring | None:
    """The public keys given on a command line; None (the reason said on stderr) if one is bad."""
    from broker.audit.checkpoint import KeyFileError, load_public_key

    try:
        return Keyring([load_public_key(spec) for spec in key_specs])
    except KeyFileError as exc:
        sys.stderr.write(f"docbroker audit {command}: {exc}\n")
        return None


def main(
    files: list[str], key_specs: list[str], witness_files: list[str], replica: str | None, as_json: bool
) -> int:
    """`docbroker audit verify`: one verdict line per file (or one JSON document); exit 0/1/2."""
    keys = load_keys(key_specs, "verify")
    if keys is None:
        return EXIT_USAGE
    try:
        report = verify_logs([Path(f) for f in files], keys, [Path(w) for w in witness_files], replica)
    except (OSError, UnsafeFileError) as exc:
        sys.stderr.write(f"docbroker audit verify: a witness file: {_cannot_read(exc)}\n")
        return EXIT_USAGE
    if as_json:
        document = {
            "ok": report.ok,
            "signatures_checked": bool(keys),
            "files": [asdict(f) for f in report.files],
            "witnesses": [asdict(w) for w in report.witnesses],
        }
        sys.stdout.write(json.dumps(document, sort_keys=True) + "\n")
    else:
        for verdict in report.files:
            line = verdict.summary()
            if not verdict.ok and verdict.problem and verdict.problem.startswith("cannot read"):
                line = f"audit log: {verdict.problem} ({printable(verdict.path)})"
            sys.stdout.write(line + "\n")
        for witness in report.witnesses:
            sys.stdout.write(witness.summary() + "\n")
        if not keys:
            sys.stdout.write("signatures NOT checked: give the replicas' public keys with --key\n")
    return EXIT_OK if report.ok else EXIT_BROKEN
