"""`docbroker policy validate|test|explain`: the policy set, checked and asked, offline.

Each reads the policies folder (`--dir`, default `policies`) as the broker would at start-up
(schema, *.cedar, default.toml and tenants/ compiled), and prints names and decisions only.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any, TextIO

from broker.policy.cedar import PolicyEngine
from broker.policy.table import call_of, load_table
from broker.policy.tenants import Policies, PolicyError
from server.contracts import TENANT_RE


def _engine(folder: Path, extra: Iterable[Path] = (), tenants: Iterable[str] = ()) -> PolicyEngine:
    added = list(tenants)
    if not added:
        return PolicyEngine.load(folder, Policies.load(folder), extra)
    # A copy of the folder with the tenants' (empty) files: loaded exactly as serve would.
    with tempfile.TemporaryDirectory() as copy:
        where = Path(copy) / "policies"
        shutil.copytree(folder, where, ignore=shutil.ignore_patterns("examples"))
        (where / "tenants").mkdir(exist_ok=True)
        for tenant in added:
            if not TENANT_RE.fullmatch(tenant):
                raise PolicyError(f"tenants: {tenant!r} is not a tenant id (DNS label)")
            (where / "tenants" / f"{tenant}.toml").touch()
        return PolicyEngine.load(where, Policies.load(where), extra)


def validate(folder: Path, extra: list[Path], out: TextIO) -> int:
    """Load and validate the set; one line either way."""
    try:
        engine = _engine(folder, extra)
    except PolicyError as exc:
        out.write(f"invalid: {exc}\n")
        return 1
    out.write(f"ok: {len(engine.policy_ids)} policies, set {engine.hash}\n")
    return 0


def run_table(folder: Path, table_file: Path, out: TextIO) -> int:
    """Every case of the table against the set: one line per failing case, then a summary."""
    try:
        table = load_table(table_file)
        engine = _engine(folder, table.extra, table.tenants)
        results = [(case, engine.decide(case.call, check_request=True)) for case in table.cases]
    except PolicyError as exc:
        out.write(f"invalid: {exc}\n")
        return 1
    failed = 0
    for case, decision in results:
        ok = (
            decision.allowed == case.allow
            and (case.policies is None or case.policies == decision.policy_ids)
            and (case.approvers is None or case.approvers == decision.approvers)
        )
        if not ok:
            failed += 1
            got = "allow" if decision.allowed else "deny"
            ids = list(decision.policy_ids)
            out.write(f"FAIL {case.name}: got {got} by {ids}, approvers {decision.approvers}\n")
    out.write(f"{len(results) - failed} passed, {failed} failed ({table_file.name}, set {engine.hash})\n")
    return 1 if failed else 0


def explain(folder: Path, extra: list[Path], request: dict[str, Any], out: TextIO) -> int:
    """One request's decision and the policies that determined it, with their files."""
    try:
        engine = _engine(folder, extra)
        decision = engine.decide(call_of(request, "request"), check_request=True)
    except PolicyError as exc:
        out.write(f"invalid: {exc}\n")
        return 1
    verdict: dict[str, Any] = {
        "decision": "allow" if decision.allowed else "deny",
        "determined_by": [{"id": pid, "file": engine.sources[pid]} for pid in decision.policy_ids],
        "default_deny": not decision.allowed and not decision.policy_ids,
        "policy_set": decision.policy_hash,
    }
    if decision.allowed and request.get("tool") == "approve":
        verdict["approvers"] = decision.approvers  # distinct approvers the report needs
    out.write(json.dumps(verdict, indent=2) + "\n")
    return 0


# -- the command line (`docbroker policy ...`); broker/cli.py only adds these -----------------


def _folder(args: argparse.Namespace) -> Path:
    return Path(args.dir)


def _cmd_validate(args: argparse.Namespace) -> int:
    return validate(_folder(args), [Path(f) for f in args.files], sys.stdout)


def _cmd_test(args: argparse.Namespace) -> int:
    return run_table(_folder(args), Path(args.table), sys.stdout)


def _cmd_explain(args: argparse.Namespace) -> int:
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
    return explain(_folder(args), [Path(f) for f in args.with_files], request, sys.stdout)


def add_policy_commands(sub: Any) -> None:
    """`sub`: the top-level parser's subparsers (argparse's private _SubParsersAction)."""
    policy = sub.add_parser("policy", help="the Cedar policy set: validate, test, explain").add_subparsers(
        dest="policy_command", required=True
    )
    dir_help = "the policies folder (default: policies)"
    check = policy.add_parser("validate", help="load and validate the set as `serve` would")
    check.add_argument("files", nargs="*", help="more .cedar files to load with it")
    check.add_argument("--dir", default="policies", help=dir_help)
    check.set_defaults(func=_cmd_validate)

    table = policy.add_parser("test", help="run a table of requests and expected decisions (TOML)")
    table.add_argument("table")
    table.add_argument("--dir", default="policies", help=dir_help)
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
    one.add_argument("--dir", default="policies", help=dir_help)
    one.set_defaults(func=_cmd_explain)
