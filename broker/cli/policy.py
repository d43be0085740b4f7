"""`docbroker policy validate|test|explain`: the Cedar policy set (docs/policy.md).

The folder is the one `serve` loads — DOCBROKER_POLICIES_DIR, read as `serve` reads it — unless
`--dir` names another: an operator checking their deployment's set with its environment is
told about that set, not about `./policies`. The checks themselves live with the policy
(broker/policy/checks.py); this module parses and prints.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from broker.cli.base import Subparsers, UsageError


def _folder(args: argparse.Namespace) -> Path:
    if args.dir is not None:
        return Path(args.dir)
    from broker.settings import SettingsError, policies_dir_from_env

    try:
        return policies_dir_from_env()
    except SettingsError as exc:
        raise UsageError(f"configuration error: {exc}") from None


def _invalid(exc: Exception) -> int:
    sys.stdout.write(f"invalid: {exc}\n")
    return 1


def _cmd_validate(args: argparse.Namespace) -> int:
    """Load and validate the set; one line either way."""
    from broker.policy import PolicyError
    from broker.policy.checks import load_set

    try:
        engine = load_set(_folder(args), [Path(f) for f in args.files])
    except PolicyError as exc:
        return _invalid(exc)
    sys.stdout.write(f"ok: {len(engine.policy_ids)} policies, set {engine.hash}\n")
    return 0


def _cmd_test(args: argparse.Namespace) -> int:
    """One line per failing case, then a summary."""
    from broker.policy import PolicyError
    from broker.policy.checks import run_table

    table_file = Path(args.table)
    try:
        run = run_table(_folder(args), table_file)
    except PolicyError as exc:
        return _invalid(exc)
    for case, decision in run.failed:
        got = "allow" if decision.allowed else "deny"
        ids = list(decision.policy_ids)
        sys.stdout.write(f"FAIL {case.name}: got {got} by {ids}, approvers {decision.approvers}\n")
    failed = len(run.failed)
    passed = run.cases - failed
    sys.stdout.write(f"{passed} passed, {failed} failed ({table_file.name}, set {run.set_hash})\n")
    return 1 if failed else 0


def _cmd_explain(args: argparse.Namespace) -> int:
    """One request's decision and the policies that made it, as JSON."""
    from broker.policy import PolicyError
    from broker.policy.checks import explain

    request: dict[str, Any] = {
        "tenant": args.tenant,
        "subject": args.subject,
        "issuer": args.issuer,
        "groups": [g for g in args.groups.split(",") if g],
        "scopes": [s for s in args.scopes.split(" ") if s],
        "tool": args.tool,
    }
    if args.self_approval:
        request["self_approval"] = True
    for key in ("document", "content_bytes", "request_bytes", "protocol", "at"):
        value = getattr(args, key)
        if value is not None:
            request[key] = value
    try:
        verdict = explain(_folder(args), [Path(f) for f in args.with_files], request)
    except PolicyError as exc:
        return _invalid(exc)
    sys.stdout.write(json.dumps(verdict, indent=2) + "\n")
    return 0


def register(sub: Subparsers) -> None:
    policy = sub.add_parser("policy", help="the Cedar policy set: validate, test, explain").add_subparsers(
        dest="policy_command", required=True
    )
    dir_help = "the policies folder (default: DOCBROKER_POLICIES_DIR, the one `serve` loads)"
    check = policy.add_parser("validate", help="load and validate the set as `serve` would")
    check.add_argument("files", nargs="*", help="more .cedar files to load with it")
    check.add_argument("--dir", help=dir_help)
    check.set_defaults(func=_cmd_validate)

    table = policy.add_parser("test", help="run a table of requests and expected decisions (TOML)")
    table.add_argument("table")
    table.add_argument("--dir", help=dir_help)
    table.set_defaults(func=_cmd_test)

    one = policy.add_parser("explain", help="one request's decision and the policies that made it")
    one.add_argument("--tenant", required=True)
    one.add_argument("--subject", default="someone")
    one.add_argument("--issuer", default="", help="who vouches for the subject (a policy names users by it)")
    one.add_argument("--groups", default="", help="comma-separated")
    one.add_argument("--scopes", default="", help='space-separated, e.g. "docs:read docs:write"')
    one.add_argument("--tool", required=True)
    one.add_argument("--document", help="the document name the call names")
    one.add_argument("--content-bytes", type=int)
    one.add_argument("--request-bytes", type=int)
    one.add_argument("--protocol")
    one.add_argument("--at", type=int, help="unix seconds (default: now)")
    one.add_argument("--self-approval", action="store_true", help="approve: the approver is the requester")
    one.add_argument("--with", dest="with_files", action="append", default=[], help="another .cedar file")
    one.add_argument("--dir", help=dir_help)
    one.set_defaults(func=_cmd_explain)
