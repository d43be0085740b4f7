"""The policy set: Cedar policies validated against the schema, and the decisions they give.

Loaded once at start-up from the policies folder:

    docbroker.cedarschema   the schema (required): every policy is validated against it
    *.cedar                 the operator's policies (optional), each with a unique `@id`
    default.toml, tenants/  compiled to Cedar (`broker.policy.compile`)

Anything that does not parse or validate refuses the load with one line naming the file and
the policy id (`PolicyError`); the request values a decision uses never appear in one.

Speed: Cedar evaluates every policy of the set it is given, so the set is sliced per tenant —
a policy whose scope names a tenant (`principal in Docbroker::Tenant::"acme"`, `resource in …`)
can match only that tenant's requests (a user and a tool are in their own tenant and no other
entity is), and leaving it out of other tenants' slices changes no decision. The entities of
a caller (its tenant, groups, user and the tenant's tools) are built once per principal and
kept in a bounded table.
"""

from __future__ import annotations

import hashlib
import json
import re
import time
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import cedarpy

from broker.policy.compile import RESERVED_PREFIXES, builtin_policies, tenant_policies
from broker.policy.tenants import Policies, PolicyError
from broker.types import Principal
from server.contracts import TOOL_NAMES

SCHEMA_FILE = "docbroker.cedarschema"
POLICY_ID_RE = re.compile(r"[A-Za-z0-9_.:-]{1,128}")  # what the audit log accepts as an id
ENTITY_CACHE_SIZE = 4096
_NS = "Docbroker"
_TENANT, _USER, _GROUP, _TOOL = f"{_NS}::Tenant", f"{_NS}::User", f"{_NS}::Group", f"{_NS}::Tool"
_ACTION = f"{_NS}::Action"


@dataclass(frozen=True)
class Call:
    """One request, as the policy sees it. `document` and the sizes are values of the request:
    they may be decided on and are never logged."""

    principal: Principal
    tool: str
    protocol: str | None = None
    request_bytes: int = 0
    document: str | None = None
    content_bytes: int | None = None
    at: float | None = None  # unix seconds; None: now


@dataclass(frozen=True)
class Decision:
    allowed: bool
    # The determining policies: the permits that allowed, or the forbids that denied (empty
    # when nothing permitted: Cedar's default deny).
    policy_ids: tuple[str, ...]
    policy_hash: str


@dataclass(frozen=True)
class Source:
    """One file's policies, as text, and the name it is reported by."""

    name: str
    text: str


def _one_line(text: str, limit: int = 200) -> str:
    first = " ".join(str(text).split())
    return first if len(first) <= limit else first[: limit - 1] + "…"


def _tenant_of(scope: dict[str, Any], entity_type: str) -> str | None:
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
    if kind == entity_type and op == "==" and "/" in ident:
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
        for source in sources:
            self._add(source)
        canonical = json.dumps(
            {"schema": schema_text, "policies": self._policies}, sort_keys=True, separators=(",", ":")
        )
        self.hash = hashlib.sha256(canonical.encode()).hexdigest()
        self._global: dict[str, dict[str, Any]] = {}
        self._scoped: dict[str, dict[str, dict[str, Any]]] = {}
        for pid, est in self._policies.items():
            tenants = {_tenant_of(est["principal"], _USER), _tenant_of(est["resource"], _TOOL)} - {None}
            if not tenants:
                self._global[pid] = est
            elif len(tenants) == 1:
                self._scoped.setdefault(str(tenants.pop()), {})[pid] = est
            # Two different tenants: the policy can match no request; it is kept in the hash only.
        self._slices: dict[str, cedarpy.PolicySet] = {}
        self._entities: OrderedDict[Principal, cedarpy.Entities] = OrderedDict()

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
            self._policies[pid] = est
            self.sources[pid] = source.name

    def _slice(self, tenant: str) -> cedarpy.PolicySet:
        found = self._slices.get(tenant)
        if found is None:
            policies = {**self._global, **self._scoped.get(tenant, {})}
            doc = {"staticPolicies": policies, "templates": {}, "templateLinks": []}
            found = self._slices[tenant] = cedarpy.PolicySet.from_json_str(json.dumps(doc))
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
                "uid": {"type": _USER, "id": f"{principal.tenant}/{principal.subject}"},
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
        found = cedarpy.Entities.from_json_str(json.dumps(entities), self._schema)
        self._entities[principal] = found
        if len(self._entities) > ENTITY_CACHE_SIZE:
            self._entities.popitem(last=False)
        return found

    def request(self, call: Call) -> dict[str, Any]:
        """The Cedar request of a call (principal, action, resource, context)."""
        at = time.time() if call.at is None else call.at
        moment = time.gmtime(at)
        context: dict[str, Any] = {
            "scopes": sorted(s.value for s in call.principal.scopes),
            "protocol": call.protocol or "",
            "request_bytes": call.request_bytes,
            "unix": int(at),
            "hour": moment.tm_hour,
            "weekday": moment.tm_wday,
        }
        if call.document is not None:
            context["document"] = call.document
        if call.content_bytes is not None:
            context["content_bytes"] = call.content_bytes
        principal = call.principal
        return {
            "principal": {"type": _USER, "id": f"{principal.tenant}/{principal.subject}"},
            "action": {"type": _ACTION, "id": call.tool},
            "resource": {"type": _TOOL, "id": f"{principal.tenant}/{call.tool}"},
            "context": json.dumps(context, separators=(",", ":")),
        }

    def decide(self, call: Call, *, check_request: bool = False) -> Decision:
        """Cedar's decision on a call. A tool the schema does not know is refused unasked.
        `check_request`: also check the request against the schema (tests and `explain`)."""
        if call.tool not in TOOL_NAMES:
            return Decision(False, (), self.hash)
        result = cedarpy.is_authorized(
            self.request(call),
            self._slice(call.principal.tenant),
            self._entities_of(call.principal),
            self._schema if check_request else None,
        )
        if result.diagnostics.errors and check_request:
            raise PolicyError(f"request does not conform ({_one_line(result.diagnostics.errors[0])})")
        return Decision(result.allowed, tuple(sorted(result.diagnostics.reasons)), self.hash)
