"""`docbroker audit query` and `audit export`: one driver for both — the filters from the command
line, each match rendered to stdout, bad lines named on stderr, the exit code.

The selecting itself (filters, the streaming scan, `--follow`) is broker/audit/query.py; the OCSF
mapping is broker/audit/ocsf.py. Exit 0 (found, or nothing to find), 1 (a file cannot be read),
2 (a filter cannot be used).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, Final

from broker.audit.query import BadLine, FilterError, Filters, Scanner, build_filters, log_order

Render = Callable[[bytes, dict[str, Any] | None], bytes]
_MAX_REPORTED: Final = 100  # bad lines named one by one on stderr; past that they are only counted


def filters_from_args(args: argparse.Namespace) -> Filters:
    return build_filters(
        tenants=args.tenant,
        subjects=args.subject,
        events=args.event,
        outcomes=args.outcome,
        reasons=args.reason,
        since=args.since,
        until=args.until,
        evidence=args.evidence,
    )


def run_scan(
    args: argparse.Namespace, command: str, render: Render, *, raw: bool = False, header: bytes | None = None
) -> int:
    """Shared driver: filters → scan → render each match to stdout. Exit 0, 1 (unreadable file), 2.

    `render` gets the parsed record, or None with `raw` (then it may use only the raw line). A
    line it raises BadLine for is named on stderr by file and line number, counted, and skipped."""
    try:
        filters = filters_from_args(args)
    except FilterError as exc:
        sys.stderr.write(f"docbroker audit {command}: {exc}\n")
        return 2
    scanner = Scanner(filters, raw=raw)
    out = sys.stdout.buffer
    try:
        paths = log_order([Path(f) for f in args.files])  # an unreadable file fails before any output
        if header is not None:
            out.write(header)
        for line, record in scanner.scan(paths, follow=args.follow):
            try:
                out.write(render(line, record))
            except BadLine as exc:
                _report(command, scanner, exc)
                continue
            if args.follow:
                out.flush()
        out.flush()
    except OSError as exc:
        if isinstance(exc, BrokenPipeError):  # `| head`: the reader has what it wanted
            _silence_stdout()
            return 0
        sys.stderr.write(
            f"docbroker audit {command}: cannot read {exc.filename}: {exc.strerror or 'error'}\n"
        )
        return 1
    except KeyboardInterrupt:
        return 0
    finally:
        stats = scanner.stats
        if stats.unreadable:
            sys.stderr.write(
                f"docbroker audit {command}: skipped {stats.unreadable} lines that are not audit events "
                "(run `docbroker audit verify`)\n"
            )
    return 0


def _report(command: str, scanner: Scanner, exc: BadLine) -> None:
    stats = scanner.stats
    stats.unreadable += 1
    stats.matched -= 1
    stats.reported += 1
    if stats.reported <= _MAX_REPORTED:
        name, number = scanner.position
        sys.stderr.write(f"docbroker audit {command}: {name} line {number}: {exc}; skipped\n")
    elif stats.reported == _MAX_REPORTED + 1:
        sys.stderr.write(f"docbroker audit {command}: more bad lines: from here on they are only counted\n")
    sys.stderr.flush()


def _silence_stdout() -> None:
    # Python flushes stdout at exit and would raise BrokenPipeError again there.
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)


def main_query(args: argparse.Namespace) -> int:
    """`docbroker audit query`: the matching lines as they are (--json), or a table."""
    from broker.audit.table import table_header, table_row

    if args.json:
        return run_scan(args, "query", lambda line, _: line + b"\n", raw=True)

    def render(_: bytes, record: dict[str, Any] | None) -> bytes:
        assert record is not None  # run_scan parses every line for a renderer that asks for records
        return (table_row(record) + "\n").encode("utf-8", "replace")

    return run_scan(args, "query", render, header=(table_header() + "\n").encode("ascii"))


def main_export(args: argparse.Namespace) -> int:
    """`docbroker audit export --format ocsf`: each match as an OCSF API Activity line."""
    from broker.audit.ocsf import Exporter

    exporter = Exporter()

    def render(_: bytes, record: dict[str, Any] | None) -> bytes:
        assert record is not None  # run_scan parses every line for a renderer that asks for records
        return exporter.line(record)

    return run_scan(args, "export", render)
