"""`docbroker`: the operator's command line (also `python -m broker`).

One module per command group, each with one `register(subparsers)` adding its parsers and
setting `func` on each command; GROUPS lists them in the order `--help` shows them. `serve`
(the broker's own wiring) is one of them and the only one that runs the broker; the others
talk to a running broker over its REST API (`approvals`), to the sandbox engine (`sandbox`),
or to the files an operator owns (`tenant`, `audit`, `db`). Shared structure — exit codes,
errors, `--json`, tables — is in `base.py`.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Iterator

from broker.cli import (
    approvals,
    audit,
    client_config,
    db,
    doctor,
    image,
    policy,
    reference,
    sandbox,
    serve,
    tenant,
    token,
)
from broker.cli.base import EXIT_FAILED, CliError

GROUPS = (
    serve,
    tenant,
    approvals,
    sandbox,
    client_config,
    token,
    audit,
    db,
    policy,
    doctor,
    image,
    reference,
)

EPILOG = (
    "exit codes: 0 done (or all checks passed), 1 failed (refused, unreachable, not found, a check "
    "failed), 2 usage (bad arguments or configuration). Reads take --json. See docs/operations.md."
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="docbroker", description="Multi-tenant MCP broker for document tools", epilog=EPILOG
    )
    # The release and the schema it needs: what an upgrade or a rollback is checked against.
    parser.add_argument("--version", action="version", version=version_line())
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for group in GROUPS:
        group.register(sub)
    parser.set_defaults(top_parser=parser)  # for `docbroker reference`, which documents it all
    for command in commands(parser):
        command.set_defaults(prog=command.prog)  # names the command in its error lines
    return parser


def version_line() -> str:
    """`docbroker X.Y.Z (approvals schema N)`: the installed release and its schema version."""
    from importlib.metadata import PackageNotFoundError, version

    from broker.approvals.migrations import LATEST

    try:
        release = version("docbroker")
    except PackageNotFoundError:  # a source checkout run without installing it
        release = "unknown"
    return f"docbroker {release} (approvals schema {LATEST})"


def commands(parser: argparse.ArgumentParser) -> Iterator[argparse.ArgumentParser]:
    """Every runnable command's parser (the leaves), in the order `--help` lists them."""
    actions = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not actions:
        yield parser
        return
    seen: set[int] = set()
    for child in actions[0].choices.values():
        if id(child) not in seen:  # an alias maps to the same parser
            seen.add(id(child))
            yield from commands(child)


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(
        stream=sys.stderr, level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s"
    )
    # Client libraries log URLs and request lines at INFO: not values we want in any log.
    for noisy in ("httpx2", "httpcore2", "docker", "urllib3", "kubernetes"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    # psycopg's pool logs connection errors with libpq's text (hosts, sockets, perhaps more
    # of the URL): the store logs its own fixed lines instead.
    logging.getLogger("psycopg").setLevel(logging.CRITICAL)
    args = build_parser().parse_args(argv)  # bad usage: argparse's message, exit 2
    try:
        return int(args.func(args))
    except CliError as exc:
        sys.stderr.write(f"{args.prog}: {exc}\n")
        return exc.code
    except KeyboardInterrupt:
        sys.stderr.write(f"{args.prog}: interrupted\n")
        return 130
    except Exception as exc:
        # An operator gets one line, never a traceback (it may hold values); the type names it.
        sys.stderr.write(f"{args.prog}: failed unexpectedly ({type(exc).__name__})\n")
        return EXIT_FAILED


if __name__ == "__main__":
    sys.exit(main())
