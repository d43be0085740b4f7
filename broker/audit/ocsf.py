"""`docbroker audit export --format ocsf`: audit events as OCSF API Activity (class 6003) JSON lines.

Built on `ocsf_emitter` (typed models generated from the official OCSF 1.5.0 schema): the class
identity and type_uid come from it, and the lines are validated against its API Activity model
before they are written (see `Exporter`), so a SIEM with an OCSF parser ingests the export as it
is. Events are built as plain dicts and validated from the bytes written: a model built and
dumped per event would cost ten times as much. The mapping, field by field, is in docs/audit.md.

Names only, as in the log: the export is built from an allow-list of the log's keys, each
checked again with the schema's own validator, so a value that should never have been in the log
(or a key a rewritten log invents) does not reach the SIEM through the export either. The names a
client or sandbox could choose (`method`, `tool`, `arg_names`, `header_names`) pass only when
they are names the broker writes, `reason` only in the form of its codes, `other` otherwise
(broker/audit/names.py): a rewritten log's `tool` may hold a file name of the right shape. The
log's own evidence lines (`audit.*`) are not API activity: they are left out unless `--evidence`
asks for them, and then exported as activity "Other".

A line the export cannot carry (a `ts` that is no real time, such as month 13 or year 0) is
named on stderr by file and line, counted and skipped; the feed goes on (query.BadLine).
"""

from __future__ import annotations

import functools
from datetime import UTC, datetime
from importlib.metadata import PackageNotFoundError, version
from typing import Any, Final

import orjson
import pydantic
from ocsf_emitter import OCSF_SCHEMA_VERSION, OcsfClass, class_identity, models, type_uid_for

from broker.audit import names
from broker.audit.query import EVIDENCE_PREFIX, BadLine
from broker.audit.schema import ALL_FIELDS, INVALID, AuditEvent

# OCSF API Activity's activity_id, status_id and severity_id values (schema 1.5.0).
CREATE, READ, UPDATE, DELETE, OTHER = 1, 2, 3, 4, 99
STATUS_UNKNOWN, SUCCESS, FAILURE, STATUS_OTHER = 0, 1, 2, 99
INFORMATIONAL, LOW, MEDIUM, HIGH = 1, 2, 3, 4

_ACTIVITY_NAMES: Final = {CREATE: "Create", READ: "Read", UPDATE: "Update", DELETE: "Delete", OTHER: "Other"}
_STATUS_NAMES: Final = {
    STATUS_UNKNOWN: "Unknown",
    SUCCESS: "Success",
    FAILURE: "Failure",
    STATUS_OTHER: "Other",
}
_SEVERITY_NAMES: Final = {INFORMATIONAL: "Informational", LOW: "Low", MEDIUM: "Medium", HIGH: "High"}

# What each event does to what it is about. mcp.request and the denials take the request's own.
_EVENT_ACTIVITY: Final = {
    AuditEvent.APPROVAL_REQUESTED: CREATE,
    AuditEvent.APPROVAL_DECIDED: UPDATE,
    AuditEvent.APPROVAL_CONSUMED: UPDATE,
    AuditEvent.APPROVAL_RELEASED: UPDATE,
    AuditEvent.APPROVAL_VIEWED: READ,
    AuditEvent.APPROVAL_PURGED: DELETE,
    AuditEvent.SANDBOX_STARTED: CREATE,
    AuditEvent.SANDBOX_STOPPED: DELETE,
    AuditEvent.SANDBOX_FAILED: OTHER,
    AuditEvent.TOOLS_REJECTED: OTHER,
    AuditEvent.CONTRACT_CHANGED: UPDATE,
    AuditEvent.REPORTS_QUARANTINED: UPDATE,
    AuditEvent.WEB_SIGNIN: CREATE,
    AuditEvent.WEB_SIGNOUT: DELETE,
}
_TOOL_ACTIVITY: Final = {"search_documents": READ, "read_document": READ, "save_report": CREATE}
_READ_METHOD_PREFIXES: Final = ("tools/list", "resources/", "prompts/", "ping", "completion/")

_OUTCOME_STATUS: Final = {
    "ok": SUCCESS,
    "rejected": FAILURE,
    "failed": FAILURE,
    "denied": FAILURE,
    "error": FAILURE,
    "result_unknown": STATUS_UNKNOWN,
    "waiting_approval": STATUS_OTHER,
}
_OUTCOME_SEVERITY: Final = {
    "ok": INFORMATIONAL,
    "waiting_approval": INFORMATIONAL,
    "rejected": LOW,
    "result_unknown": LOW,
    "error": LOW,
    "failed": MEDIUM,
    "denied": MEDIUM,
}
_EVENT_SEVERITY: Final = {AuditEvent.SANDBOX_FAILED: HIGH, AuditEvent.TOOLS_REJECTED: HIGH}

# Keys that have an OCSF home; every other key of the log goes to `unmapped` under its own name.
_MAPPED: Final = frozenset(
    {"v", "event", "ts", "seq", "tenant", "subject", "method", "tool", "request_id", "outcome", "reason"}
    | {"duration_ms", "status", "approval_id", "sandbox", "replica", "log_id", "count", "time"}
)


def _product_version() -> str:
    try:
        return version("docbroker")
    except PackageNotFoundError:  # run from a checkout that was never installed
        return "0"


_PRODUCT: Final = {"name": "docbroker", "vendor_name": "docbroker", "version": _product_version()}
_IDENTITY: Final = class_identity(OcsfClass.API_ACTIVITY)


def to_ocsf(record: dict[str, Any]) -> dict[str, Any]:
    """One audit event → one OCSF API Activity event (a JSON-ready dict, not yet validated)."""
    return _mapped(_names_only(record))


def _mapped(fields: dict[str, Any]) -> dict[str, Any]:
    event = fields.get("event", "other")
    outcome = fields.get("outcome")
    activity = _activity(event, fields.get("method"), fields.get("tool"))
    status = _OUTCOME_STATUS.get(outcome, STATUS_UNKNOWN) if outcome else STATUS_UNKNOWN
    severity = _EVENT_SEVERITY.get(event) or (
        _OUTCOME_SEVERITY.get(outcome, INFORMATIONAL) if outcome else INFORMATIONAL
    )
    class_uid, category_uid, class_name, category_name = _IDENTITY
    subject, tenant, replica = fields.get("subject"), fields.get("tenant"), fields.get("replica")
    metadata = _drop_none(
        {
            "version": OCSF_SCHEMA_VERSION,
            "product": _PRODUCT,
            "log_name": "docbroker-audit",
            "log_version": str(fields["v"]) if "v" in fields else None,
            "uid": _event_uid(fields),
            "sequence": fields.get("seq"),
            "correlation_uid": fields.get("request_id"),
            "original_time": fields.get("ts"),
            "tenant_uid": tenant,
            "event_code": event,
        }
    )
    actor: dict[str, Any] = {"app_name": "docbroker"}
    if subject:
        actor["user"] = {"uid": subject, "name": subject, **({"org": {"uid": tenant}} if tenant else {})}
    api = _drop_none(
        {
            "operation": fields.get("method") or event,
            "request": {"uid": fields["request_id"]} if "request_id" in fields else None,
            "service": {"name": "mcp"},
            "version": fields.get("protocol"),
        }
    )
    resources = [
        {"type": kind, key: fields[name]}
        for kind, key, name in (
            ("tool", "name", "tool"),
            ("approval", "uid", "approval_id"),
            ("sandbox", "uid", "sandbox"),
        )
        if name in fields
    ]
    unmapped = {k: v for k, v in fields.items() if k not in _MAPPED}
    return _drop_none(
        {
            "class_uid": class_uid,
            "class_name": class_name,
            "category_uid": category_uid,
            "category_name": category_name,
            "activity_id": activity,
            "activity_name": _ACTIVITY_NAMES[activity],
            "type_uid": type_uid_for(OcsfClass.API_ACTIVITY, activity),
            "type_name": f"API Activity: {_ACTIVITY_NAMES[activity]}",
            "time": fields["time"],
            "severity_id": severity,
            "severity": _SEVERITY_NAMES[severity],
            "status_id": status,
            "status": _STATUS_NAMES[status],
            "status_code": fields.get("reason"),
            "status_detail": outcome,
            "message": f"{event} {outcome}" if outcome else event,
            "duration": round(fields["duration_ms"]) if "duration_ms" in fields else None,
            "count": fields.get("count"),
            "metadata": metadata,
            "actor": actor,
            "api": api,
            # The broker records no client address (DESIGN §6); the destination is the replica.
            "src_endpoint": {},
            "dst_endpoint": {"svc_name": "docbroker", "uid": replica} if replica else None,
            "http_response": {"code": fields["status"]} if "status" in fields else None,
            "resources": resources or None,
            "unmapped": unmapped or None,
        }
    )


class Exporter:
    """`to_ocsf` as JSON lines, each checked against the OCSF model before it is handed out.

    Strict validation of the JSON we write (no coercion: a "5" where OCSF wants 5 fails), so a
    mapping bug raises pydantic.ValidationError rather than ship an event a SIEM would reject.
    Validation costs three times the mapping, so it runs once per shape of event: the same keys
    and the same values of the fields that choose ids and names (event, method, tool, outcome).
    Within a shape the rest are strings and integers the audit schema's validators have checked.
    """

    _MAX_SHAPES: Final = 4096

    def __init__(self) -> None:
        self._checked: set[tuple[object, ...]] = set()

    def line(self, record: dict[str, Any]) -> bytes:
        """Raises BadLine for a line that cannot be exported (reported and skipped by the command's scan)."""
        fields = _names_only(record)
        line = orjson.dumps(_mapped(fields))
        shape = (tuple(fields), *(fields.get(k) for k in ("event", "method", "tool", "outcome")))
        if shape not in self._checked:
            try:
                models.ApiActivity.model_validate_json(line, strict=True)
            except pydantic.ValidationError:
                # A mapping gap a planted line found: skip the line, keep the feed (the error's
                # text would quote the line's values, so it is not shown).
                raise BadLine("does not map to a valid OCSF event") from None
            if len(self._checked) >= self._MAX_SHAPES:
                self._checked.clear()
            self._checked.add(shape)
        return line + b"\n"


def _drop_none(mapping: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in mapping.items() if v is not None}


def _names_only(record: dict[str, Any]) -> dict[str, Any]:
    """Keys of the audit schema whose values still pass its validators; everything else is dropped.
    Names the broker chooses from a list are kept only when on it (`other` otherwise), and `ts`
    becomes `time` (epoch ms). Raises BadLine when `ts` is no real time."""
    kept: dict[str, Any] = {}
    for key, value in record.items():
        known = _KNOWN.get(key)
        if known is not None:
            kept[key] = known(value)
            continue
        if key == "arg_names":
            continue  # known only for the tool that declares them: decided below
        check = ALL_FIELDS.get(key) or _EXTRA_FIELDS.get(key)
        if check is None:
            continue
        if key == "event":
            # Events the log writes about itself are names of a fixed family; anything else: other.
            if check(value) is INVALID and not (isinstance(value, str) and _is_evidence(value)):
                value = "other"
            kept[key] = value
            continue
        checked = check(value)
        if checked is not INVALID:
            kept[key] = checked
    if "arg_names" in record:  # as the gateway writes them: the line's tool declares them
        declared = names.ARGS_BY_TOOL.get(kept.get("tool", ""), frozenset({names.OTHER}))
        kept["arg_names"] = names.known_list(record["arg_names"], declared)
    if "ts" in kept:
        kept["time"] = _epoch_ms(kept["ts"])
    elif "ts" in record:
        raise BadLine("ts is not a time in the log's form")
    else:
        kept["time"] = 0
    return kept


# Fields whose values the broker takes from a fixed list: the list decides, not the shape.
_KNOWN: Final = {
    "method": lambda v: names.known(v, names.METHODS),
    "tool": lambda v: names.known(v, names.TOOLS),
    "header_names": lambda v: names.known_list(v, names.HEADERS),
    "reason": names.reason_code,
}


def _is_evidence(name: str) -> bool:
    rest = name[len(EVIDENCE_PREFIX) :]
    return name.startswith(EVIDENCE_PREFIX) and 0 < len(rest) <= 32 and rest.replace("_", "").isalpha()


def _identifier(value: object) -> object:
    text = value if type(value) is str else None
    if text and len(text) <= 128 and all(c.isalnum() or c in "_.:-" for c in text) and text.isascii():
        return text
    return INVALID


def _count(value: object) -> object:
    return value if type(value) is int and 0 <= value <= 2**53 else INVALID


# Keys other parts of the log may add beyond schema.py's (replica and log ids, counted denials).
_EXTRA_FIELDS: Final = {"replica": _identifier, "log_id": _identifier, "count": _count}


def _activity(event: str, method: str | None, tool: str | None) -> int:
    if event in _EVENT_ACTIVITY:
        return _EVENT_ACTIVITY[AuditEvent(event)]
    if method == "tools/call":
        return _TOOL_ACTIVITY.get(tool or "", OTHER)
    if method and method.startswith(_READ_METHOD_PREFIXES):
        return READ
    return OTHER


def _event_uid(fields: dict[str, Any]) -> str | None:
    seq = fields.get("seq")
    if seq is None:
        return None
    scope = fields.get("log_id") or fields.get("replica")
    return f"{scope}:{seq}" if scope else str(seq)


def _epoch_ms(ts: str) -> int:
    # ts is the writer's fixed form, 2026-11-30T08:00:00.123Z: the whole second repeats a lot.
    return _epoch_second(ts[:19]) * 1000 + int(ts[20:23])


@functools.lru_cache(maxsize=64)
def _epoch_second(text: str) -> int:
    """Raises BadLine for a time of the right form that does not exist (month 13, year 0, Feb 30)."""
    try:
        moment = datetime(
            int(text[0:4]),
            int(text[5:7]),
            int(text[8:10]),
            int(text[11:13]),
            int(text[14:16]),
            int(text[17:19]),
            tzinfo=UTC,
        )
    except ValueError:
        raise BadLine("ts is not a real time") from None
    return int(moment.timestamp())
