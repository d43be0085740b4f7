"""What every `docbroker` command shares: errors and exit codes, settings, output.

Exit codes, the same for every command (docs/operations.md):

    0  done; for a check (`doctor`, `db status`, `audit verify`): all is well
    1  failed: the broker, the engine or the database refused or cannot be reached, the thing
       named does not exist, or a check found a problem
    2  usage: bad arguments, bad configuration, or a question only the operator can answer
       (`tenant remove` without a terminal and without `--yes` / `--keep-reports`)

Errors are one line on stderr, `docbroker <command>: <reason>`, and never a traceback; they
name settings and fixed reasons, never values (tokens, file names, contents). Reads take
`--json` for one JSON document on stdout; without it they print a table for people (rich),
every cell escaped, since tenants choose many of the strings shown (a report's name, a
sandbox's stderr) and a terminal obeys control characters.

    CliError        exit 1
     └── UsageError exit 2
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

from broker.settings import Settings, SettingsError

# argparse's private _SubParsersAction: what `register(subparsers)` receives.
Subparsers = Any

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2


class CliError(Exception):
    """A command failed: one line for stderr, and its exit code."""

    code = EXIT_FAILED


class UsageError(CliError):
    code = EXIT_USAGE


def load_settings() -> Settings:
    try:
        return Settings.from_env()
    except SettingsError as exc:  # names the variable, never its value
        raise UsageError(f"configuration error: {exc}") from None


def json_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print one JSON document instead of a table")


def print_json(value: object) -> None:
    # ensure_ascii: C1 controls and bidi overrides a tenant chose reach a terminal as \u escapes.
    sys.stdout.write(json.dumps(value, indent=2, ensure_ascii=True, sort_keys=False) + "\n")


def cell(value: object) -> str:
    from broker.audit.table import escape  # the audit package is slow to import: only when printing

    return "-" if value is None or value == "" else escape(str(value))


def print_table(
    columns: Sequence[str], rows: Iterable[Sequence[object]], *, title: str | None = None
) -> None:
    """A rich table on stdout; every cell escaped (and not read as rich markup)."""
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    table = Table(title=title, show_lines=False, header_style="bold")
    for column in columns:
        table.add_column(column, overflow="fold")
    for row in rows:
        table.add_row(*(Text(cell(value)) for value in row))
    # Piped (grep, a file), the table is as wide as its cells: rich's 80 columns would fold ids.
    width = None if sys.stdout.isatty() else 1000
    Console(file=sys.stdout, highlight=False, soft_wrap=False, width=width).print(table)


def print_fields(pairs: Sequence[tuple[str, object]]) -> None:
    """`name  value` lines, the values escaped: one record for people."""
    width = max((len(name) for name, _ in pairs), default=0)
    for name, value in pairs:
        sys.stdout.write(f"{name:<{width}}  {cell(value)}\n")


@contextlib.contextmanager
def progress(what: str) -> Iterator[None]:
    """A spinner on stderr while a slow step runs (an engine, a broker), for people at a
    terminal; nothing when stderr is a file or a pipe, so logs and scripts see no noise."""
    if not sys.stderr.isatty():
        yield
        return
    from rich.console import Console

    with Console(stderr=True).status(what):
        yield


def note(line: str) -> None:
    """Progress and hints for people: stderr, so stdout stays the command's output."""
    sys.stderr.write(line.rstrip() + "\n")


def confirm(question: str, flags: str) -> bool:
    """Ask on the terminal. Without one, a usage error before anything was done: a script
    must answer with one of `flags`."""
    if not sys.stdin.isatty():
        raise UsageError(f"{question} no terminal to ask on: answer with {flags}")
    sys.stderr.write(f"{question} [y/N] ")
    sys.stderr.flush()
    return sys.stdin.readline().strip().lower() in ("y", "yes")
