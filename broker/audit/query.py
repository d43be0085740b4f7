"""`docbroker audit query`: filter an audit log by tenant, subject, event, outcome, reason and time.

Built for logs of many gigabytes: files are read in fixed-size chunks (never whole, and a line
longer than any valid one is skipped, not buffered), and each filter first looks for its exact
`"key":value` bytes in the raw line. The writer's canonical form (sorted keys, compact separators,
ASCII escapes) makes that substring present in every line that can match, so most lines that
cannot match are dropped without being parsed. The lines that pass are parsed and checked exactly.
`ts` has one fixed-width form, so a time range compares strings: no date parsing per line.

Query trusts the writer's form; it is no integrity check (that is `audit verify`): a line edited
into another form (spaces, reordered keys) may not match a filter it would match in the writer's.
Lines that are not JSON objects are skipped and counted (with `--json`, also lines in characters
the writer never writes: they would reach a terminal as they are). The table escapes what it
prints (broker/audit/table.py). The log's own evidence lines (`audit.*` events such as
checkpoints and gap records) are left out unless asked for (`--evidence` or `--event audit.…`).

`--follow` keeps reading the last file as it grows, like `tail -F`: when the path is rotated (a
new file appears under the same name) or truncated, it finishes the old file and continues with
the new one from its start.
"""

from __future__ import annotations

import errno
import json
import os
import re
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import IO, Any, Final

import orjson

from broker.audit.schema import CALLER_FIELDS, INVALID, AuditEvent
from broker.audit.sink import MAX_LINE_BYTES
from broker.files import UnsafeFileError, open_regular_stream, printable
from broker.types import Outcome

EVIDENCE_PREFIX: Final = "audit."  # events the log writes about itself (checkpoints, gaps)
_CHUNK: Final = 1 << 20
_POLL_SECONDS: Final = 0.2
_RELATIVE = re.compile(r"([0-9]{1,9})([smhdw])")
_UNITS: Final = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days", "w": "weeks"}
_EVIDENCE_EVENT = re.compile(r"audit\.[a-z_]{1,32}")


class FilterError(ValueError):
    """A filter the user gave cannot be used; the message names the option, never a log value."""


class BadLine(ValueError):
    """A renderer cannot use this line (a fixed text, never a value from it): it is reported by
    its position, counted and skipped, and the scan goes on (a `--follow` feed must not end)."""


@dataclass(frozen=True)
class Filters:
    """Each set, when not empty, must contain the line's value; `since` ≤ ts < `until`."""

    tenants: frozenset[str] = frozenset()
    subjects: frozenset[str] = frozenset()
    events: frozenset[str] = frozenset()
    outcomes: frozenset[str] = frozenset()
    reasons: frozenset[str] = frozenset()
    since: str | None = None  # the writer's ts form: fixed width, so strings compare as times
    until: str | None = None
    evidence: bool = False  # include the log's own `audit.*` lines

    def needles(self) -> list[tuple[bytes, ...]]:
        """Per filter, the raw bytes one of which every matching line must contain."""
        groups = []
        for key, values in (
            ("tenant", self.tenants),
            ("subject", self.subjects),
            ("event", self.events),
            ("outcome", self.outcomes),
            ("reason", self.reasons),
        ):
            if values:
                groups.append(tuple(_needle(key, v) for v in sorted(values)))
        return groups

    @property
    def excludes_evidence(self) -> bool:
        return not self.evidence and not any(e.startswith(EVIDENCE_PREFIX) for e in self.events)


def _needle(key: str, value: str) -> bytes:
    # The writer's exact spelling of the pair: compact, ASCII-escaped (see processors.render_json).
    return f'"{key}":{json.dumps(value, ensure_ascii=True)}'.encode("ascii")


def parse_time(text: str, *, now: datetime | None = None) -> str:
    """RFC 3339 (or a date, taken as UTC midnight) or a relative age (`90s`, `15m`, `12h`, `7d`, `2w`)
    → the writer's ts form. Raises FilterError."""
    text = text.strip()
    try:
        if m := _RELATIVE.fullmatch(text):
            moment = (now or datetime.now(UTC)) - timedelta(**{_UNITS[m[2]]: int(m[1])})
        else:
            try:
                moment = datetime.fromisoformat(text)
            except ValueError:
                raise FilterError(
                    "expected RFC 3339 (2026-11-30T08:00:00Z), a date, or an age such as 7d"
                ) from None
            if moment.tzinfo is None:
                if "T" in text.upper() or " " in text:
                    raise FilterError("a time needs its offset (Z or +hh:mm): the log is in UTC")
                moment = moment.replace(tzinfo=UTC)
        moment = moment.astimezone(UTC)
    except OverflowError:
        # An age reaching before year 1, or a time whose offset carries it past year 1 or 9999.
        raise FilterError("out of range: times run from year 1 to 9999 (UTC)") from None
    # Formatted by hand: strftime("%Y") writes year 1 as "1", and the form must keep its width.
    return (
        f"{moment.year:04d}-{moment.month:02d}-{moment.day:02d}T{moment.hour:02d}:{moment.minute:02d}:"
        f"{moment.second:02d}.{moment.microsecond // 1000:03d}Z"
    )


def build_filters(
    *,
    tenants: Iterable[str] = (),
    subjects: Iterable[str] = (),
    events: Iterable[str] = (),
    outcomes: Iterable[str] = (),
    reasons: Iterable[str] = (),
    since: str | None = None,
    until: str | None = None,
    evidence: bool = False,
    now: datetime | None = None,
) -> Filters:
    """Check every value against the shape its key has in the log. Raises FilterError."""
    known_events = {str(e) for e in AuditEvent}
    for event in events:
        if event not in known_events and not _EVIDENCE_EVENT.fullmatch(event):
            raise FilterError(f"--event: unknown event; one of {', '.join(sorted(known_events))}, or audit.*")
    for outcome in outcomes:
        if outcome not in {str(o) for o in Outcome}:
            raise FilterError(f"--outcome: unknown outcome; one of {', '.join(str(o) for o in Outcome)}")
    for option, key, values in (("--tenant", "tenant", tenants), ("--subject", "subject", subjects)):
        for value in values:
            if CALLER_FIELDS[key](value) is INVALID:
                raise FilterError(f"{option}: not a valid {key}")
    for reason in reasons:
        if CALLER_FIELDS["reason"](reason) is INVALID:
            raise FilterError("--reason: a reason code is lower case letters, digits and _.:-")
    low = _time_option("--since", since, now)
    high = _time_option("--until", until, now)
    if low is not None and high is not None and low >= high:
        raise FilterError("--since must be earlier than --until")
    return Filters(
        tenants=frozenset(tenants),
        subjects=frozenset(subjects),
        events=frozenset(events),
        outcomes=frozenset(outcomes),
        reasons=frozenset(reasons),
        since=low,
        until=high,
        evidence=evidence,
    )


def _time_option(option: str, text: str | None, now: datetime | None) -> str | None:
    if text is None:
        return None
    try:
        return parse_time(text, now=now)
    except FilterError as exc:
        raise FilterError(f"{option}: {exc}") from None


@dataclass
class ScanStats:
    lines: int = 0
    matched: int = 0
    unreadable: int = 0  # not a JSON object, or longer than any valid line, or refused by the renderer
    reported: int = 0  # lines the renderer refused (BadLine), each named on stderr up to a limit
    files: int = 0


@dataclass
class Scanner:
    """Stream the matching lines of audit files as (raw bytes, record or None).

    Every filter is decided on the raw bytes: in a line of the writer's form (flat, sorted keys,
    compact, escaped) the bytes `"tenant":"acme"` can only be the key tenant with the value acme,
    since inside a string every quote is escaped. Only the lines that pass are parsed. With
    `raw`, the caller prints the line itself (no record is handed out), so a line must also be
    in the writer's characters: printable ASCII (the writer escapes everything else). A planted
    line with raw DEL, C1 controls or bidi overrides is valid JSON, but never the writer's, and
    must not reach a terminal as it is.
    """

    filters: Filters
    raw: bool = False
    stats: ScanStats = field(default_factory=ScanStats)
    position: tuple[str, int] = ("", 0)  # the file (as given) and line number of the last line read

    def __post_init__(self) -> None:
        self._needles = self.filters.needles()
        self._evidence = _needle("event", EVIDENCE_PREFIX)[:-1]  # without the closing quote

    def scan(
        self,
        paths: Sequence[Path],
        *,
        follow: bool = False,
        stop: Callable[[], bool] = lambda: False,
        poll_seconds: float = _POLL_SECONDS,
    ) -> Iterator[tuple[bytes, dict[str, Any] | None]]:
        """Files in the order of their first line (rotated files and replicas' logs may be given in
        any order); `follow` follows the newest. Raises OSError when a file cannot be read."""
        paths = log_order(paths)
        for i, path in enumerate(paths):
            last = i == len(paths) - 1
            if follow and last:
                yield from self._select(str(path), _follow(path, stop, poll_seconds, self.stats))
            else:
                with _open(path) as stream:
                    self.stats.files += 1
                    yield from self._select(str(path), _lines(stream, self.stats))

    def _select(self, name: str, lines: Iterable[bytes]) -> Iterator[tuple[bytes, dict[str, Any] | None]]:
        needles, stats, raw = self._needles, self.stats, self.raw
        since, until = self.filters.since, self.filters.until
        evidence = self._evidence if self.filters.excludes_evidence else None
        files, number = stats.files, 0
        for line in lines:
            stats.lines += 1
            if stats.files != files:  # `--follow` went on to a new file under the same name
                files, number = stats.files, 0
            number += 1
            if not (line[:1] == b"{" and line[-1:] == b"}"):
                stats.unreadable += 1
                continue
            if not all(any(n in line for n in group) for group in needles):
                continue
            if evidence is not None and evidence in line:
                continue
            if since is not None or until is not None:
                ts = _raw_ts(line)
                if ts is None or (since is not None and ts < since) or (until is not None and ts >= until):
                    continue
            if raw and not (line.isascii() and b"\x7f" not in line):
                stats.unreadable += 1
                continue
            try:
                record = orjson.loads(line)
            except orjson.JSONDecodeError:
                record = None
            if not isinstance(record, dict):
                stats.unreadable += 1
                continue
            stats.matched += 1
            self.position = (name, number)
            yield line, (None if raw else record)


def log_order(paths: Sequence[Path]) -> list[Path]:
    """The files in the order of their first line. Raises OSError when one cannot be read."""
    return sorted(paths, key=_first_line_key)


def _first_line_key(path: Path) -> tuple[int, str, int]:
    """(empty last, first ts, first seq): a rotated file's lines all come before its successor's."""
    with _open(path, buffering=-1) as stream:  # readline on an unbuffered file reads bytewise
        first = stream.readline(MAX_LINE_BYTES + 1)
    try:
        record = orjson.loads(first)
    except orjson.JSONDecodeError:
        return (1, "", 0) if not first else (0, "", 0)
    if not isinstance(record, dict):
        return (0, "", 0)
    ts, seq = record.get("ts"), record.get("seq")
    return (0, ts if isinstance(ts, str) else "", seq if type(seq) is int else 0)


def _raw_ts(line: bytes) -> str | None:
    at = line.find(b'"ts":"')
    if at == -1:
        return None
    return line[at + 6 : at + 30].decode("ascii", "replace")


def _lines(stream: IO[bytes], stats: ScanStats, carry: bytearray | None = None) -> Iterator[bytes]:
    """Complete lines (without newline) until EOF; a trailing fragment stays in `carry`."""
    buf = carry if carry is not None else bytearray()
    skipping = False  # inside a line too long to be an event: drop it up to its newline
    while chunk := stream.read(_CHUNK):
        start = 0
        if buf or skipping:
            end = chunk.find(b"\n")
            if end == -1:
                if not skipping:
                    buf += chunk
                    if len(buf) > MAX_LINE_BYTES:
                        buf.clear()
                        skipping = True
                continue
            if not skipping:
                buf += chunk[:end]
                yield bytes(buf)
            else:
                yield b""  # the line too long: counted as unreadable by the caller, in its place
            buf.clear()
            skipping = False
            start = end + 1
        pieces = chunk[start:].split(b"\n")
        tail = pieces.pop()
        yield from pieces
        if len(tail) > MAX_LINE_BYTES:
            skipping = True
        else:
            buf += tail
    if carry is None and buf:
        stats.unreadable += 1  # a torn last line: never acknowledged by the writer


def _follow(path: Path, stop: Callable[[], bool], poll_seconds: float, stats: ScanStats) -> Iterator[bytes]:
    """`tail -F`: all of `path`, then what is appended; across rotation and truncation."""
    stream: IO[bytes] | None = None
    carry = bytearray()
    try:
        while True:
            if stream is None:
                try:
                    stream = _open(path)  # closed in finally: it outlives a yield
                except FileNotFoundError:
                    if stop():
                        return
                    time.sleep(poll_seconds)
                    continue
                stats.files += 1
                carry.clear()
            yield from _lines(stream, stats, carry)
            if stop():
                return
            time.sleep(poll_seconds)
            if _replaced(path, stream):
                yield from _lines(stream, stats, carry)  # what was written before the switch
                stream.close()
                stream = None
    finally:
        if stream is not None:
            stream.close()


def _open(path: Path, buffering: int = 0) -> IO[bytes]:
    """`path` (unbuffered: the scan reads its own chunks), if it is a regular file: a planted
    FIFO would hang the scan and a link to `/dev/zero` flood it (broker/files.py). Refusals come
    as OSError naming the file, as any other file that cannot be read; a missing file as
    FileNotFoundError (`--follow` waits for it)."""
    try:
        return open_regular_stream(path, buffering=buffering)
    except UnsafeFileError as exc:
        code = exc.errno or errno.EINVAL
        raise OSError(code, exc.reason, printable(str(path))) from None


def _replaced(path: Path, stream: IO[bytes]) -> bool:
    try:
        now = os.stat(path)
    except FileNotFoundError:
        return False  # rotated away and not yet recreated: keep draining the old file
    mine = os.fstat(stream.fileno())
    if (now.st_dev, now.st_ino) != (mine.st_dev, mine.st_ino):
        return True
    if now.st_size < stream.tell():  # truncated in place: start again at its beginning
        stream.seek(0)
    return False
