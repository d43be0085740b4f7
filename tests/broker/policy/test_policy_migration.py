"""Today's TOML keeps working: compiled to Cedar, it gives exactly the decisions the TOML path
gave (`toml_permits`: the tool's scope held and the tool in the tenant's `tools.allowed`),
over a generated table of policy folders and requests."""

from __future__ import annotations

import itertools
import random
import shutil
from pathlib import Path

import pytest

from broker.policy import APPROVE, Call, Policies, PolicyEngine, toml_may_approve, toml_permits
from broker.testing import ROOT
from broker.types import OAuthScope, Principal
from server.contracts import TOOL_NAMES

SCOPE_SETS = [frozenset(c) for n in range(4) for c in itertools.combinations(OAuthScope, n)]


def _allowed(rng: random.Random) -> str:
    tools = [t for t in TOOL_NAMES if rng.random() < 0.6]
    return "[tools]\nallowed = [" + ", ".join(f'"{t}"' for t in tools) + "]\n"


def generated_folder(tmp_path: Path, seed: int) -> Path:
    """A policies folder: a default.toml with a random tool list (or none), tenants that
    inherit it or override it (also with an empty list), with limits beside."""
    rng = random.Random(seed)
    folder = tmp_path / f"policies-{seed}"
    (folder / "tenants").mkdir(parents=True)
    shutil.copy(ROOT / "policies" / "docbroker.cedarschema", folder)
    default = _allowed(rng) if rng.random() < 0.7 else ""
    (folder / "default.toml").write_text(default + "[limits]\nburst = 5\n")
    for n in range(rng.randint(1, 6)):
        text = _allowed(rng) if rng.random() < 0.5 else ""
        if rng.random() < 0.3:
            text += "[approvals]\nrequire_distinct_approver = true\n"
        (folder / "tenants" / f"t{seed}-{n}.toml").write_text(text)
    return folder


def test_require_distinct_approver_is_compiled(tmp_path: Path) -> None:
    folder = generated_folder(tmp_path, 0)
    (folder / "tenants" / "strict.toml").write_text("[approvals]\nrequire_distinct_approver = true\n")
    policies = Policies.load(folder)
    engine = PolicyEngine.load(folder, policies)
    approver = Principal("strict", "alice", frozenset(OAuthScope))
    assert engine.decide(Call(approver, APPROVE)).allowed
    refused = engine.decide(Call(approver, APPROVE, self_approval=True), check_request=True)
    assert not refused.allowed and refused.policy_ids == ("toml.tenants.strict.distinct_approver",)


@pytest.mark.parametrize("seed", range(12))
def test_compiled_toml_decides_as_the_toml_path(tmp_path: Path, seed: int) -> None:
    folder = generated_folder(tmp_path, seed)
    policies = Policies.load(folder)
    engine = PolicyEngine.load(folder, policies)
    compared = allowed = 0
    for tenant, scopes, tool, groups, document in itertools.product(
        policies.by_tenant, SCOPE_SETS, (*TOOL_NAMES, "other_tool"), (frozenset(), frozenset({"staff"})),
        (None, "hr-plan.md"),
    ):  # fmt: skip
        caller = Principal(tenant, "alice", scopes, groups)
        expected = toml_permits(scopes, policies.get(tenant), tool)
        got = engine.decide(Call(caller, tool, document=document), check_request=tool in TOOL_NAMES)
        assert got.allowed == expected, (tenant, sorted(scopes), tool, got.policy_ids)
        if got.allowed:
            assert got.policy_ids == (f"toml.tenants.{tenant}",)
        compared += 1
        allowed += expected
    assert compared >= 100 and 0 < allowed < compared  # both answers occur: the table can tell them apart
    refusals = set()
    for tenant, scopes, own, size in itertools.product(
        policies.by_tenant, SCOPE_SETS, (False, True), (None, 9000)
    ):
        caller = Principal(tenant, "alice", scopes)
        expected = toml_may_approve(scopes, policies.get(tenant), own)
        got = engine.decide(Call(caller, APPROVE, self_approval=own, content_bytes=size), check_request=True)
        assert got.allowed == expected, (tenant, sorted(scopes), own, got.policy_ids)
        refusals.add(got.policy_ids)


def test_the_shipped_folder_decides_as_before() -> None:
    policies = Policies.load(ROOT / "policies")
    engine = PolicyEngine.load(ROOT / "policies", policies)
    for scopes, tool in itertools.product(SCOPE_SETS, TOOL_NAMES):
        caller = Principal("demo", "dev-user", scopes)
        assert engine.decide(Call(caller, tool)).allowed == toml_permits(scopes, policies.get("demo"), tool)
