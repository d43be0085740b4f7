"""The policy set checked and asked offline (`docbroker policy validate|test|explain`).

Each loads a policies folder as the broker does at start-up (schema, *.cedar, default.toml and
tenants/ compiled) and returns names and decisions only; the command line (broker/cli/policy.py)
chooses the folder as `serve` does and prints them.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from broker.policy.cedar import Decision, PolicyEngine
from broker.policy.table import Case, call_of, load_table
from broker.policy.tenants import Policies, PolicyError
from server.contracts import TENANT_RE


def load_set(folder: Path, extra: Iterable[Path] = (), tenants: Iterable[str] = ()) -> PolicyEngine:
    """The set as `serve` loads it, with `extra` .cedar files (and, for a table, files for its
    tenants); raises PolicyError."""
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


@dataclass(frozen=True)
class TableRun:
    """A table run against the set: how many cases, the ones whose decision differs, the set."""

    cases: int
    failed: list[tuple[Case, Decision]]
    set_hash: str


def run_table(folder: Path, table_file: Path) -> TableRun:
    """Every case of the table against the set; raises PolicyError (the table or the set)."""
    table = load_table(table_file)
    engine = load_set(folder, table.extra, table.tenants)
    results = [(case, engine.decide(case.call, check_request=True)) for case in table.cases]
    failed = [(case, decision) for case, decision in results if not _as_expected(case, decision)]
    return TableRun(len(results), failed, engine.hash)


def _as_expected(case: Case, decision: Decision) -> bool:
    return (
        decision.allowed == case.allow
        and (case.policies is None or case.policies == decision.policy_ids)
        and (case.approvers is None or case.approvers == decision.approvers)
    )


def explain(folder: Path, extra: list[Path], request: dict[str, Any]) -> dict[str, Any]:
    """One request's decision and the policies that determined it, with their files; raises
    PolicyError."""
    engine = load_set(folder, extra)
    decision = engine.decide(call_of(request, "request"), check_request=True)
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
    return verdict
