"""Reading a witness file for `docbroker audit verify` (broker/audit/evidence.py).

A witness is what an attacker on the broker's host could not rewrite: checkpoints (and gap
records) shipped off the host as they were written (`witness.FileCopy`), or a copy of the
broker's stdout. It is streamed, never held — a year of checkpoints is millions of records:

- `open_witness` reads it once and checks each record (form, signature); the first bad line
  breaks the witness and nothing from it on is used. A line that is not JSON is a bad line:
  skipping it would let one byte glued to each record hide them all, and with them a cut tail.
- a `Cursor` per log then walks its checkpoints in step with that log's growing tree. The broker
  appends a log's checkpoints in tree order, so a witness whose sizes go back is broken, and one
  pass serves a whole log in O(1) memory.
- `check_unmatched` finds a log no given file holds, from the few logs noted on the first read
  (or, past `_FEW_LOGS`, by reading the witness once more).

The file is opened once (what was checked is what is walked) and refused unless regular.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, NamedTuple

import orjson

from broker.audit.checkpoint import CHECKPOINT_LABEL, GAP_LABEL, Keyring
from broker.audit.schema import EVIDENCE_FIELDS, INVALID, SystemEvent
from broker.audit.sink import MAX_LINE_BYTES
from broker.files import bounded_lines, open_regular_stream, printable

_UNMATCHED = "holds checkpoints of a log that no given file holds (replaced, swapped or deleted)"
_FEW_LOGS = 64  # a witness holds one log per replica's lineage; more are read again, not held


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


def check_unmatched(logs: set[str], witnesses: list[Witness]) -> None:
    """A witness's log that none of the given files holds (`logs`): replaced, swapped or deleted
    (give a replica's witness with that replica's files)."""
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


class Held(NamedTuple):
    log: str
    size: int
    root: str


_HELD_TYPES: Final = {"log": str, "size": int, "root": str}


class Witness:
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

    def checkpoints(self) -> Iterator[tuple[int, Held]]:
        """(line number, checkpoint) of the usable lines. Checked by `open_witness`, so only
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
            yield number, Held(body["log"], body["size"], body["root"])


class Cursor:
    """One witness's checkpoints of one log, handed out in step with the log's growing tree.

    The broker appends a log's checkpoints in the order of their tree sizes, so records whose
    sizes go back are a broken witness (edited, or its log cut back and written again), and one
    pass over the witness serves the whole log in O(1) memory."""

    def __init__(self, witness: Witness, log: str) -> None:
        self._witness, self._log = witness, log
        self._records = witness.checkpoints()
        self._next: tuple[int, Held] | None = None
        self._last: Held | None = None
        self._done = False

    def upto(self, size: int | None) -> Iterator[Held]:
        """The checkpoints up to tree size `size` (None: all that are left), each once."""
        while (ahead := self._peek()) is not None and (size is None or ahead.size <= size):
            self._next = None
            yield ahead

    def _peek(self) -> Held | None:
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


def open_witness(path: Path, keys: Keyring) -> Witness:
    """Open the witness at `path` and check every record: the first bad line breaks it. Raises
    UnsafeFileError (not a regular file, or cannot be opened) or OSError."""
    witness = Witness(path)
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
