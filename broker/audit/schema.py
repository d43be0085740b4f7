"""The audit event schema (DESIGN §6): which keys a line may carry and what each value may look like.

The audit log is for security teams and must never hold argument values, file names, queries,
contents or tokens. Dropping unknown keys is not enough: a caller could put a file name into
`reason` or a query into `tool`. So every allowed key also has a validator that accepts only the
type and the narrow shape that key promises (identifiers, enums, bounded integers); anything else
is refused by the pipeline and never written. `verify` applies the same validators to a stored log.
"""

from __future__ import annotations

import math
import re
from collections.abc import Awaitable, Callable, Iterable
from enum import StrEnum
from typing import Final

from broker.types import ApprovalState, DaemonMode, Outcome

SCHEMA_VERSION: Final = 1
MAX_LIST_ITEMS: Final = 64
MAX_SUBJECT_CHARS: Final = 256
MAX_COUNT: Final = 2**53  # largest integer every JSON reader keeps exact


# What the approvals code is handed to write an event: `await audit(event, **fields)`.
AuditFn = Callable[..., Awaitable[None]]


class AuditEvent(StrEnum):
    MCP_REQUEST = "mcp.request"
    AUTH_DENIED = "auth.denied"
    POLICY_DENIED = "policy.denied"
    APPROVAL_REQUESTED = "approval.requested"
    APPROVAL_DECIDED = "approval.decided"
    APPROVAL_CONSUMED = "approval.consumed"
    APPROVAL_RELEASED = "approval.released"  # a consumed approval given back: its write was never sent
    APPROVAL_VIEWED = "approval.viewed"  # an approver read pending reports (their content) over REST
    APPROVAL_PURGED = "approval.purged"  # retention deleted closed records (`count` of them)
    SANDBOX_STARTED = "sandbox.started"
    SANDBOX_STOPPED = "sandbox.stopped"
    SANDBOX_FAILED = "sandbox.failed"
    TOOLS_REJECTED = "tools.rejected"  # descriptor admission: a sandbox advertised tools we refuse
    CONTRACT_CHANGED = "contract.changed"  # descriptor admission: a tool's schema changed
    REPORTS_QUARANTINED = "reports.quarantined"  # drop-box sweep: what it moved out, by count
    WEB_SIGNIN = "web.signin"  # an approver signed in to /approvals with the OpenID Provider (or failed to)
    WEB_SIGNOUT = "web.signout"  # an approver's session ended at their logout


class SystemEvent(StrEnum):
    """Lines the log writes about itself (never passed to `emit`)."""

    CHECKPOINT = "audit.checkpoint"  # a signed tree head over the lines before it
    GAP = "audit.gap"  # signed: requests were refused while the log could not be written


class Invalid:
    """Returned by a validator for a value that must not be written."""


INVALID: Final = Invalid()

Validator = Callable[[object], object]  # normalised value, or INVALID

_NAME = re.compile(r"[A-Za-z0-9_./-]{1,128}")  # tool, method, argument and header names
_ID = re.compile(r"[A-Za-z0-9_.:-]{1,128}")  # broker-made ids: request, approval, sandbox
_TENANT = re.compile(r"[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?")  # DNS label, as auth enforces
_REASON = re.compile(r"[a-z0-9_.:-]{1,64}")
_PROTOCOL = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}")  # MCP versions are dates
_TS = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}\.[0-9]{3}Z")
_SHA256 = re.compile(r"[0-9a-f]{64}")
_IMAGE_DIGEST = re.compile(r"sha256:[0-9a-f]{64}")


def _plain(value: object) -> str | None:
    if type(value) is str:
        return value
    # str.__str__ yields the characters themselves, whatever a subclass's (or enum's) __str__ says.
    return str.__str__(value) if isinstance(value, str) else None


_MEMO_SIZE = 4096


def _pattern(regex: re.Pattern[str]) -> Validator:
    # Tenants, tools, methods and reasons repeat on nearly every line: remember recent verdicts
    # (for plain str values only, in a bounded table) instead of matching again.
    memo: dict[str, object] = {}

    def check(value: object) -> object:
        if type(value) is str:
            known = memo.get(value)
            if known is not None:
                return known
        text = _plain(value)
        verdict = text if text is not None and regex.fullmatch(text) else INVALID
        if type(value) is str:
            if len(memo) >= _MEMO_SIZE:
                memo.clear()
            memo[value] = verdict
        return verdict

    return check


def _one_of(choices: Iterable[str]) -> Validator:
    allowed = frozenset(str(c) for c in choices)

    def check(value: object) -> object:
        text = _plain(value)
        return text if text in allowed else INVALID

    return check


_COLLECTIONS = (list, tuple, set, frozenset)


def _set_of(regex: re.Pattern[str], *, at_least: int) -> Validator:
    """A list of such strings, at most MAX_LIST_ITEMS: written sorted, each once."""

    def check(value: object) -> object:
        # A str is iterable too: refuse it, or "query" would become ["e", "q", "r", "u", "y"].
        if not isinstance(value, _COLLECTIONS) or not at_least <= len(value) <= MAX_LIST_ITEMS:
            return INVALID
        found = set()
        for item in value:
            text = _plain(item)
            if text is None or not regex.fullmatch(text):
                return INVALID
            found.add(text)
        return sorted(found)

    return check


_names = _set_of(_NAME, at_least=0)
_ids = _set_of(_ID, at_least=1)


def _subject(value: object) -> object:
    text = _plain(value)
    if text is None or not 1 <= len(text) <= MAX_SUBJECT_CHARS or not text.isprintable():
        return INVALID
    return text


def _count(low: int, high: int) -> Validator:
    def check(value: object) -> object:
        # type() rather than isinstance(): JSON `true` must not pass as the integer 1.
        return value if type(value) is int and low <= value <= high else INVALID

    return check


def _duration(value: object) -> object:
    if type(value) is int and 0 <= value <= MAX_COUNT:
        return value
    if type(value) is float and math.isfinite(value) and 0 <= value <= MAX_COUNT:
        return round(value, 3)
    return INVALID


def _flag(value: object) -> object:
    return value if type(value) is bool else INVALID


# Keys a caller may pass to `emit` (plus `event`, its positional argument).
CALLER_FIELDS: Final[dict[str, Validator]] = {
    "event": _one_of(AuditEvent),
    "request_id": _pattern(_ID),
    "tenant": _pattern(_TENANT),
    "subject": _subject,
    "issuer": _subject,  # who vouches for the subject: the (issuer, sub) pair is the person
    "method": _pattern(_NAME),
    "tool": _pattern(_NAME),
    "arg_names": _names,
    "header_names": _names,
    "outcome": _one_of(Outcome),
    "reason": _pattern(_REASON),
    "duration_ms": _duration,
    "bytes_in": _count(0, MAX_COUNT),
    "bytes_out": _count(0, MAX_COUNT),
    "approval_id": _pattern(_ID),
    "decision": _one_of((ApprovalState.APPROVED, ApprovalState.DENIED)),
    "decision_reason": _pattern(_REASON),  # a denial's reason code from a fixed list, never free text
    "sandbox": _pattern(_ID),
    "sandbox_mode": _one_of(DaemonMode),
    "limits_enforced": _flag,
    "image_digest": _pattern(_IMAGE_DIGEST),  # the image a sandbox was made from (DESIGN §13)
    "protocol": _pattern(_PROTOCOL),
    "status": _count(100, 599),
    "count": _count(1, MAX_COUNT),  # how many things one line stands for (purged records, denied requests)
    # The policy decision a line records (DESIGN §14): the determining policies' @ids (the
    # operator's names, never a request value) and the hash of the policy set that decided.
    "policy_ids": _ids,
    "policy_hash": _pattern(_SHA256),
}


def _invalid_names(value: object) -> object:
    checked = _names(value)
    if not isinstance(checked, list) or not set(checked) <= CALLER_FIELDS.keys():
        return INVALID
    return checked


# Keys only the pipeline writes; a caller passing one of them has it dropped like any unknown key.
SYSTEM_FIELDS: Final[dict[str, Validator]] = {
    "v": _count(SCHEMA_VERSION, SCHEMA_VERSION),
    "seq": _count(1, MAX_COUNT),
    "ts": _pattern(_TS),
    "prev": _pattern(_SHA256),
    "replica": _pattern(_ID),  # the replica that wrote the line (DESIGN §9); the broker stamps every line
    "invalid": _invalid_names,  # names of fields whose values were refused (never the values)
    "dropped": _count(1, MAX_COUNT),  # how many unknown keys were dropped (never their names)
}

_HEX16 = re.compile(r"[0-9a-f]{16}")
_HEX32 = re.compile(r"[0-9a-f]{32}")
_SIG = re.compile(r"[0-9a-f]{128}")
_EVIDENCE: Final[dict[str, Validator]] = {
    "v": _count(1, 1),
    "log": _pattern(_HEX32),
    "replica": _pattern(_ID),
    "n": _count(1, MAX_COUNT),
    "size": _count(0, MAX_COUNT),
    "root": _pattern(_SHA256),
    "prev": _pattern(_SHA256),
    "time": _pattern(_TS),
    "from": _pattern(_TS),
    "to": _pattern(_TS),
    "key": _pattern(_HEX16),
    "refused": _count(0, MAX_COUNT),
    "lost": _count(0, MAX_COUNT),
}
_CHECKPOINT_KEYS = frozenset({"key", "log", "n", "prev", "replica", "root", "size", "time", "v"})
_GAP_KEYS = frozenset({"from", "key", "log", "lost", "refused", "replica", "size", "to", "v"})


def _record(keys: frozenset[str]) -> Validator:
    def check(value: object) -> object:
        if type(value) is not dict or value.keys() != keys:
            return INVALID
        for key, item in value.items():
            if _EVIDENCE[key](item) != item:
                return INVALID
        return value

    return check


def _frontier(value: object) -> object:
    if type(value) is not list or len(value) > 64:
        return INVALID
    ok = all(type(item) is str and _SHA256.fullmatch(item) for item in value)
    return value if ok else INVALID


# Keys of the log's own lines (SystemEvent): the signed record, its signature, the frontier.
EVIDENCE_FIELDS: Final[dict[str, Validator]] = {
    "checkpoint": _record(_CHECKPOINT_KEYS),
    "gap": _record(_GAP_KEYS),
    "sig": _pattern(_SIG),
    "frontier": _frontier,
}

# Exactly these evidence keys (besides the header) on each of the log's own lines; none elsewhere.
SYSTEM_EVENT_FIELDS: Final[dict[str, frozenset[str]]] = {
    SystemEvent.CHECKPOINT: frozenset({"checkpoint", "sig", "frontier"}),
    SystemEvent.GAP: frozenset({"gap", "sig"}),
}

ALL_FIELDS: Final[dict[str, Validator]] = {
    **CALLER_FIELDS,
    **SYSTEM_FIELDS,
    **EVIDENCE_FIELDS,
    "event": _one_of([*AuditEvent, *SystemEvent]),
}
REQUIRED_FIELDS: Final = frozenset({"v", "seq", "ts", "prev", "event"})
