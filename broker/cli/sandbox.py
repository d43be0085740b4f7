"""`docbroker sandbox list|restart|logs`: the tenants' sandboxes, as the engine holds them.

These talk to the sandbox engine (Docker, Kubernetes, the local pid files) with the broker's
own settings, whichever broker started a sandbox; they write no audit of their own, and the
brokers audit what they see (`sandbox.failed`, then `sandbox.stopped` and `sandbox.started`
when a restarted tenant's next call starts a new one, DESIGN §11).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, TypeVar

from broker.cli.base import (
    CliError,
    Subparsers,
    UsageError,
    json_flag,
    load_settings,
    print_json,
    print_table,
    progress,
)
from broker.settings import Settings

if TYPE_CHECKING:
    from broker.runtime.base import SandboxBackend

_T = TypeVar("_T")
MAX_LINES = 10_000
# What one `logs` prints at most: a sandbox that floods its stderr does not flood the terminal.
MAX_LOG_BYTES = 1024 * 1024


def register(sub: Subparsers) -> None:
    sandbox = sub.add_parser("sandbox", help="tenants' sandboxes: list, restart, logs")
    commands = sandbox.add_subparsers(dest="sandbox_command", required=True, metavar="COMMAND")

    listing = commands.add_parser("list", help="the tenants' sandboxes the engine holds (any broker's)")
    json_flag(listing)
    listing.set_defaults(func=cmd_list)

    restart = commands.add_parser(
        "restart",
        aliases=["replace"],
        help="remove a tenant's sandbox (any broker's); the next call starts a new one",
    )
    restart.add_argument("tenant")
    json_flag(restart)
    restart.set_defaults(func=cmd_restart)

    logs = commands.add_parser(
        "logs", help="the tenant's sandbox's stderr (its log lines: names and codes, never contents)"
    )
    logs.add_argument("tenant")
    logs.add_argument("-n", "--lines", type=int, default=100, help=f"the last N lines (1..{MAX_LINES})")
    json_flag(logs)
    logs.set_defaults(func=cmd_logs)


def _tenant(name: str) -> str:
    from server.contracts import TENANT_RE

    if not TENANT_RE.fullmatch(name):
        raise UsageError("not a tenant id (a DNS label)")
    return name


def _with_backend(settings: Settings, work: Callable[[SandboxBackend], Awaitable[_T]]) -> _T:
    from broker.master_key import MasterKeyError
    from broker.runtime.backends import make_backend
    from broker.runtime.base import RuntimeErrorBase

    async def run() -> _T:
        backend = await make_backend(settings)
        try:
            return await work(backend)
        finally:
            await backend.close()

    try:
        with progress(f"asking the {settings.runtime.kind} sandbox engine"):
            return asyncio.run(run())
    except (RuntimeErrorBase, MasterKeyError) as exc:  # one line naming the engine's refusal
        raise CliError(str(exc)) from None


def remove_sandboxes(settings: Settings, tenant: str) -> int:
    """Remove every sandbox of `tenant` (also `tenant remove`); returns how many."""
    return _with_backend(settings, lambda b: b.remove_tenant(tenant, str(settings.run_dir / tenant)))


def cmd_list(args: argparse.Namespace) -> int:
    settings = load_settings()
    found = _with_backend(settings, lambda b: b.sandboxes())
    rows = [
        {
            "tenant": info.tenant,
            "state": info.state.value,
            "id": str(info.details.get("id") or info.backend_id),
            "replica": info.details.get("replica") or None,
            "warm": bool(info.details.get("warm", False)),
        }
        for info in sorted(found, key=lambda i: (i.tenant, i.backend_id))
    ]
    if args.json:
        print_json({"runtime": settings.runtime.kind, "sandboxes": rows})
    else:
        columns = ["tenant", "state", "id", "replica", "warm"]
        print_table(columns, [[row[c] for c in columns] for row in rows], title=settings.runtime.kind)
    return 0


def cmd_restart(args: argparse.Namespace) -> int:
    tenant = _tenant(args.tenant)
    removed = remove_sandboxes(load_settings(), tenant)
    result = {"tenant": tenant, "removed": removed}
    if args.json:
        print_json(result)
    else:
        sys.stdout.write(f"{tenant}: {removed} sandbox(es) removed; the next call starts a new one\n")
    return 0


def cmd_logs(args: argparse.Namespace) -> int:
    tenant = _tenant(args.tenant)
    if not 1 <= args.lines <= MAX_LINES:
        raise UsageError(f"--lines must be between 1 and {MAX_LINES}")
    from broker.audit.table import escape

    raw = _with_backend(load_settings(), lambda b: b.stderr(tenant, args.lines))
    # The sandbox writes these bytes, and it runs the tenant's code paths: every line is
    # escaped (no terminal control reaches the operator) and the whole is bounded.
    text = raw[-MAX_LOG_BYTES:].decode("utf-8", errors="replace")
    lines = [escape(line) for line in text.splitlines()]
    if args.json:
        print_json({"tenant": tenant, "lines": lines})
    else:
        sys.stdout.write("".join(line + "\n" for line in lines))
    return 0
