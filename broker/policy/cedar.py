# Over 450 lines: the policy engine, its decision cache and per-caller slices, exact together.
"""The policy set: Cedar policies validated against the schema, and the decisions they give.

Loaded once at start-up from the policies folder:

    docbroker.cedarschema   the schema (required): every policy is validated against it
    *.cedar                 the operator's policies (optional), each with a unique `@id`
    default.toml, tenants/  compiled to Cedar (`broker.policy.compile`)

Anything that does not parse or validate refuses the load with one line naming the file and
the policy id (`PolicyError`); the request values a decision uses never appear in one.

Speed (bench/policy_decision.py): Cedar evaluates every policy of the set it is given, so the
set is sliced per tenant and tool — a policy whose scope names a tenant (`principal in
Docbroker::Tenant::"acme"`, `resource in …`) can match only that tenant's requests (a user and
a tool are in their own tenant and no other entity is), one whose action names other tools
none of this tool's calls — and each slice is narrowed per caller to the policies whose
principal and resource constraints the caller's own entities can satisfy (`principal in
Docbroker::Group::"contractors"` only for a member): leaving out a policy whose scope cannot
match changes no decision. The entities of a caller (its tenant, groups, user and the
tenant's tools) are built once per principal and kept in a bounded table. The context holds
only the attributes some policy of the caller's set reads (an attribute no policy reads
cannot change a decision), and a decision is remembered by exactly those inputs — principal,
tool and that context — so a repeated decision is a lookup. A number the policies only
compare with constants (`context.request_bytes > 900000`, `context.hour < 6`) is remembered
by where it falls among those constants, not by its value: every value between two of them
compares alike, so requests of varying sizes share their decisions. A new decision is
evaluated by Cedar; its cost is mostly the binding's own (a request into Rust and its answer
back: bench/policy_decision.py measures it beside an empty set).
"""

from __future__ import annotations

import bisect
import hashlib
import json
import re
import time
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import cedarpy

from broker.policy.compile import (
    ACTION_SCOPE,
    ACTIONS,
    APPROVAL_ACTIONS,
    APPROVE,
    RESERVED_PREFIXES,
    builtin_policies,
    tenant_policies,
)
from broker.policy.tenants import Policies, PolicyError
from broker.types import OAuthScope, Principal
from server.contracts import TOOL_NAMES

SCHEMA_FILE = "docbroker.cedarschema"
POLICY_ID_RE = re.compile(r"[A-Za-z0-9_.:-]{1,128}")  # what the audit log accepts as an id
APPROVERS_RE = re.compile(r"[1-9]")  # `@approvers("N")`: distinct approvers a report needs
ENTITY_CACHE_SIZE = 4096
DECISION_CACHE_SIZE = 65536
NARROWED_CACHE_SIZE = 16384
_TIME_ATTRIBUTES = frozenset({"unix", "hour", "weekday"})
_NS = "Docbroker"
_TENANT, _USER, _GROUP, _TOOL = f"{_NS}::Tenant", f"{_NS}::User", f"{_NS}::Group", f"{_NS}::Tool"
_APPROVALS = f"{_NS}::Approvals"
_OWN_TENANT = "builtin.own_tenant"
# One encoder: json.dumps with any argument builds a new one per call (a decision's context
# is encoded on every call, bench/policy_decision.py).
_COMPACT = json.JSONEncoder(separators=(",", ":"))
_CALL_ONLY = frozenset({"protocol", "request_bytes", "document"})  # not in an approval's context
_ACTION = f"{_NS}::Action"
_COMPARISONS = frozenset({"<", "<=", ">", ">=", "==", "!="})
# How Cedar reports a policy whose evaluation failed (its id is ours: the set is keyed by @id).
_EVALUATION_ERROR = re.compile(r"error while evaluating policy `([^`]*)`")


@dataclass(frozen=True)
class Call:
    """One request, as the policy sees it. `document` and the sizes are values of the request:
    they may be decided on and are never logged."""

    principal: Principal
    tool: str  # the tool called, or `approve` (an approver's decision)
    protocol: str | None = None
    request_bytes: int = 0
    document: str | None = None
    content_bytes: int | None = None
    at: float | None = None  # unix seconds; None: now
    self_approval: bool = False  # `approve`: the approver is the report's requester


@dataclass(frozen=True)
class Decision:
    allowed: bool
    # The determining policies: the permits that allowed, or the forbids that denied (empty
    # when nothing permitted: Cedar's default deny), or the policies whose evaluation failed.
    policy_ids: tuple[str, ...]
    policy_hash: str
    # `approve`: how many distinct approvers the report needs, the largest `@approvers("N")`
    # of the permits that allowed (1 when none says): the two-person rule (docs/policy.md).
    approvers: int = 1
    # Refused because a policy's evaluation failed (an overflow, a bad extension value): Cedar
    # skips such a policy and decides without it, so a forbid that errs would stop refusing.
    # Any error refuses instead (fail closed), naming the policies that erred.
    errored: bool = False


class Decider(Protocol):
    """What asks the policy: an engine, or the live set (`broker.policy.live`)."""

    def decide(self, call: Call, *, check_request: bool = False) -> Decision: ...

    @property
    def hash(self) -> str:
        """The set in force's hash."""
        ...


@dataclass(frozen=True)
class Source:
    """One file's policies, as text, and the name it is reported by."""

    name: str
    text: str


def _one_line(text: str, limit: int = 200) -> str:
    first = " ".join(str(text).split())
    return first if len(first) <= limit else first[: limit - 1] + "…"


def _context_reads(node: Any, reads: set[str]) -> bool:
    """Add the context attributes an expression reads (`context.x`, `context has x`) to
    `reads`; False when it uses `context` any other way (then it may read everything)."""
    if isinstance(node, dict):
        for op in (".", "has"):
            inner = node.get(op)
            if isinstance(inner, dict) and inner.get("left") == {"Var": "context"}:
                reads.add(str(inner.get("attr")))
                return True
        if node == {"Var": "context"}:
            return False
        return all(_context_reads(value, reads) for value in node.values())
    if isinstance(node, list):
        return all(_context_reads(item, reads) for item in node)
    return True


Ests = dict[str, dict[str, Any]]  # policy id → its Cedar JSON (EST)
_Uid = tuple[str, str]  # (entity type, id)


@dataclass(frozen=True)
class _Slice:
    """One tenant's part of the set for one tool.

    `lean`: the same without the built-in forbids that cannot apply to a caller holding
    `scope` (the tool's `builtin.scope.*`, satisfied only without it) nor to any request the
    engine builds (`builtin.own_tenant`: the resource is always the caller's tenant's). For
    such a caller it decides exactly as `policies` — a forbid that is not satisfied neither
    denies nor is named — with one policy or two fewer evaluated and, unless another policy
    reads them, no scopes in the context (the dearest attribute to build and to pass)."""

    policies: Ests
    lean: Ests
    scope: OAuthScope | None


@dataclass(frozen=True)
class _Compiled:
    """A Cedar policy set, the context attributes its policies read (None: any), and for the
    numbers among them that the policies only compare with constants, those constants."""

    policies: cedarpy.PolicySet
    reads: frozenset[str] | None
    cuts: dict[str, tuple[int, ...]]


def _context_attr(node: Any) -> str | None:
    """`x` when the expression is `context.x`."""
    inner = node.get(".") if isinstance(node, dict) else None
    if isinstance(inner, dict) and inner.get("left") == {"Var": "context"}:
        return str(inner.get("attr"))
    return None


def _compared(node: Any, cuts: dict[str, set[int]], loose: set[str]) -> None:
    """Collect, per context attribute, the whole numbers it is compared with (`context.x > 5`),
    and in `loose` the attributes used any other way (`context.x + 1`, `context.x == context.y`)."""
    if isinstance(node, list):
        for item in node:
            _compared(item, cuts, loose)
        return
    if not isinstance(node, dict):
        return
    attr = _context_attr(node)
    if attr is not None:
        loose.add(attr)
        return
    for op, operands in node.items():
        if op in _COMPARISONS and isinstance(operands, dict):
            left, right = operands.get("left"), operands.get("right")
            for side, other in ((left, right), (right, left)):
                attr = _context_attr(side)
                constant = other.get("Value") if isinstance(other, dict) else None
                if attr is not None and type(constant) is int:
                    cuts.setdefault(attr, set()).add(constant)
                    _compared(other, cuts, loose)
                    break
            else:
                _compared(operands, cuts, loose)
        else:
            _compared(operands, cuts, loose)


def _bucket(value: Any, cuts: tuple[int, ...] | None) -> Any:
    """What of a context value a decision can depend on: for a number the policies only
    compare with constants, where it falls among them — every value strictly between two
    constants compares alike — and otherwise the value itself (lists made hashable)."""
    if cuts is not None and type(value) is int:
        return (bisect.bisect_left(cuts, value), value in cuts)
    return tuple(value) if isinstance(value, list) else value


def _compile(policies: Ests) -> _Compiled:
    doc = {"staticPolicies": policies, "templates": {}, "templateLinks": []}
    reads: set[str] = set()
    conditions = [est.get("conditions", []) for est in policies.values()]
    bounded = all(_context_reads(condition, reads) for condition in conditions)
    cuts: dict[str, set[int]] = {}
    loose: set[str] = set()
    _compared(conditions, cuts, loose)
    exact = {attr: tuple(sorted(values)) for attr, values in cuts.items() if attr not in loose}
    policy_set = cedarpy.PolicySet.from_json_str(json.dumps(doc))
    return _Compiled(policy_set, frozenset(reads), exact) if bounded else _Compiled(policy_set, None, {})


def _can_match(scope: dict[str, Any], uid: _Uid, ancestors: frozenset[_Uid]) -> bool:
    """Whether a principal or resource constraint can hold for the entity `uid`, whose
    ancestors in the entities the engine builds are `ancestors` (when unsure: yes)."""
    op = scope.get("op")
    if op == "All":
        return True
    if op == "is":
        if scope.get("entity_type") != uid[0]:
            return False
        within = scope.get("in")
        if within is None:
            return True
        op, scope = "in", within
    entity = scope.get("entity")
    if op not in ("==", "in") or not isinstance(entity, dict):
        return True  # a template slot, or a form this engine does not know: keep it
    named = (entity.get("type"), entity.get("id"))
    return named == uid or (op == "in" and named in ancestors)


def _for_tool(scope: dict[str, Any], tool: str) -> bool:
    """Whether a policy's action constraint can match a call of `tool` (when unsure: yes)."""
    names = {tool, "tools/call"}  # the tool's action, and the group it is in
    op = scope.get("op")
    if op == "==":
        return (scope.get("entity") or {}).get("id") == tool
    if op == "in":
        listed = scope.get("entities") if "entities" in scope else [scope.get("entity")]
        return any(isinstance(e, dict) and e.get("id") in names for e in listed or [])
    return True


def _names_a_user_without_issuer(text: str) -> bool:
    """Whether a policy file names a user by an id without "#<issuer>" (a person is their id at
    their issuer: `Principal.entity_id`). Text that does not parse is the constructor's to refuse."""
    try:
        parsed = json.loads(cedarpy.policies_to_json_str(text))
    except ValueError:
        return False

    def walk(value: Any) -> bool:
        if isinstance(value, dict):
            named = value.get("type") == _USER and isinstance(value.get("id"), str)
            return (named and "#" not in value["id"]) or any(walk(v) for v in value.values())
        return isinstance(value, list) and any(walk(v) for v in value)

    return walk(parsed)


def _tenant_of(scope: dict[str, Any], entity_types: tuple[str, ...]) -> str | None:
    """The tenant a policy's principal or resource constraint confines it to, if any."""
    op = scope.get("op")
    entity = scope.get("entity") if op in ("==", "in") else (scope.get("in") or {}).get("entity")
    if not isinstance(entity, dict):
        return None
    kind, ident = entity.get("type"), entity.get("id")
    if not isinstance(ident, str):
        return None
    if kind == _TENANT:
        return ident
    if kind in entity_types and op == "==" and "/" in ident:
        return ident.split("/", 1)[0]
    return None


class PolicyEngine:
    """A validated policy set and its decisions. Immutable once built."""

    def __init__(self, schema_text: str, sources: Iterable[Source]) -> None:
        try:
            self._schema = cedarpy.Schema.from_str(schema_text)
        except ValueError as exc:
            raise PolicyError(f"{SCHEMA_FILE}: not a valid Cedar schema ({_one_line(str(exc))})") from None
        self._policies: dict[str, dict[str, Any]] = {}
        self.sources: dict[str, str] = {}  # policy id → the file it came from
        self._approvers: dict[str, int] = {}  # policy id → its `@approvers`, where it has one
        for source in sources:
            self._add(source)
        canonical = json.dumps(
            {"schema": schema_text, "policies": self._policies}, sort_keys=True, separators=(",", ":")
        )
        self.hash = hashlib.sha256(canonical.encode()).hexdigest()
        self._global: dict[str, dict[str, Any]] = {}
        self._scoped: dict[str, dict[str, dict[str, Any]]] = {}
        for pid, est in self._policies.items():
            tenants = {
                _tenant_of(est["principal"], (_USER,)),
                _tenant_of(est["resource"], (_TOOL, _APPROVALS)),
            } - {None}
            if not tenants:
                self._global[pid] = est
            elif len(tenants) == 1:
                self._scoped.setdefault(str(tenants.pop()), {})[pid] = est
            # Two different tenants: the policy can match no request; it is kept in the hash only.
        self._slices: dict[tuple[str, str], _Slice] = {}
        # A caller's narrowed slice, and the compiled sets by their policy ids (callers alike
        # share one): both bounded, like every table a caller can grow.
        self._narrowed: OrderedDict[tuple[Principal, str, bool], _Compiled] = OrderedDict()
        self._compiled: dict[frozenset[str], _Compiled] = {}
        self._entities: OrderedDict[Principal, cedarpy.Entities] = OrderedDict()
        self._decisions: dict[tuple[Principal, str, tuple[tuple[str, Any], ...]], Decision] = {}

    @classmethod
    def load(cls, folder: Path, tenants: Policies, extra: Iterable[Path] = ()) -> PolicyEngine:
        """The folder's set; `extra`: more .cedar files (`docbroker policy test|explain`)."""
        schema_file = folder / SCHEMA_FILE
        try:
            schema_text = schema_file.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise PolicyError(f"{SCHEMA_FILE}: cannot be read ({type(exc).__name__})") from None
        sources = [
            Source("builtin", builtin_policies()),
            Source("default.toml+tenants/", tenant_policies(tenants)),
        ]
        for path in [*sorted(folder.glob("*.cedar")), *extra]:
            try:
                sources.append(Source(path.name, path.read_text(encoding="utf-8")))
            except (OSError, UnicodeDecodeError) as exc:
                raise PolicyError(f"{path.name}: cannot be read ({type(exc).__name__})") from None
            if _names_a_user_without_issuer(sources[-1].text):
                # Such a policy would match nobody: a forbid naming someone would silently not hold.
                raise PolicyError(
                    f'{path.name}: names a {_USER} without its issuer (write "<tenant>/<id>#<issuer>")'
                )
        return cls(schema_text, sources)

    @property
    def policy_ids(self) -> list[str]:
        return sorted(self._policies)

    def _add(self, source: Source) -> None:
        try:
            parsed = json.loads(cedarpy.policies_to_json_str(source.text))
        except ValueError as exc:
            raise PolicyError(f"{source.name}: does not parse as Cedar ({_one_line(str(exc))})") from None
        if parsed.get("templates") or parsed.get("templateLinks"):
            raise PolicyError(f"{source.name}: templates are not supported, only static policies")
        result = cedarpy.validate_policies(source.text, self._schema)
        if not result.validation_passed:
            first = result.errors[0] if result.errors else None
            named = result.id_annotations_by_policy_id.get(first.policy_id) if first else None
            where = f"policy {named or (first.policy_id if first else '?')}"
            raise PolicyError(
                f"{source.name}: {where} does not validate against the schema "
                f"({_one_line(first.error if first else 'unknown error')})"
            )
        builtin = source.name in ("builtin", "default.toml+tenants/")
        for est in parsed.get("staticPolicies", {}).values():
            pid = est.get("annotations", {}).get("id")
            if not isinstance(pid, str) or not POLICY_ID_RE.fullmatch(pid):
                raise PolicyError(
                    f"{source.name}: every policy needs an @id of letters, digits and _.:- "
                    "(the audit log names policies by it)"
                )
            if not builtin and pid.startswith(RESERVED_PREFIXES):
                raise PolicyError(f"{source.name}: policy {pid}: ids starting builtin. or toml. are reserved")
            if pid in self._policies:
                raise PolicyError(f"{source.name}: policy {pid}: id already used in {self.sources[pid]}")
            approvers = est.get("annotations", {}).get("approvers")
            if approvers is not None:
                # Only a permit can allow an approval, so only a permit can ask for more of them.
                if est.get("effect") != "permit" or not APPROVERS_RE.fullmatch(str(approvers)):
                    raise PolicyError(
                        f'{source.name}: policy {pid}: @approvers("N") takes a digit 1-9, on a permit'
                    )
                self._approvers[pid] = int(approvers)
            self._policies[pid] = est
            self.sources[pid] = source.name

    def _slice(self, tenant: str, tool: str) -> _Slice:
        found = self._slices.get((tenant, tool))
        if found is None:
            candidates = {**self._global, **self._scoped.get(tenant, {})}
            policies = {pid: est for pid, est in candidates.items() if _for_tool(est["action"], tool)}
            scope = ACTION_SCOPE.get(tool)
            unneeded = {_OWN_TENANT, f"builtin.scope.{scope.value.replace(':', '_')}" if scope else ""}
            lean = {pid: est for pid, est in policies.items() if pid not in unneeded}
            found = self._slices[(tenant, tool)] = _Slice(policies, lean, scope)
        return found

    def _compiled_set(self, policies: Ests) -> _Compiled:
        key = frozenset(policies)
        found = self._compiled.get(key)
        if found is None:
            if len(self._compiled) >= NARROWED_CACHE_SIZE:
                self._compiled.clear()  # rebuilt on demand: a set is a few policies
            found = self._compiled[key] = _compile(policies)
        return found

    def _for_caller(self, call: Call, piece: _Slice, lean: bool) -> _Compiled:
        """The slice cut to the policies whose principal and resource constraints this
        caller's request can satisfy."""
        key = (call.principal, call.tool, lean)
        found = self._narrowed.get(key)
        if found is not None:
            self._narrowed.move_to_end(key)
            return found
        principal = call.principal
        tenant = (_TENANT, principal.tenant)
        user = (_USER, principal.entity_id)
        user_ancestors = frozenset({tenant, *((_GROUP, g) for g in principal.groups)})
        resource = (
            (_APPROVALS, f"{principal.tenant}/approvals")
            if call.tool in APPROVAL_ACTIONS
            else (_TOOL, f"{principal.tenant}/{call.tool}")
        )
        candidates = piece.lean if lean else piece.policies
        kept = {
            pid: est
            for pid, est in candidates.items()
            if _can_match(est["principal"], user, user_ancestors)
            and _can_match(est["resource"], resource, frozenset({tenant}))
        }
        found = self._narrowed[key] = self._compiled_set(kept)
        if len(self._narrowed) > NARROWED_CACHE_SIZE:
            self._narrowed.popitem(last=False)
        return found

    def _entities_of(self, principal: Principal) -> cedarpy.Entities:
        found = self._entities.get(principal)
        if found is not None:
            self._entities.move_to_end(principal)
            return found
        tenant = {"type": _TENANT, "id": principal.tenant}
        groups = [{"type": _GROUP, "id": g} for g in sorted(principal.groups)]
        entities: list[dict[str, Any]] = [{"uid": tenant, "attrs": {}, "parents": []}]
        entities += [{"uid": g, "attrs": {}, "parents": []} for g in groups]
        entities.append(
            {
                "uid": {"type": _USER, "id": principal.entity_id},
                "attrs": {"tenant": {"__entity": tenant}, "subject": principal.subject},
                "parents": [tenant, *groups],
            }
        )
        entities += [
            {
                "uid": {"type": _TOOL, "id": f"{principal.tenant}/{tool}"},
                "attrs": {"tenant": {"__entity": tenant}},
                "parents": [tenant],
            }
            for tool in TOOL_NAMES
        ]
        entities.append(
            {
                "uid": {"type": _APPROVALS, "id": f"{principal.tenant}/approvals"},
                "attrs": {"tenant": {"__entity": tenant}},
                "parents": [tenant],
            }
        )
        found = cedarpy.Entities.from_json_str(json.dumps(entities), self._schema)
        self._entities[principal] = found
        if len(self._entities) > ENTITY_CACHE_SIZE:
            self._entities.popitem(last=False)
        return found

    @staticmethod
    def context(call: Call, reads: frozenset[str] | None = None) -> str:
        """The call's context as Cedar JSON: every attribute, or only those in `reads`."""
        return _COMPACT.encode(PolicyEngine.context_values(call, reads))

    @staticmethod
    def context_values(call: Call, reads: frozenset[str] | None = None) -> dict[str, Any]:
        """The call's context: every attribute, or only those in `reads`."""
        approving = call.tool == APPROVE
        if call.tool in APPROVAL_ACTIONS:  # no request of its own; viewing: no report either
            every = (
                _TIME_ATTRIBUTES | {"scopes"} | ({"self_approval", "content_bytes"} if approving else set())
            )
            reads = (every if reads is None else reads & every) - _CALL_ONLY
        context: dict[str, Any] = {}
        if approving and reads is not None and "self_approval" in reads:
            context["self_approval"] = call.self_approval
        if reads is None or "scopes" in reads:
            context["scopes"] = sorted(s.value for s in call.principal.scopes)
        if reads is None or "protocol" in reads:
            context["protocol"] = call.protocol or ""
        if reads is None or "request_bytes" in reads:
            context["request_bytes"] = call.request_bytes
        if reads is None or not reads.isdisjoint(_TIME_ATTRIBUTES):
            # Only the parts read: a set that reads the hour keeps its decisions for an hour.
            at = time.time() if call.at is None else call.at
            moment = time.gmtime(at)
            if reads is None or "unix" in reads:
                context["unix"] = int(at)
            if reads is None or "hour" in reads:
                context["hour"] = moment.tm_hour
            if reads is None or "weekday" in reads:
                context["weekday"] = moment.tm_wday
        if call.document is not None and (reads is None or "document" in reads):
            context["document"] = call.document
        if call.content_bytes is not None and (reads is None or "content_bytes" in reads):
            context["content_bytes"] = call.content_bytes
        return context

    def request(self, call: Call, context: str | None = None) -> dict[str, Any]:
        """The Cedar request of a call (principal, action, resource, context: all of it unless
        given)."""
        principal = call.principal
        return {
            "principal": {"type": _USER, "id": principal.entity_id},
            "action": {"type": _ACTION, "id": call.tool},
            "resource": (
                {"type": _APPROVALS, "id": f"{principal.tenant}/approvals"}
                if call.tool in APPROVAL_ACTIONS
                else {"type": _TOOL, "id": f"{principal.tenant}/{call.tool}"}
            ),
            "context": self.context(call) if context is None else context,
        }

    def decide(self, call: Call, *, check_request: bool = False) -> Decision:
        """Cedar's decision on a call. A tool the schema does not know is refused unasked.
        `check_request`: the whole context, checked against the schema, nothing remembered
        (tests and `explain`)."""
        if call.tool not in ACTIONS:
            return Decision(False, (), self.hash)
        piece = self._slice(call.principal.tenant, call.tool)
        if check_request:
            whole = self._compiled_set(piece.policies).policies
            entities = self._entities_of(call.principal)
            result = cedarpy.is_authorized(self.request(call), whole, entities, self._schema)
            misfit = [e for e in result.diagnostics.errors if not _EVALUATION_ERROR.match(e)]
            if misfit:
                raise PolicyError(f"request does not conform ({_one_line(misfit[0])})")
            return self._decision(result)
        # The principal (its scopes) chooses the lean slice or the whole: it is in the key.
        lean = piece.scope is None or piece.scope in call.principal.scopes
        narrowed = self._for_caller(call, piece, lean)
        context = self.context_values(call, narrowed.reads)
        cuts = narrowed.cuts
        inputs = tuple((name, _bucket(value, cuts.get(name))) for name, value in context.items())
        key = (call.principal, call.tool, inputs)
        found = self._decisions.get(key)
        if found is not None:
            return found
        entities = self._entities_of(call.principal)
        request = self.request(call, _COMPACT.encode(context))
        result = cedarpy.is_authorized(request, narrowed.policies, entities)
        # Remembered, a refusal by an error is as exact as any decision: the inputs an
        # expression computes with (`context.x * 10`) are in the key by value, not by bucket.
        found = self._decision(result)
        if len(self._decisions) >= DECISION_CACHE_SIZE:
            del self._decisions[next(iter(self._decisions))]  # the oldest: a bounded table
        self._decisions[key] = found
        return found

    def _decision(self, result: cedarpy.AuthzResult) -> Decision:
        errors = result.diagnostics.errors
        if errors:  # fail closed: a policy Cedar could not evaluate might have refused
            erred = {m.group(1) for m in map(_EVALUATION_ERROR.match, errors) if m}
            return Decision(False, tuple(sorted(erred & self._policies.keys())), self.hash, errored=True)
        ids = tuple(sorted(result.diagnostics.reasons))
        approvers = max((self._approvers.get(pid, 1) for pid in ids), default=1) if result.allowed else 1
        return Decision(result.allowed, ids, self.hash, approvers)
