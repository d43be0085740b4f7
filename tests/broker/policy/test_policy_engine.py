"""The policy set at load: the schema shipped in policies/, every policy validated against it,
ids the audit log can carry; and the per-tenant slices deciding exactly as the whole set."""

from __future__ import annotations

import itertools
import json
import re
import shutil
from pathlib import Path
from typing import Any

import cedarpy
import pytest

from broker.policy import Call, Policies, PolicyEngine, PolicyError
from broker.policy.compile import ACTIONS
from broker.testing import ROOT
from broker.types import OAuthScope, Principal


def folder_with(tmp_path: Path, cedar: dict[str, str], tenants: dict[str, str] | None = None) -> Path:
    folder = tmp_path / "policies"
    folder.mkdir(parents=True)
    shutil.copy(ROOT / "policies" / "docbroker.cedarschema", folder)
    (folder / "tenants").mkdir()
    for tenant, text in (tenants or {"acme": "", "globex": ""}).items():
        (folder / "tenants" / f"{tenant}.toml").write_text(text)
    for name, text in cedar.items():
        (folder / name).write_text(text)
    return folder


def load(folder: Path) -> PolicyEngine:
    return PolicyEngine.load(folder, Policies.load(folder))


def test_the_shipped_policies_validate() -> None:
    engine = load(ROOT / "policies")
    assert "toml.tenants.demo" in engine.policy_ids and len(engine.hash) == 64


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('@id("a")\npermit (principal, action, resource) when { context.nope };', "does not validate"),
        ('@id("a")\npermit (principal == Docbroker::No::"x", action, resource);', "does not validate"),
        ("permit (principal, action, resource);", "every policy needs an @id"),
        ('@id("a b")\npermit (principal, action, resource);', "every policy needs an @id"),
        ('@id("builtin.mine")\npermit (principal, action, resource);', "are reserved"),
        ('@id("toml.tenants.acme")\npermit (principal, action, resource);', "are reserved"),
        ('@id("a")\npermit (principal == ?principal, action, resource);', "templates are not supported"),
        ("permit (principal, action, resource", "does not parse as Cedar"),
    ],
)
def test_a_bad_policy_is_refused_in_one_line(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(PolicyError) as caught:
        load(folder_with(tmp_path, {"bad.cedar": text}))
    assert str(caught.value).startswith("bad.cedar: ") and message in str(caught.value)
    assert "\n" not in str(caught.value)


def test_ids_are_unique_across_files(tmp_path: Path) -> None:
    rule = '@id("same")\nforbid (principal, action, resource) when { context.hour == 3 };'
    with pytest.raises(PolicyError, match=r"b\.cedar: policy same: id already used in a\.cedar"):
        load(folder_with(tmp_path, {"a.cedar": rule, "b.cedar": rule}))


def test_a_broken_schema_refuses_the_load(tmp_path: Path) -> None:
    folder = folder_with(tmp_path, {})
    (folder / "docbroker.cedarschema").write_text("namespace Docbroker { entity }")
    with pytest.raises(PolicyError, match=r"docbroker\.cedarschema: not a valid Cedar schema"):
        load(folder)
    (folder / "docbroker.cedarschema").unlink()
    with pytest.raises(PolicyError, match=r"docbroker\.cedarschema: cannot be read"):
        load(folder)


def test_the_hash_names_the_set(tmp_path: Path) -> None:
    one = load(folder_with(tmp_path / "1", {}))
    same = load(folder_with(tmp_path / "2", {}))
    rule = '@id("night")\nforbid (principal, action, resource) when { context.hour < 6 };'
    more = load(folder_with(tmp_path / "3", {"night.cedar": rule}))
    other_toml = load(folder_with(tmp_path / "4", {}, {"acme": '[tools]\nallowed = ["read_document"]\n'}))
    assert one.hash == same.hash
    assert len({one.hash, more.hash, other_toml.hash}) == 3


SCOPED = """
@id("acme.no_save") forbid (principal in Docbroker::Tenant::"acme",
  action == Docbroker::Action::"save_report", resource);
@id("globex.legal_reads") permit (principal in Docbroker::Group::"legal",
  action == Docbroker::Action::"read_document", resource in Docbroker::Tenant::"globex");
@id("carol.only") forbid (principal == Docbroker::User::"globex/carol#https://idp.example", action, resource)
  unless { context.hour < 12 };
@id("tool.scoped") forbid (principal, action, resource == Docbroker::Tool::"acme/search_documents")
  when { context.request_bytes > 500 };
@id("nowhere") permit (principal in Docbroker::Tenant::"acme", action,
  resource in Docbroker::Tenant::"globex");
@id("everyone.hr") forbid (principal in Docbroker::Group::"contractors", action, resource)
  when { context has document && context.document like "hr-*" };
@id("group.calls") permit (principal in Docbroker::Group::"legal",
  action in [Docbroker::Action::"tools/call"], resource) when { context.weekday < 5 };
@id("read.or.search") forbid (principal in Docbroker::Group::"contractors",
  action in [Docbroker::Action::"read_document", Docbroker::Action::"search_documents"], resource)
  when { context.request_bytes > 800 && context.unix > 1000 };
@id("big.two") @approvers("2") permit (principal, action == Docbroker::Action::"approve", resource)
  when { context has content_bytes && context.content_bytes > 500 };
@id("legal.not.own") forbid (principal in Docbroker::Group::"legal",
  action == Docbroker::Action::"approve", resource) when { context.self_approval };
@id("contractors.view") forbid (principal in Docbroker::Group::"contractors",
  action == Docbroker::Action::"view_approvals", resource) unless { context.scopes.contains("docs:read") };
@id("is.legal") permit (principal is Docbroker::User in Docbroker::Group::"legal",
  action == Docbroker::Action::"save_report", resource is Docbroker::Tool);
@id("dave.approvals") forbid (principal == Docbroker::User::"initech/dave#https://idp.example", action,
  resource is Docbroker::Approvals);
@id("sums") forbid (principal in Docbroker::Group::"legal", action == Docbroker::Action::"search_documents",
  resource) when { context.request_bytes + 100 > 1000 };
@id("at.cut") forbid (principal, action == Docbroker::Action::"read_document",
  resource in Docbroker::Tenant::"initech") when { context.request_bytes == 800 };
@id("overflows") forbid (principal in Docbroker::Group::"legal", action == Docbroker::Action::"read_document",
  resource) when { context.request_bytes * 20000000000000000 > 100000000000000000 };
@id("permit.overflows") permit (principal in Docbroker::Group::"contractors",
  action in [Docbroker::Action::"tools/call"], resource in Docbroker::Tenant::"acme")
  when { context.request_bytes * 20000000000000000 > 0 };
"""


# No scope, one (the lean slice for some tools, the whole for others), every scope.
SCOPINGS: tuple[frozenset[OAuthScope], ...] = (
    frozenset(), frozenset({OAuthScope.DOCS_READ}), frozenset(OAuthScope),
)  # fmt: skip


def test_slices_decide_exactly_as_the_whole_set(tmp_path: Path) -> None:
    """Slicing by tenant and tool, narrowing to the policies a caller's scope can match, the
    context cut to what they read, and decisions remembered by where numbers fall among the
    constants they are compared with are optimisations only: over a grid of requests (sizes at,
    between and beside the constants; one compared through arithmetic, some overflowing), the
    engine's decision and determining ids — checked, first asked, and asked again — equal
    Cedar's over the whole, unsliced set with the whole context, where a policy whose evaluation
    fails refuses, named (no slice leaves it out, no remembered decision forgets it)."""
    tenants = {"acme": "", "globex": '[tools]\nallowed = ["search_documents"]\n', "initech": ""}
    folder = folder_with(tmp_path, {"scoped.cedar": SCOPED}, tenants)
    engine = load(folder)
    texts = [p.read_text() for p in sorted(folder.glob("*.cedar"))]
    from broker.policy.compile import builtin_policies, tenant_policies

    compiled = [builtin_policies(), tenant_policies(Policies.load(folder))]
    # Keyed by @id, so Cedar's reasons and errors name policies as the audit log does.
    parsed = json.loads(cedarpy.policies_to_json_str("\n".join([*compiled, *texts])))
    by_id = {est["annotations"]["id"]: est for est in parsed["staticPolicies"].values()}
    whole = cedarpy.PolicySet.from_json_str(
        json.dumps({"staticPolicies": by_id, "templates": {}, "templateLinks": []})
    )
    erring = 0
    checked = 0
    groupings: tuple[frozenset[str], ...] = (frozenset(), frozenset({"legal"}), frozenset({"contractors"}))
    for tenant, subject, groups, scopes, tool, document, size, at in itertools.product(
        ("acme", "globex", "initech"), ("carol", "dave"), groupings, SCOPINGS,
        ACTIONS, (None, "hr-a.md", "b.md"), (10, 500, 501, 800, 900, 901), (0, 13 * 3600, 6 * 86400),
    ):  # fmt: skip
        caller = Principal(tenant, subject, scopes, groups, issuer="https://idp.example")
        # Approving: its requester's own report when the document is named, and its size.
        call = Call(caller, tool, request_bytes=size, document=document, at=at,
                    content_bytes=size, self_approval=document is not None)  # fmt: skip
        got = engine.decide(call, check_request=True)
        fast, again = engine.decide(call), engine.decide(call)
        assert got == fast == again, (call, got, fast)
        request = engine.request(call)
        entities = engine._entities_of(call.principal)
        result = cedarpy.is_authorized(request, whole, entities)
        erred = tuple(
            sorted(
                re.findall(r"error while evaluating policy `([^`]*)`", " ".join(result.diagnostics.errors))
            )
        )
        if erred:  # fail closed: refused, naming the policies that erred
            assert (got.allowed, got.policy_ids, got.errored) == (False, erred, True), (call, got)
            erring += 1
        else:
            ids = tuple(sorted(result.diagnostics.reasons))
            assert (got.allowed, got.policy_ids, got.errored) == (result.allowed, ids, False), (call, got)
        checked += 1
    assert checked > 12000 and erring > 1000


OVERFLOW = """
@id("ops.big_saves") forbid (principal, action == Docbroker::Action::"save_report", resource)
  when { context has content_bytes && context.content_bytes * 1000000000000000 > 5000000000000000000 };
"""


def test_an_evaluation_error_refuses_naming_the_policy_that_erred(tmp_path: Path) -> None:
    """Cedar skips a policy whose evaluation fails and decides without it: this forbid of
    saves over 5000 bytes overflows past 9223 bytes, and would stop refusing. Any error
    refuses instead, named — when checked (`policy explain`), when asked (`serve`), and when
    asked again (a remembered decision) — and a permit that errs allows nothing either."""
    permit = (
        '@id("ops.erring_permit") permit (principal in Docbroker::Group::"ops",\n'
        '  action in [Docbroker::Action::"tools/call"], resource)\n'
        "  when { context.request_bytes * 1000000000000000 > 0 };\n"
    )
    engine = load(folder_with(tmp_path, {"big.cedar": OVERFLOW, "ops.cedar": permit}))
    writer = Principal("acme", "carol", frozenset({OAuthScope.DOCS_WRITE}))
    for size, allowed, ids, errored in (
        (100, True, ("toml.tenants.acme",), False),
        (6000, False, ("ops.big_saves",), False),
        (10_000, False, ("ops.big_saves",), True),
    ):
        call = Call(writer, "save_report", document="q3.md", content_bytes=size)
        for decision in (engine.decide(call, check_request=True), engine.decide(call), engine.decide(call)):
            assert (decision.allowed, decision.policy_ids, decision.errored) == (allowed, ids, errored)
    reader = Principal("acme", "olga", frozenset({OAuthScope.DOCS_READ}), frozenset({"ops"}))
    small, huge = (Call(reader, "read_document", document="a.md", request_bytes=n) for n in (10, 10_000))
    assert engine.decide(small).allowed
    refused = engine.decide(huge)
    assert (refused.allowed, refused.policy_ids, refused.errored) == (False, ("ops.erring_permit",), True)
    assert engine.decide(huge, check_request=True) == refused


def test_unknown_tools_are_refused_unasked(tmp_path: Path) -> None:
    engine = load(folder_with(tmp_path, {}))
    caller = Principal("acme", "carol", frozenset(OAuthScope))
    assert engine.decide(Call(caller, "read_document")).allowed
    assert not engine.decide(Call(caller, "delete_everything")).allowed


def test_the_decision_is_json_of_names_only(tmp_path: Path) -> None:
    engine = load(folder_with(tmp_path, {}))
    decision = engine.decide(Call(Principal("acme", "carol", frozenset()), "read_document", document="x.md"))
    assert json.dumps([decision.allowed, decision.policy_ids]) == '[false, ["builtin.scope.docs_read"]]'


APPROVE_RULE = (
    '@id("two") @approvers("{n}") {effect} (principal, action == Docbroker::Action::"approve", resource)\n'
    "when {{ context has content_bytes && context.content_bytes > 100 }};\n"
)


@pytest.mark.parametrize(
    ("n", "effect"), [("0", "permit"), ("10", "permit"), ("two", "permit"), ("2", "forbid")]
)
def test_approvers_is_a_digit_on_a_permit(tmp_path: Path, n: str, effect: str) -> None:
    with pytest.raises(
        PolicyError, match=r'^bad\.cedar: policy two: @approvers\("N"\) takes a digit 1-9, on a permit$'
    ):
        load(folder_with(tmp_path, {"bad.cedar": APPROVE_RULE.format(n=n, effect=effect)}))


def test_the_count_is_the_largest_of_the_permits_that_allowed(tmp_path: Path) -> None:
    three = (
        '@id("three") @approvers("3") permit (principal in Docbroker::Group::"board", action, resource);\n'
    )
    engine = load(folder_with(tmp_path, {"rules.cedar": APPROVE_RULE.format(n=2, effect="permit") + three}))
    scopes = frozenset({OAuthScope.REPORTS_APPROVE})

    def count(size: int, groups: frozenset[str] = frozenset(), scoped: frozenset[OAuthScope] = scopes) -> Any:
        decision = engine.decide(
            Call(Principal("acme", "carol", scoped, groups), "approve", content_bytes=size)
        )
        return decision.allowed, decision.approvers

    assert count(100) == (True, 1)  # only the tenant file's permit: one approver
    assert count(101) == (True, 2)
    assert count(101, frozenset({"board"})) == (True, 3)
    assert count(5000, frozenset({"board"}), frozenset()) == (False, 1)  # refused: no count
