"""`docbroker policy validate|test|explain`: the policy set, checked and asked, offline.

Each loads a policies folder as the broker does at start-up (schema, *.cedar, default.toml and
tenants/ compiled) and writes names and decisions only; the command line (broker/cli/policy.py)
chooses the folder as `serve` does.
"""

from __future__ import annotations

import json
import shutil
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
        "default_deny": not decision.allowed and not decision.policy_ids and not decision.errored,
        "policy_set": decision.policy_hash,
    }
    if decision.errored:  # refused as `serve` refuses: a policy's evaluation failed
        verdict["evaluation_error"] = True
    if decision.allowed and request.get("tool") == "approve":
        verdict["approvers"] = decision.approvers  # distinct approvers the report needs
    out.write(json.dumps(verdict, indent=2) + "\n")
    return 0
