"""`docbroker audit verify-receipt`: check a receipt with nothing but it, the replicas' public
keys and (optionally) the report (DESIGN §16).

In order, the first thing wrong wins:

1. every line's inclusion proof and its checkpoint's signature (`proofs.verify_proof`), and
   no line given twice;
2. the lines against each other and the receipt's fields: the same approval id and tenant on
   every line, the same content commitment on the approval's own lines, the commitment equal to
   sha256(salt ‖ sha256) of the receipt's salt and hash; each of the receipt's entries equal to
   its line (event, person, decision, time, policy hash and ids, outcome) and every line
   accounted for by one entry;
3. the story: requested, then the decisions, then the consumption, then the write; no "no";
   the count of approvers the policy asked for (the most any yes asked) reached by distinct
   people (issuer, subject);
4. with the report: its bytes' sha256 and size are the receipt's, and so its file name.

Messages are fixed texts with numbers and the receipt's own ids: never the report's content.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any

from broker.audit.checkpoint import Keyring
from broker.audit.commitment import content_commitment
from broker.audit.proofs import verify_proof
from broker.audit.receipts import FORMAT, RECEIPT_TYPE, WRITE_OUTCOMES
from broker.audit.schema import AuditEvent
from broker.protocol.codec import loads_strict

MAX_LINES = 256  # a receipt of 64 approvers and their retries is far below


class Refused(Exception):
    """Why a receipt does not hold (a fixed text)."""


@dataclass
class ReceiptVerdict:
    ok: bool
    problem: str | None = None
    story: list[str] = field(default_factory=list)
    report_checked: bool = False


def _get(holder: Any, key: str, kind: type | tuple[type, ...]) -> Any:
    value = holder.get(key) if isinstance(holder, dict) else None
    if not isinstance(value, kind) or (kind is int and type(value) is bool):
        raise Refused(f"the receipt's `{key}` is missing or malformed")
    return value


def _events(receipt: dict[str, Any], keys: Keyring) -> list[dict[str, Any]]:
    proofs = _get(receipt, "proofs", list)
    if not 1 <= len(proofs) <= MAX_LINES:
        raise Refused("the receipt holds no lines, or too many")
    events, seen = [], set()
    for number, proof in enumerate(proofs):
        ok, verdict = verify_proof(proof, keys)
        if not ok:
            raise Refused(f"line {number}: {verdict}")
        where = (proof["checkpoint"]["log"], proof["index"])
        if where in seen:
            raise Refused(f"line {number} is given twice")
        seen.add(where)
        events.append(loads_strict(proof["line"]))
    return events


def _person(holder: Any, key: str) -> tuple[str, str]:
    person = _get(holder, key, dict)
    return (_get(person, "issuer", str), _get(person, "subject", str))


def _line_person(event: dict[str, Any]) -> tuple[str, str]:
    return (event.get("issuer", ""), event.get("subject", ""))


class _Lines:
    """The receipt's lines, each to be claimed by exactly one of its entries."""

    def __init__(self, events: list[dict[str, Any]]) -> None:
        self.events = events
        self.claimed: set[int] = set()

    def claim(self, entry: Any, what: str, event_name: str) -> dict[str, Any]:
        at: int = _get(entry, "line", int)
        if not 0 <= at < len(self.events) or at in self.claimed:
            raise Refused(f"{what}: its line is not one of the receipt's, or is another entry's")
        self.claimed.add(at)
        event = self.events[at]
        if event.get("event") != event_name:
            raise Refused(f"{what}: its line is not an {event_name} event")
        if event.get("ts") != _get(entry, "time", str):
            raise Refused(f"{what}: its time is not its line's")
        return event


def _check_lines(receipt: dict[str, Any], events: list[dict[str, Any]]) -> list[str]:
    approval = _get(receipt, "approval", dict)
    approval_id, tenant = _get(approval, "id", str), _get(approval, "tenant", str)
    salt, sha256 = _get(approval, "salt", str), _get(approval, "sha256", str)
    commitment = _get(approval, "content_commitment", str)
    requester = _person(approval, "requester")
    try:
        if content_commitment(salt, sha256) != commitment:
            raise Refused(
                "the content commitment is not sha256(salt ‖ sha256) of the receipt's salt and hash"
            )
    except ValueError:
        raise Refused("the receipt's salt or sha256 is not 32 bytes of hex") from None
    for number, event in enumerate(events):
        if event.get("approval_id") != approval_id:
            raise Refused(f"line {number} is another approval's (approval id differs)")
        if event.get("tenant") != tenant:
            raise Refused(f"line {number} is another tenant's")
        if event.get("event") != AuditEvent.MCP_REQUEST and event.get("content_commitment") != commitment:
            raise Refused(f"line {number} commits to other content (content_commitment differs)")
    lines = _Lines(events)
    story = [
        f"approval {approval_id} of tenant {tenant}: {_get(approval, 'bytes', int)} bytes, sha256 {sha256}"
    ]

    requested = lines.claim(_get(receipt, "requested", dict), "requested", AuditEvent.APPROVAL_REQUESTED)
    if _line_person(requested) != requester:
        raise Refused("requested: the requester is not its line's")
    story.append(f"  requested {requested['ts']} by {_who(requester)} (replica {requested.get('replica')})")

    yes: set[tuple[str, str]] = set()
    required, times = 1, []
    for number, entry in enumerate(_get(receipt, "decisions", list)):
        what = f"decision {number}"
        event = lines.claim(entry, what, AuditEvent.APPROVAL_DECIDED)
        if event.get("outcome") != "ok":
            raise Refused(f"{what}: its line records no decision")
        approver = _person(entry, "approver")
        if _line_person(event) != approver:
            raise Refused(f"{what}: the approver is not its line's")
        decision = _get(entry, "decision", str)
        if event.get("decision") != decision:
            raise Refused(f"{what}: yes or no is not its line's")
        if event.get("policy_hash") != entry.get("policy_hash"):
            raise Refused(f"{what}: the policy hash is not its line's")
        if event.get("policy_ids", []) != entry.get("policy_ids"):
            raise Refused(f"{what}: the policy ids are not its line's")
        if decision != "approved":
            raise Refused(f"{what} is a no: the report was not approved")
        if approver in yes:
            raise Refused(f"{what}: that approver's yes is counted already")
        yes.add(approver)
        required = max(required, event.get("approvers_required", 1))
        times.append(event["ts"])
        ids = ", ".join(event.get("policy_ids", [])) or "-"
        story.append(
            f"  approved {event['ts']} by {_who(approver)} under policy set "
            f"{str(event.get('policy_hash'))[:12]} ({ids}) (replica {event.get('replica')})"
        )
    if _get(approval, "required", int) != required:
        raise Refused("the count of approvers required is not the decisions' lines'")
    if len(yes) < required:
        raise Refused(f"the policy asked for {required} approvers; the receipt shows {len(yes)}")
    if any(t < requested["ts"] for t in times):
        raise Refused("a decision is before the request")

    consumption = receipt.get("consumption")
    if consumption is None:
        raise Refused("the receipt shows no consumption: the approval was not used for a write")
    consumed = lines.claim(consumption, "consumption", AuditEvent.APPROVAL_CONSUMED)
    if _line_person(consumed) != requester:
        raise Refused("consumption: not the requester's")
    if any(t > consumed["ts"] for t in times):
        raise Refused("a decision is after the consumption")
    story.append(f"  consumed {consumed['ts']} (replica {consumed.get('replica')})")

    write = receipt.get("write")
    if write is None:
        raise Refused("the receipt shows no write")
    written = lines.claim(write, "write", AuditEvent.MCP_REQUEST)
    outcome = _get(write, "outcome", str)
    if written.get("outcome") != outcome or outcome not in WRITE_OUTCOMES:
        raise Refused("write: the outcome is not its line's")
    if _line_person(written) != (requester[0] if "issuer" in written else "", requester[1]):
        raise Refused("write: not the requester's")
    if written["ts"] < consumed["ts"]:
        raise Refused("the write is before the consumption")
    story.append(f"  written {written['ts']}: {outcome} (replica {written.get('replica')})")
    if len(lines.claimed) != len(events):
        raise Refused("the receipt holds a line none of its entries accounts for")
    return story


def _who(person: tuple[str, str]) -> str:
    issuer, subject = person
    return f"{subject} ({issuer})" if issuer else subject


def check_receipt(
    receipt: Any, keys: Keyring, report: bytes | None = None, report_name: str | None = None
) -> ReceiptVerdict:
    """The verdict on a receipt (parsed JSON): every proof, the lines, the story, the report."""
    try:
        if not isinstance(receipt, dict) or receipt.get("type") != RECEIPT_TYPE or receipt.get("v") != FORMAT:
            raise Refused("not a docbroker receipt")
        story = _check_lines(receipt, _events(receipt, keys))
        approval = receipt["approval"]
        if report is not None:
            if hashlib.sha256(report).hexdigest() != approval["sha256"] or len(report) != approval["bytes"]:
                raise Refused("the report's bytes are NOT the approved ones (sha256 or size differs)")
            if report_name is not None and report_name != _get(approval, "filename", str):
                raise Refused("the report's file name is not the approved one")
            story.append(f"  the report {approval['filename']} is byte for byte the approved content")
    except Refused as exc:
        return ReceiptVerdict(False, str(exc))
    return ReceiptVerdict(True, None, story, report is not None)
