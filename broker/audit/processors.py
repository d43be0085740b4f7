"""The audit pipeline: small structlog processors, JSON renderer last (the structlog shape).

    FilterKeys → ValidateValues → AddHeader (v, seq, ts, prev) → render_json → the sink's writer

`build_logger` is the one place structlog is configured for the audit log. It builds the bound
logger from explicit processors and context and never touches structlog's global configuration,
so neither side leaks into the other: the broker's ordinary logs cannot reach the audit file,
and `structlog.configure(...)` elsewhere cannot change what the audit log writes.
"""

from __future__ import annotations

import functools
import json
import time
from collections.abc import Callable, MutableMapping
from dataclasses import dataclass
from typing import Any, Protocol

import orjson
from structlog import BoundLoggerBase
from structlog.typing import EventDict, Processor, WrappedLogger

from broker.audit.chain import Chain
from broker.audit.errors import UnknownEventError
from broker.audit.schema import CALLER_FIELDS, INVALID, SCHEMA_VERSION

Clock = Callable[[], int]  # nanoseconds since the epoch, like time.time_ns


@dataclass
class Counters:
    """Running totals for /metrics. A non-zero `keys_dropped` or `values_invalid` is a broker bug."""

    keys_dropped: int = 0
    values_invalid: int = 0


def rfc3339_ms(ns: int) -> str:
    """RFC 3339 UTC with milliseconds and `Z`, e.g. 2026-07-28T09:15:02.123Z (truncated, not rounded)."""
    seconds, rest = divmod(ns, 1_000_000_000)
    return f"{_utc_second(seconds)}.{rest // 1_000_000:03d}Z"


@functools.lru_cache(maxsize=4)
def _utc_second(seconds: int) -> str:
    # strftime is a third of the header's cost; events arrive many per second.
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds))


class FilterKeys:
    """Drop every key outside the allow-list. Only the count is kept: a key's name can be content."""

    def __init__(self, counters: Counters) -> None:
        self._counters = counters

    def __call__(self, _: WrappedLogger, __: str, event_dict: EventDict) -> EventDict:
        kept = {k: v for k, v in event_dict.items() if k in CALLER_FIELDS}
        dropped = len(event_dict) - len(kept)
        if dropped:
            self._counters.keys_dropped += dropped
            kept["dropped"] = dropped
        return kept


class ValidateValues:
    """Keep only values of the shape their key promises; refused values leave only their key's name.

    None means "not relevant to this event" and is omitted silently. An unknown event name is a
    programming error, raised rather than written, so tests catch it.
    """

    def __init__(self, counters: Counters) -> None:
        self._counters = counters

    def __call__(self, _: WrappedLogger, __: str, event_dict: EventDict) -> EventDict:
        out: dict[str, Any] = {}
        invalid = []
        for key, value in event_dict.items():
            if key not in CALLER_FIELDS:  # set by an earlier processor (`dropped`), already checked
                out[key] = value
                continue
            if value is None:
                continue
            checked = CALLER_FIELDS[key](value)
            if checked is INVALID:
                if key == "event":
                    raise UnknownEventError()
                invalid.append(key)
            else:
                out[key] = checked
        if "event" not in out:
            raise UnknownEventError()
        if invalid:
            self._counters.values_invalid += len(invalid)
            out["invalid"] = sorted(invalid)
        return out


class AddHeader:
    """Stamp schema version, next sequence number, time, the hash of the previous line and, when
    the log has one, the replica that writes it (DESIGN §9: every line names its replica).

    It reads the chain but does not advance it: only a successful write does, so a failed write
    leaves seq and prev where the file says they are.
    """

    def __init__(self, chain: Chain, clock: Clock, replica: str | None = None) -> None:
        self._chain = chain
        self._clock = clock
        self._replica = replica

    def __call__(self, _: WrappedLogger, __: str, event_dict: EventDict) -> EventDict:
        if self._replica is not None:
            event_dict["replica"] = self._replica
        event_dict["v"] = SCHEMA_VERSION
        event_dict["seq"] = self._chain.seq + 1
        event_dict["ts"] = rfc3339_ms(self._clock())
        event_dict["prev"] = self._chain.head
        return event_dict


def render_json(_: WrappedLogger, __: str, event_dict: EventDict) -> str:
    # ensure_ascii: no raw U+2028 or newline can split a line; sorted keys, compact separators:
    # one canonical form, so `verify` can also reject lines edited into another form.
    # orjson writes the same bytes several times faster whenever the line is pure ASCII (nearly always:
    # every value but a subject is an identifier); anything else takes the exact slow path.
    if _orjson_agrees(event_dict):
        try:
            fast = orjson.dumps(event_dict, option=orjson.OPT_SORT_KEYS)
        except TypeError:  # not JSON-able by orjson: json raises or renders it below
            fast = b"\x80"
        # json escapes DEL where orjson does not, and refuses NaN and infinities where orjson
        # writes null (which no valid line holds: None values are omitted).
        if fast.isascii() and b"\x7f" not in fast and b"null" not in fast:
            return fast.decode("ascii")
    return _render_exact(event_dict)


def _orjson_agrees(event_dict: EventDict) -> bool:
    # A plain loop: this runs on every line, and only floats (and lists, which may hold
    # them) can be spelled differently; a call per value would cost more than the rest.
    for value in event_dict.values():
        kind = type(value)
        if (kind is float or kind is list) and not _same_in_both(value):
            return False
    return True


def _same_in_both(value: object) -> bool:
    """False for a number the two libraries spell differently (json `1e-05`, orjson `1e-5`)."""
    if type(value) is float:
        return value == 0 or 1e-4 <= abs(value) < 1e16
    if type(value) is list:
        return all(_same_in_both(item) for item in value)
    return True


def _render_exact(event_dict: EventDict) -> str:
    return json.dumps(event_dict, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False)


def canonical(record: MutableMapping[str, Any]) -> str:
    """The exact text `render_json` writes for `record` (verify compares against it)."""
    return _render_exact(dict(record))


class LineWriter(Protocol):
    """What the pipeline's final output is handed to: one rendered line, without newline."""

    def write(self, line: str) -> None: ...


class AuditPipeline(BoundLoggerBase):
    """A structlog bound logger with one method: run the processors and write the line."""

    def write(self, event: str, fields: dict[str, Any]) -> None:
        # _process_event rather than **fields: a field named like a parameter cannot collide.
        args, kwargs = self._process_event("write", event, fields)
        self._logger.write(*args, **kwargs)


def build_logger(
    writer: LineWriter, chain: Chain, counters: Counters, clock: Clock, replica: str | None = None
) -> AuditPipeline:
    processors: list[Processor] = [
        FilterKeys(counters),
        ValidateValues(counters),
        AddHeader(chain, clock, replica),
        render_json,
    ]
    return AuditPipeline(writer, processors=processors, context={})
