"""Check a stored audit log: every line well-formed, in the schema, and linked into one chain.

`verify_file` stops at the first broken line and names it (1-based). Where the chain alone leaves
two candidates, one line of look-ahead decides, so the report points at the line that was changed,
inserted or reordered rather than at its innocent neighbour:

- altered line k: line k+1 still has the right `seq` but its `prev` no longer matches → k;
- deleted line(s) before k: `seq` jumps at k → k;
- reordered pair k, k+1: `seq` jumps at k → k;
- inserted line k: a crude one breaks `seq` or `prev` itself → k; a forged one with a correct
  `seq` and `prev` makes line k+1 claim the same place, and line k+2 continues from k+1 → k;
- truncated last line: no newline → that line.

Limit: a rewrite of the *last* line, or removal of whole lines at the end, leaves a valid chain.
Compare the final `head` with a copy kept elsewhere (`AuditLog.head`) to catch those.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, Final

from broker.audit.chain import GENESIS, line_hash
from broker.audit.merkle import leaf_hash
from broker.audit.nesting import MAX_DEPTH, too_deep
from broker.audit.processors import canonical
from broker.audit.schema import ALL_FIELDS, EVIDENCE_FIELDS, INVALID, REQUIRED_FIELDS, SYSTEM_EVENT_FIELDS
from broker.audit.sink import MAX_LINE_BYTES
from broker.files import UnsafeFileError, bounded_lines, open_regular_stream, printable
from broker.protocol.codec import loads_strict


@dataclass(frozen=True)
class VerifyReport:
    ok: bool
    lines: int  # lines in the file (a torn last line counts)
    first_bad_line: int | None = None
    problem: str | None = None  # a fixed description; never a value from the file
    head: str | None = None  # sha256 of the last line when ok (GENESIS for an empty log)


@dataclass(frozen=True)
class _Record:
    seq: int
    prev: str
    hash: str
    event: str = ""
    fields: dict[str, Any] | None = None  # the whole record, kept for the log's own lines only
    leaf: bytes = b""  # RFC 6962 leaf hash, when asked for


def verify_file(path: str | Path) -> VerifyReport:
    """Verify the log at `path`. Raises UnsafeFileError if it is no regular file (a FIFO or a
    device would hang or flood the check), OSError if it cannot be read."""
    with open_regular_stream(path) as stream:
        return verify_stream(stream)


def verify_stream(stream: BinaryIO) -> VerifyReport:
    lines = _Lines(stream)
    before: _Record | None = None
    while (raw := lines.next()) is not None:
        n = lines.count
        parsed = _parse(raw)
        if isinstance(parsed, str):
            return _broken(lines, n, parsed)
        if before is None:
            if parsed.seq != 1 or parsed.prev != GENESIS:
                return _broken(lines, n, "first line does not start a chain (seq 1, genesis prev)")
        elif not _links(before, parsed):
            line, problem = _blame(before, parsed, lines.peek(), n)
            return _broken(lines, line, problem)
        before = parsed
    return VerifyReport(ok=True, lines=lines.count, head=before.hash if before else GENESIS)


def main_verify(path: str | Path) -> int:
    """`docbroker audit verify FILE`: print a summary; exit code 0 when intact, 1 otherwise."""
    try:
        report = verify_file(path)
    except UnsafeFileError as exc:
        print(f"audit log: cannot read {exc}")
        return 1
    except OSError as exc:
        print(f"audit log: cannot read {printable(str(path))}: {exc.strerror or 'error'}")
        return 1
    if report.ok:
        print(f"audit log OK: {report.lines} lines, hash chain intact, head {report.head}")
        return 0
    print(f"audit log BROKEN at line {report.first_bad_line} of {report.lines}: {report.problem}")
    return 1


def _links(before: _Record, after: _Record) -> bool:
    return after.seq == before.seq + 1 and after.prev == before.hash


def _blame(before: _Record, record: _Record, following: bytes | None, n: int) -> tuple[int, str]:
    """Which of lines n-1 and n broke the chain between them (see the module docstring).

    Line n is taken as genuine unless the line after it, readable, fails to continue from it:
    rewriting a line's `prev` alone gains an attacker nothing, altering an event's content does.
    """
    nxt = _parse(following) if following is not None else None
    record_is_genuine = not (isinstance(nxt, _Record) and not _links(record, nxt))
    if record.hash == before.hash:
        return n, "line repeats the previous line exactly (replayed)"
    if record.seq == before.seq + 1:  # numbering intact, hash broken
        if record_is_genuine:
            return n - 1, "line altered: its hash differs from the next line's prev"
        return n, "prev does not match the previous line (line inserted or altered)"
    if record.seq == before.seq and record.prev == before.prev:  # two lines claim one place
        if record_is_genuine:
            return n - 1, "line inserted: the chain continues from the line after it"
        return n, "line inserted: repeats the previous line's place in the chain"
    if record.seq > before.seq:
        return n, "seq jumps: lines missing before this one (deleted or reordered)"
    return n, "seq goes backwards or repeats (reordered, replayed or inserted line)"


def _parse(raw: bytes, leaf: bool = False) -> _Record | str:
    """A record, or a fixed text saying why the line is not a valid event."""
    if len(raw) > MAX_LINE_BYTES:
        return "line too long"
    if not raw.endswith(b"\n"):
        return "line has no newline (truncated write or tampering)"
    body = raw[:-1]
    if too_deep(body):
        return f"JSON nested more than {MAX_DEPTH} deep"
    try:
        text = body.decode("ascii")
        record = loads_strict(text)  # duplicate keys refused: readers disagree on which wins
    except ValueError:
        return "not a JSON line (or not ASCII, or a duplicate key)"
    if not isinstance(record, dict):
        return "not a JSON object"
    if not record.keys() <= ALL_FIELDS.keys():
        return "key outside the audit schema"  # the key itself is not shown: it may be content
    if missing := sorted(REQUIRED_FIELDS - record.keys()):
        return f"missing field {missing[0]}"
    for key, value in record.items():
        checked = ALL_FIELDS[key](value)
        if checked is INVALID or checked != value:  # != : e.g. arg_names not sorted as written
            return f"value of {key} outside the audit schema"
    if canonical(record) != text:
        return "not in the writer's canonical form (edited)"
    event = record["event"]
    wanted = SYSTEM_EVENT_FIELDS.get(event, frozenset())
    evidence = record.keys() & EVIDENCE_FIELDS.keys()
    if evidence != wanted or (wanted and record.keys() - REQUIRED_FIELDS - _HEADER_EXTRAS - wanted):
        return "fields do not fit the event (evidence fields on an ordinary line, or missing)"
    return _Record(
        seq=record["seq"],
        prev=record["prev"],
        hash=line_hash(body),
        event=event,
        fields=record if event.startswith("audit.") else None,
        leaf=leaf_hash(body) if leaf else b"",
    )


# Header fields a line may carry besides the required ones, on the log's own lines too.
_HEADER_EXTRAS: Final = frozenset({"replica"})


def _broken(lines: _Lines, line: int, problem: str) -> VerifyReport:
    return VerifyReport(ok=False, lines=lines.count_all(), first_bad_line=line, problem=problem)


class _Lines:
    """Lines of a binary stream, bounded in length, with one line of look-ahead."""

    def __init__(self, stream: BinaryIO) -> None:
        self._lines = bounded_lines(stream, MAX_LINE_BYTES)
        self._ahead: bytes | None = None
        self.count = 0  # lines handed out by next()

    def _read(self) -> bytes | None:
        return next(self._lines, None)

    def next(self) -> bytes | None:
        raw = self._ahead if self._ahead is not None else self._read()
        self._ahead = None
        if raw is not None:
            self.count += 1
        return raw

    def peek(self) -> bytes | None:
        if self._ahead is None:
            self._ahead = self._read()
        return self._ahead

    def count_all(self) -> int:
        """Total lines in the stream, reading on from where verification stopped."""
        total = self.count + (self._ahead is not None)
        self._ahead = None
        for _ in iter(self._read, None):
            total += 1
        return total
