"""A table of requests and the decisions expected of them (`docbroker policy test FILE`).

A TOML file: `[defaults]` for every case, one `[[case]]` per request, and optionally
`with = [".cedar files"]` (relative to the table) loaded on top of the policies folder and
`tenants = ["names"]`, tenants added as if their tenants/<name>.toml existed, empty:

    with = ["contractors-no-hr.cedar"]
    [defaults]
    tenant = "demo"
    scopes = ["docs:read"]
    [[case]]
    name = "contractors do not read hr documents"
    groups = ["contractors"]
    tool = "read_document"
    document = "hr-salaries.md"
    expect = "deny"
    policies = ["examples.contractors.no_hr_read"]   # optional: the determining policy ids
    approvers = 2      # optional, for `approve`: the distinct approvers the decision asks for
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from broker.policy.cedar import Call
from broker.policy.tenants import PolicyError
from broker.types import OAuthScope, Principal, TenantId

_KEYS = {
    "name", "tenant", "subject", "issuer", "groups", "scopes", "tool", "document", "content_bytes",
    "request_bytes", "protocol", "at", "expect", "policies", "self_approval", "approvers",
}  # fmt: skip
_SCOPES = {s.value: s for s in OAuthScope}


@dataclass(frozen=True)
class Case:
    name: str
    call: Call
    allow: bool
    policies: tuple[str, ...] | None  # None: not checked
    approvers: int | None = None  # `approve`: the distinct approvers the decision asks for; None: not checked


@dataclass(frozen=True)
class Table:
    cases: list[Case]
    extra: list[Path]  # .cedar files the table loads on top of the folder's set
    tenants: list[str]  # tenants it adds, with the defaults


def _text(case: dict[str, Any], key: str, where: str, default: str | None = None) -> str | None:
    value = case.get(key, default)
    if value is not None and not isinstance(value, str):
        raise PolicyError(f"{where}: {key} must be a string")
    return value


def _strings(case: dict[str, Any], key: str, where: str) -> list[str]:
    value = case.get(key, [])
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise PolicyError(f"{where}: {key} must be a list of strings")
    return value


def _int(case: dict[str, Any], key: str, where: str) -> int | None:
    value = case.get(key)
    if value is not None and (type(value) is not int or value < 0):
        raise PolicyError(f"{where}: {key} must be a non-negative integer")
    return value


def call_of(case: dict[str, Any], where: str) -> Call:
    """A request from a table row (or `explain`'s arguments), checked key by key."""
    unknown = set(case) - _KEYS
    if unknown:
        raise PolicyError(f"{where}: unknown key {sorted(unknown)[0]}")
    scopes = _strings(case, "scopes", where)
    if not set(scopes) <= _SCOPES.keys():
        raise PolicyError(f"{where}: scopes must be among {', '.join(sorted(_SCOPES))}")
    principal = Principal(
        tenant=TenantId(_text(case, "tenant", where, "demo") or "demo"),
        subject=_text(case, "subject", where, "someone") or "someone",
        scopes=frozenset(_SCOPES[s] for s in scopes),
        groups=frozenset(_strings(case, "groups", where)),
        # Who vouches for the subject: a policy naming a user names "<tenant>/<id>#<issuer>".
        issuer=_text(case, "issuer", where) or "",
    )
    tool = _text(case, "tool", where)
    if tool is None:
        raise PolicyError(f"{where}: tool is required")
    self_approval = case.get("self_approval", False)
    if type(self_approval) is not bool:
        raise PolicyError(f"{where}: self_approval must be true or false")
    at = case.get("at")
    if at is not None and type(at) is not int:
        raise PolicyError(f"{where}: at must be unix seconds")
    return Call(
        principal=principal,
        tool=tool,
        protocol=_text(case, "protocol", where),
        request_bytes=_int(case, "request_bytes", where) or 0,
        document=_text(case, "document", where),
        content_bytes=_int(case, "content_bytes", where),
        at=float(at) if at is not None else None,
        self_approval=self_approval,
    )


def load_table(path: Path) -> Table:
    try:
        with path.open("rb") as f:
            doc = tomllib.load(f)
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise PolicyError(f"{path.name}: cannot be read as TOML ({type(exc).__name__})") from None
    if set(doc) - {"with", "tenants", "defaults", "case"}:
        raise PolicyError(f"{path.name}: only with, tenants, [defaults] and [[case]] are known")
    defaults = doc.get("defaults", {})
    rows = doc.get("case", [])
    if not isinstance(defaults, dict) or not isinstance(rows, list) or not rows:
        raise PolicyError(f"{path.name}: needs at least one [[case]]")
    extra = [path.parent / name for name in _strings(doc, "with", path.name)]
    cases: list[Case] = []
    for n, row in enumerate(rows, 1):
        where = f"{path.name}: case {n}"
        merged = {**defaults, **row}
        expect = merged.pop("expect", None)
        if expect not in ("allow", "deny"):
            raise PolicyError(f"{where}: expect must be allow or deny")
        name = _text(merged, "name", where, f"case {n}") or f"case {n}"
        merged.pop("name", None)
        policies = merged.pop("policies", None)
        if policies is not None:
            merged["policies"] = policies
            policies = tuple(sorted(_strings(merged, "policies", where)))
            merged.pop("policies")
        approvers = _int(merged, "approvers", where)
        merged.pop("approvers", None)
        cases.append(Case(name, call_of(merged, where), expect == "allow", policies, approvers))
    return Table(cases, extra, _strings(doc, "tenants", path.name))
