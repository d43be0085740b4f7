"""The accounting of a reliability run (issue 25), from files and logs only.

After a run under load and faults, these functions say whether anything was lost, doubled or
left unexplained. Their inputs are what the run left on disk and nothing else:

- the clients' own answer records (JSON Lines, one line per HTTP request a client sent; see
  `Answer`), written by the clients as they went;
- the report files in each tenant's reports store;
- each replica's audit log files, its signing key and its witness file;
- each replica's process log.

Each check returns a `Check` (name, passed, how many offended, the first few offenders' ids —
request ids, subjects, approval ids, tenant/replica names: never a value such as a file name
or content), so a test asserts every check by name and a report prints them.

What the checks are evidence of (issue 25 item 1: the hardening fixes of issue 24 hold under
load):

- `approvals_consumed_once` and `saves_ok_have_their_files`: the approval a replica's crash
  would have stranded (consumed, then the replica SIGKILLed before the write) is given back or
  recovered and used exactly once — never twice, never lost for a save answered `ok`;
- `files_have_answers`: no write happened behind a client's back (a vanished client, a
  replica killed mid-save: the file exists only where the client was told `ok` or
  `result_unknown`);
- `one_terminal_event_per_request`: every request is audited exactly once, including those
  whose client left mid-call (the breaker trial whose client left is still counted and
  closed), and refusals while the audit disk was full are counted in signed gap records;
- `logs_verify`: every replica's chain, checkpoints, gap records and witness agree
  (`broker.audit.evidence.verify_logs`, the code behind `docbroker audit verify`);
- `replicas_answer_after_faults`: no tenant is left locked out (a breaker stuck open after a
  cancelled trial would fail this), every replica serves again within 10 s;
- `no_unexpected_5xx`, `no_tracebacks`, `no_hang`: failures are the documented refusals, said
  in one line, and bounded in time.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from broker.audit.checkpoint import Keyring, load_signing_key
from broker.audit.evidence import verify_logs
from broker.audit.sink import rotated_files

OUTCOMES: Final = frozenset({"ok", "error", "result_unknown"})
# Operations that are MCP requests to /mcp (each must have one terminal audit event).
# `vanish`: a request seen arriving (waiting in its sandbox) whose client then left: it got no
# answer, yet it must be audited exactly once.
MCP_OPS: Final = frozenset({"search", "read", "save.ask", "save", "probe", "vanish"})
TERMINAL_EVENTS: Final = frozenset({"mcp.request", "auth.denied", "policy.denied"})
REPORT_NAME: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,63}\.md")
TRACEBACK: Final = "Traceback (most recent call last)"
AUDIT_UNAVAILABLE_CODE: Final = -32004  # broker.protocol.jsonrpc.AUDIT_UNAVAILABLE
SHOWN: Final = 5  # offenders named in a check's result


@dataclass(frozen=True)
class Check:
    name: str
    passed: bool
    count: int  # offenders (0 when passed)
    offenders: tuple[str, ...] = ()  # the first few, by id only

    def as_json(self) -> dict[str, Any]:
        return {"name": self.name, "passed": self.passed, "count": self.count}


def _check(name: str, offenders: Iterable[str]) -> Check:
    found = sorted(set(offenders))
    return Check(name, not found, len(found), tuple(found[:SHOWN]))


@dataclass(frozen=True)
class Answer:
    """One HTTP request a client sent, and what it made of the answer.

    `status` is the HTTP status, None when no answer came (connection refused or reset, the
    client's own timeout, the client left on purpose). `outcome`: `ok` (the tool or request
    did what was asked), `error` (it certainly did not), `result_unknown` (a write that may or
    may not have happened: no answer to a save, or the tool said so).
    """

    id: str  # the client's request id, unique in the run
    subject: str  # the JWT `sub` it was sent with (the audit's `subject`): one per operation
    tenant: str
    op: str  # search, read, save.ask, save, approve, probe, flood, vanish
    outcome: str
    replica: str  # which replica it was sent to
    phase: str = "steady"  # the fault running when it was sent ("steady": none)
    status: int | None = None
    rpc_code: int | None = None  # the JSON-RPC error code, when the answer was an error
    elapsed_s: float = 0.0
    filename: str | None = None  # saves: the report's name
    sha256: str | None = None  # saves: sha256 of the content approved and sent
    approval_id: str | None = None

    @classmethod
    def from_json(cls, line: str) -> Answer:
        raw = json.loads(line)
        known = {k: raw[k] for k in cls.__dataclass_fields__ if k in raw}
        answer = cls(**known)
        if answer.outcome not in OUTCOMES:
            raise ValueError(f"answer {answer.id}: outcome must be one of {sorted(OUTCOMES)}")
        return answer

    def to_json(self) -> str:
        return json.dumps({k: v for k, v in self.__dict__.items() if v is not None}, sort_keys=True)


@dataclass(frozen=True)
class ReportFile:
    tenant: str
    filename: str
    sha256: str


@dataclass(frozen=True)
class ReplicaFiles:
    """One replica's evidence: its audit files (rotated ones too), signing key, witness, log."""

    replica: str
    audit_files: tuple[Path, ...]
    key_file: Path
    witness_file: Path | None = None
    process_log: Path | None = None


@dataclass(frozen=True)
class Gap:
    replica: str
    refused: int
    lost: int


@dataclass
class Evidence:
    """Everything a run left, read once."""

    answers: list[Answer]
    reports: list[ReportFile]
    events: list[dict[str, Any]]  # every replica's audit lines, each with its `replica`
    gaps: list[Gap] = field(default_factory=list)


# -- reading the files -------------------------------------------------------------------------


def load_answers(paths: Iterable[Path]) -> list[Answer]:
    """Every client's answer records. A torn last line (a client killed while writing) is an
    error: the clients write whole lines and must not be killed."""
    answers = []
    for path in paths:
        for line in path.read_text(encoding="utf-8").splitlines():
            if line.strip():
                answers.append(Answer.from_json(line))
    return answers


def scan_reports(tenants_dir: Path) -> list[ReportFile]:
    """The report files in every tenant's reports store (`<tenants_dir>/<tenant>/reports`),
    each with the sha256 of its bytes. Anything not named like a report (a filler file a
    fault left) is not a report."""
    found = []
    for tenant_dir in sorted(p for p in tenants_dir.iterdir() if p.is_dir()):
        store = tenant_dir / "reports"
        if not store.is_dir():
            continue
        for path in sorted(store.iterdir()):
            if path.is_file() and not path.is_symlink() and REPORT_NAME.fullmatch(path.name):
                digest = hashlib.sha256(path.read_bytes()).hexdigest()
                found.append(ReportFile(tenant_dir.name, path.name, digest))
    return found


def load_events(replicas: Sequence[ReplicaFiles]) -> list[dict[str, Any]]:
    events = []
    for replica in replicas:
        for path in replica.audit_files:
            for line in path.read_bytes().splitlines():
                if line.strip():
                    event = json.loads(line)
                    event.setdefault("replica", replica.replica)
                    events.append(event)
    return events


def gaps_of(events: Iterable[dict[str, Any]]) -> list[Gap]:
    """The signed gap records in the logs (their signatures are checked by `logs_verify`)."""
    return [
        Gap(e["replica"], int(e["gap"]["refused"]), int(e["gap"]["lost"]))
        for e in events
        if e.get("event") == "audit.gap"
    ]


def gather(answer_files: Iterable[Path], tenants_dir: Path, replicas: Sequence[ReplicaFiles]) -> Evidence:
    events = load_events(replicas)
    return Evidence(load_answers(answer_files), scan_reports(tenants_dir), events, gaps_of(events))


# -- the checks --------------------------------------------------------------------------------


def saves_ok_have_their_files(answers: Sequence[Answer], reports: Sequence[ReportFile]) -> Check:
    """Every save answered `ok` has its file, with exactly the sha256 that was approved."""
    on_disk = {(r.tenant, r.filename): r.sha256 for r in reports}
    bad = [
        a.id
        for a in answers
        if a.op == "save" and a.outcome == "ok" and on_disk.get((a.tenant, a.filename or "")) != a.sha256
    ]
    return _check("saves_ok_have_their_files", bad)


def files_have_answers(answers: Sequence[Answer], reports: Sequence[ReportFile]) -> Check:
    """Every report file on disk was a save answered `ok` or `result_unknown`, with its sha256
    (a file with other bytes than approved, or one written behind an `error`, offends)."""
    told = {
        (a.tenant, a.filename, a.sha256)
        for a in answers
        if a.op == "save" and a.outcome in ("ok", "result_unknown")
    }
    bad = [f"{r.tenant}/{_file_id(r)}" for r in reports if (r.tenant, r.filename, r.sha256) not in told]
    return _check("files_have_answers", bad)


def _file_id(report: ReportFile) -> str:
    # A report's name is the client's choice (a value): offenders are named by a digest of it.
    return hashlib.sha256(report.filename.encode()).hexdigest()[:12]


def approvals_consumed_once(events: Sequence[dict[str, Any]]) -> Check:
    """No approval used twice: across every replica's log, each approval's `approval.consumed`
    lines minus its `approval.released` lines (a consumed approval given back because its
    write was never sent) is at most one."""
    held: Counter[str] = Counter()
    for e in events:
        if e.get("event") == "approval.consumed":
            held[e["approval_id"]] += 1
        elif e.get("event") == "approval.released":
            held[e["approval_id"]] -= 1
    return _check("approvals_consumed_once", [a for a, n in held.items() if n > 1])


def one_terminal_event_per_request(
    answers: Sequence[Answer], events: Sequence[dict[str, Any]], gaps: Sequence[Gap]
) -> Check:
    """Every MCP request has exactly one terminal audit event, across all replicas.

    Requests are matched to events by subject (each client operation has a subject of its
    own). Per subject: the requests that got an HTTP answer must each have one event; those
    that got none (the replica died, the client left) may have one or none, never more; the
    requests refused with 503 "audit unavailable" may have none, as long as each replica's
    signed gap records account for at least as many as the clients saw from it: a refusal
    either never reached the log (the gap's `refused`) or failed while writing one of its
    events (`lost`). Likewise a save answered `result_unknown` may have none when its own
    terminal line was lost (the write was sent, then the audit disk filled): the replica's
    gap records must count it among their `lost`.
    """
    terminal: Counter[str] = Counter(
        e["subject"] for e in events if e.get("event") in TERMINAL_EVENTS and "subject" in e
    )
    terminal_by = Counter(
        (e["subject"], e["replica"]) for e in events if e.get("event") in TERMINAL_EVENTS and "subject" in e
    )
    answered: Counter[str] = Counter()
    unanswered: Counter[str] = Counter()
    refused_by: Counter[str] = Counter()
    for a in answers:
        if a.op not in MCP_OPS:
            continue
        if a.status is None and a.op != "vanish":
            unanswered[a.subject] += 1
        elif a.op == "save" and a.outcome == "result_unknown":
            unanswered[a.subject] += 1
            if terminal_by[(a.subject, a.replica)] == 0:
                refused_by[a.replica] += 1  # its line lost: a gap must count it
        elif a.status == 503 and a.rpc_code == AUDIT_UNAVAILABLE_CODE:
            unanswered[a.subject] += 1  # refused for want of audit: counted in a gap record
            refused_by[a.replica] += 1
        else:
            answered[a.subject] += 1
    bad = [
        s
        for s in answered.keys() | unanswered.keys()
        if not answered[s] <= terminal[s] <= answered[s] + unanswered[s]
    ]
    counted: Counter[str] = Counter()
    for gap in gaps:
        counted[gap.replica] += gap.refused + gap.lost
    bad += [f"gap:{r}" for r, n in refused_by.items() if counted[r] < n]
    return _check("one_terminal_event_per_request", bad)


def logs_verify(replicas: Sequence[ReplicaFiles]) -> Check:
    """Each replica's log files verify with its own key and witness (`docbroker audit verify`):
    chain, signed checkpoints, signed gap records, nothing cut back."""
    bad = []
    for replica in replicas:
        keys = Keyring([load_signing_key(replica.key_file).private.public_key()])
        witnesses = [replica.witness_file] if replica.witness_file is not None else []
        report = verify_logs(list(replica.audit_files), keys, witnesses, replica.replica)
        if not report.ok or not report.files:
            bad.append(replica.replica)
    return _check("logs_verify", bad)


def replicas_answer_after_faults(
    answers: Sequence[Answer], replicas: Iterable[str], limit_s: float = 10.0
) -> Check:
    """Every replica answered a fresh call (`probe`, sent after the last fault ended) with `ok`
    within `limit_s`."""
    served = {a.replica for a in answers if a.op == "probe" and a.outcome == "ok" and a.elapsed_s <= limit_s}
    return _check("replicas_answer_after_faults", [r for r in replicas if r not in served])


def tenants_answer_after_faults(
    answers: Sequence[Answer], tenants: Iterable[str], replicas: Iterable[str], limit_s: float = 10.0
) -> Check:
    """Every tenant answered a fresh call (`probe`) with `ok` within `limit_s` on every replica:
    no tenant is left locked out (a circuit breaker stuck open, a sandbox never replaced)."""
    served = {
        (a.tenant, a.replica)
        for a in answers
        if a.op == "probe" and a.outcome == "ok" and a.elapsed_s <= limit_s
    }
    names = list(replicas)
    return _check(
        "tenants_answer_after_faults", [f"{t}@{r}" for t in tenants for r in names if (t, r) not in served]
    )


def no_unexpected_5xx(answers: Sequence[Answer], allowed: Mapping[str, Iterable[int]]) -> Check:
    """No 5xx answer except those a fault explains: `allowed` maps a phase (the fault running
    when the request was sent) to the statuses it may cause."""
    permitted = {phase: frozenset(codes) for phase, codes in allowed.items()}
    bad = [
        f"{a.id} ({a.status} in {a.phase})"  # what a failed run's reader needs first
        for a in answers
        if a.status is not None and a.status >= 500 and a.status not in permitted.get(a.phase, frozenset())
    ]
    return _check("no_unexpected_5xx", bad)


def no_tracebacks(logs: Iterable[Path]) -> Check:
    """No process log holds a Python traceback (errors are one line with a fixed code)."""
    bad = [path.name for path in logs if path.exists() and TRACEBACK in path.read_text(errors="replace")]
    return _check("no_tracebacks", bad)


def no_hang(answers: Sequence[Answer], limit_s: float) -> Check:
    """Every client call ended within `limit_s` (an answer, an error or the client's own
    timeout: a call with no end would have no record, and is caught by the run's own join)."""
    return _check("no_hang", [a.id for a in answers if a.elapsed_s > limit_s])


def unauthenticated_counted(answers: Sequence[Answer], events: Sequence[dict[str, Any]]) -> Check:
    """The flood of unauthenticated requests was refused (401 or 429, never served, never a
    5xx) and audited: the replicas' `auth.denied` lines without a subject count them
    (one counted line per interval), at most as many as were sent, at least one per replica hit."""
    flood = [a for a in answers if a.op == "flood"]
    bad = [a.id for a in flood if a.status not in (401, 429)]
    sent_to = Counter(a.replica for a in flood if a.status is not None)
    audited: defaultdict[str, int] = defaultdict(int)
    for e in events:
        if e.get("event") == "auth.denied" and "subject" not in e:
            audited[e["replica"]] += int(e.get("count", 1))
    bad += [f"audited:{r}" for r, n in sent_to.items() if not 0 < audited[r] <= n]
    return _check("unauthenticated_counted", bad)


def replica_files(data_dir: Path, replica: str, process_log: Path | None = None) -> ReplicaFiles:
    """A replica's evidence where broker.testing.replicas puts it (`audit-<id>.jsonl` and its
    rotated files, `audit-signing-<id>.key`, `audit-witness-<id>.jsonl` in the data dir)."""
    log = data_dir / f"audit-{replica}.jsonl"
    rotated = rotated_files(log)
    witness = data_dir / f"audit-witness-{replica}.jsonl"
    return ReplicaFiles(
        replica=replica,
        audit_files=(*rotated, log),
        key_file=data_dir / f"audit-signing-{replica}.key",
        witness_file=witness if witness.exists() else None,
        process_log=process_log,
    )


def account(
    evidence: Evidence,
    replicas: Sequence[ReplicaFiles],
    *,
    allowed_5xx: Mapping[str, Iterable[int]],
    call_limit_s: float,
    fresh_limit_s: float = 10.0,
) -> list[Check]:
    """Every check, in a fixed order."""
    logs = [r.process_log for r in replicas if r.process_log is not None]
    return [
        saves_ok_have_their_files(evidence.answers, evidence.reports),
        files_have_answers(evidence.answers, evidence.reports),
        approvals_consumed_once(evidence.events),
        one_terminal_event_per_request(evidence.answers, evidence.events, evidence.gaps),
        logs_verify(replicas),
        replicas_answer_after_faults(evidence.answers, [r.replica for r in replicas], fresh_limit_s),
        no_unexpected_5xx(evidence.answers, allowed_5xx),
        no_tracebacks(logs),
        no_hang(evidence.answers, call_limit_s),
        unauthenticated_counted(evidence.answers, evidence.events),
    ]


def summary(
    run: str,
    evidence: Evidence,
    checks: Sequence[Check],
    faults: Mapping[str, bool],
    *,
    tenants: int,
    clients: int,
    duration_s: float,
) -> dict[str, Any]:
    """The run's summary (DOCBROKER_RELIABILITY_OUT/<run>.json), read by bench's report."""
    answers = evidence.answers
    return {
        "run": run,
        "tenants": tenants,
        "clients": clients,
        "requests": len(answers),
        "saves_ok": sum(1 for a in answers if a.op == "save" and a.outcome == "ok"),
        "result_unknown": sum(1 for a in answers if a.outcome == "result_unknown"),
        "duration_s": round(duration_s, 3),
        "faults": [{"name": name, "entered": entered} for name, entered in faults.items()],
        "checks": [c.as_json() for c in checks],
    }
