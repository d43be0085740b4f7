"""The reliability run's accounting (tests/reliability/accounting.py) over small real files:
answer records written as JSON Lines, report files in a tenants folder, audit logs written by
the broker's own AuditLog with a signing key and a witness (and a real gap record after a
disk that filled up). Each check is shown passing on a clean run and failing on the defect it
is there to catch."""

from __future__ import annotations

import asyncio
import hashlib
import time
from pathlib import Path

import pytest

from broker.audit import AuditLog, AuditSinkError
from broker.audit.checkpoint import create_signing_key, load_signing_key
from broker.audit.log import Evidence as LogEvidence
from broker.audit.notary import Notary
from broker.audit.sink import FileSink
from broker.audit.witness import FileCopy
from tests.reliability import accounting as acc
from tests.reliability.accounting import Answer, Gap, ReportFile

CONTENT = "# report\n\nbody\n"
SHA = hashlib.sha256(CONTENT.encode()).hexdigest()


def save(id: str = "c1-1", outcome: str = "ok", status: int | None = 200, **kw: object) -> Answer:
    values: dict[str, object] = {
        "id": id, "subject": id.split("-")[0] + "-op", "tenant": "t01", "op": "save",
        "outcome": outcome, "replica": "a", "status": status, "filename": "r-1.md", "sha256": SHA,
    }  # fmt: skip
    values.update(kw)
    return Answer(**values)  # type: ignore[arg-type]


def request(id: str, subject: str, op: str = "read", status: int | None = 200, **kw: object) -> Answer:
    values: dict[str, object] = {
        "id": id, "subject": subject, "tenant": "t01", "op": op,
        "outcome": "ok" if status == 200 else "error", "replica": "a", "status": status,
    }  # fmt: skip
    values.update(kw)
    return Answer(**values)  # type: ignore[arg-type]


# -- answer records and report files -----------------------------------------------------------


def test_answers_round_trip_through_jsonl_and_refuse_an_unknown_outcome(tmp_path: Path) -> None:
    answers = [save(), request("c2-1", "c2-op", status=None, elapsed_s=1.5)]
    path = tmp_path / "client-1.jsonl"
    path.write_text("".join(a.to_json() + "\n" for a in answers))
    assert acc.load_answers([path]) == answers
    path.write_text('{"id":"x","subject":"s","tenant":"t","op":"read","outcome":"maybe","replica":"a"}\n')
    with pytest.raises(ValueError, match="outcome"):
        acc.load_answers([path])


def tenants_with(tmp_path: Path, files: dict[str, str]) -> Path:
    store = tmp_path / "tenants" / "t01" / "reports"
    store.mkdir(parents=True)
    for name, text in files.items():
        (store / name).write_text(text)
    (tmp_path / "tenants" / "t02").mkdir()  # a tenant that saved nothing yet
    return tmp_path / "tenants"


def test_every_ok_save_has_its_file_with_the_approved_bytes(tmp_path: Path) -> None:
    reports = acc.scan_reports(tenants_with(tmp_path, {"r-1.md": CONTENT, ".filler": "x" * 10}))
    assert reports == [ReportFile("t01", "r-1.md", SHA)]  # a fault's filler is no report
    assert acc.saves_ok_have_their_files([save()], reports).passed
    changed = acc.scan_reports(tenants_with(tmp_path / "b", {"r-1.md": CONTENT + "tampered"}))
    check = acc.saves_ok_have_their_files([save()], changed)
    assert (check.passed, check.count, check.offenders) == (False, 1, ("c1-1",))
    missing = acc.saves_ok_have_their_files([save(), save("c1-2", filename="r-2.md")], reports)
    assert missing.offenders == ("c1-2",)


def test_every_file_has_an_ok_or_result_unknown_answer(tmp_path: Path) -> None:
    reports = acc.scan_reports(tenants_with(tmp_path, {"r-1.md": CONTENT}))
    assert acc.files_have_answers([save()], reports).passed
    assert acc.files_have_answers([save(outcome="result_unknown", status=None)], reports).passed
    behind_an_error = acc.files_have_answers([save(outcome="error", status=503)], reports)
    assert not behind_an_error.passed and behind_an_error.count == 1
    # Offenders are named by a digest of the report's name, never the name itself.
    assert "r-1.md" not in behind_an_error.offenders[0] and behind_an_error.offenders[0].startswith("t01/")
    other_bytes = acc.files_have_answers([save(sha256="0" * 64)], reports)
    assert not other_bytes.passed


# -- audit logs: real ones, signed, with a witness ---------------------------------------------


class FlakyDisk(FileSink):
    """A real file whose writes fail while `full` is set, like a disk that filled up."""

    full = False

    def write(self, data: bytes) -> None:
        if self.full:
            raise OSError(28, "No space left on device")
        super().write(data)


def event(subject: str, request_id: str, event: str = "mcp.request", **kw: object) -> dict[str, object]:
    fields: dict[str, object] = {
        "request_id": request_id,
        "tenant": "t01",
        "subject": subject,
        "outcome": "ok",
    }
    fields.update(kw)
    return {"event": event, **fields}


def write_replica(
    tmp_path: Path, replica: str, events: list[dict[str, object]], *, gap: bool = False
) -> acc.ReplicaFiles:
    """A replica's data dir as broker.testing.replicas lays it out, written by the real AuditLog.
    With `gap`, the disk fills after the first event: one request is refused, then it recovers."""
    files = acc.replica_files(tmp_path, replica, tmp_path / f"{replica}.log")
    create_signing_key(files.key_file)
    sink = FlakyDisk(tmp_path / f"audit-{replica}.jsonl")
    evidence = LogEvidence(
        notary=Notary(load_signing_key(files.key_file), replica, time.time_ns),
        witness=FileCopy(tmp_path / f"audit-witness-{replica}.jsonl"),
    )

    async def write() -> None:
        log = await AuditLog.with_sink(sink, evidence=evidence)
        async with log:
            for i, fields in enumerate(events):
                if gap and i == 1:
                    sink.full = True
                    with pytest.raises(AuditSinkError):
                        await log.emit("mcp.request", **dict(event("lost", "lost-1")))
                    with pytest.raises(AuditSinkError):
                        log.check()  # one request refused while the disk is full
                    sink.full = False
                name = str(fields["event"])
                await log.emit(name, **{k: v for k, v in fields.items() if k != "event"})

    asyncio.run(write())
    (tmp_path / f"{replica}.log").write_text("INFO started\n")
    return acc.replica_files(tmp_path, replica, tmp_path / f"{replica}.log")


def test_logs_verify_with_key_and_witness_and_catch_an_edit(tmp_path: Path) -> None:
    a = write_replica(tmp_path / "a", "a", [event("s1", "r1"), event("s2", "r2")], gap=True)
    b = write_replica(tmp_path / "b", "b", [event("s3", "r3")])
    assert a.witness_file is not None and a.audit_files[-1].exists()
    assert acc.logs_verify([a, b]).passed
    events = acc.load_events([a, b])
    assert acc.gaps_of(events) == [Gap("a", 1, 1)]
    assert {e["replica"] for e in events} == {"a", "b"}
    log = a.audit_files[-1]
    log.write_bytes(log.read_bytes().replace(b'"subject":"s2"', b'"subject":"s9"'))
    check = acc.logs_verify([a, b])
    assert (check.passed, check.offenders) == (False, ("a",))


def test_logs_verify_catches_a_log_cut_behind_its_witness(tmp_path: Path) -> None:
    a = write_replica(tmp_path, "a", [event("s1", "r1"), event("s2", "r2"), event("s3", "r3")])
    log = a.audit_files[-1]
    lines = log.read_bytes().splitlines(keepends=True)
    log.write_bytes(b"".join(lines[:2]))  # the tail after the first checkpoint, and the final one, gone
    assert not acc.logs_verify([a]).passed


def test_an_approval_consumed_twice_is_caught_and_a_release_gives_it_back(tmp_path: Path) -> None:
    consumed = event("s1", "r1", "approval.consumed", approval_id="ap1")
    released = event("s1", "r1", "approval.released", approval_id="ap1")
    again = event("s2", "r2", "approval.consumed", approval_id="ap1")
    a = write_replica(tmp_path / "a", "a", [consumed, released])
    b = write_replica(tmp_path / "b", "b", [again])
    assert acc.approvals_consumed_once(acc.load_events([a, b])).passed
    c = write_replica(tmp_path / "c", "c", [dict(again, request_id="r3")])
    check = acc.approvals_consumed_once(acc.load_events([a, b, c]))
    assert (check.passed, check.offenders) == (False, ("ap1",))


def test_one_terminal_event_per_request(tmp_path: Path) -> None:
    a = write_replica(
        tmp_path / "a",
        "a",
        [
            event("op1", "r1"),  # the ask
            event("op1", "r2"),  # the save
            event("op2", "r3", "policy.denied", outcome="denied"),
            event("op3", "r4"),  # a client that left: audited anyway
            event("op4", "r5", "approval.consumed", approval_id="ap1"),  # not terminal
        ],
    )
    events = acc.load_events([a])
    answers = [
        request("1", "op1", "save.ask"),
        request("2", "op1", "save"),
        request("3", "op2", status=429),
        request("4", "op3", "vanish", status=None),  # seen arriving, then its client left: audited
        request("6", "op4", "save", status=None),  # the replica died mid-save: no event, allowed
        request("7", "op5", status=503, rpc_code=acc.AUDIT_UNAVAILABLE_CODE),  # refused, in a gap
    ]
    assert acc.one_terminal_event_per_request(answers, events, [Gap("a", 1, 0)]).passed
    assert acc.one_terminal_event_per_request(answers, events, [Gap("a", 0, 1)]).passed  # lost, not refused
    # A refusal the gap records do not count.
    no_gap = acc.one_terminal_event_per_request(answers, events, [])
    assert (no_gap.passed, no_gap.offenders) == (False, ("gap:a",))
    # An answered request with no event; a request audited twice.
    missing = acc.one_terminal_event_per_request([*answers, request("8", "op6")], events, [Gap("a", 1, 0)])
    assert missing.offenders == ("op6",)
    b = write_replica(tmp_path / "b", "b", [event("op2", "r9", "policy.denied", outcome="denied")])
    twice = acc.one_terminal_event_per_request(answers, acc.load_events([a, b]), [Gap("a", 1, 0)])
    assert twice.offenders == ("op2",)
    # A save answered result_unknown whose own line was lost: only a gap's `lost` explains it.
    unknown = [request("10", "op8", "save", status=200, outcome="result_unknown")]
    assert acc.one_terminal_event_per_request(unknown, events, [Gap("a", 0, 1)]).passed
    assert acc.one_terminal_event_per_request(unknown, events, []).offenders == ("gap:a",)
    # A request seen arriving whose client left must be audited all the same.
    left = acc.one_terminal_event_per_request([request("9", "op7", "vanish", status=None)], events, [])
    assert left.offenders == ("op7",)


def test_unauthenticated_flood_is_refused_and_counted(tmp_path: Path) -> None:
    counted = {"event": "auth.denied", "request_id": "f1", "outcome": "denied", "count": 3}
    a = write_replica(tmp_path, "a", [counted])
    flood = [request(f"f{i}", f"flood{i}", "flood", status=401) for i in range(4)]
    assert acc.unauthenticated_counted(flood, acc.load_events([a])).passed
    served = acc.unauthenticated_counted([*flood, request("f9", "flood9", "flood", status=500)], [])
    assert not served.passed and "f9" in served.offenders and "audited:a" in served.offenders


# -- the rest ----------------------------------------------------------------------------------


def test_fresh_calls_5xx_tracebacks_and_hangs(tmp_path: Path) -> None:
    probes = [
        request("p1", "pa", "probe", elapsed_s=0.2),
        request("p2", "pb", "probe", replica="b", elapsed_s=12),
    ]
    late = acc.replicas_answer_after_faults(probes, ["a", "b"])
    assert (late.passed, late.offenders) == (False, ("b",))
    assert acc.replicas_answer_after_faults(probes, ["a"]).passed
    locked = acc.tenants_answer_after_faults(probes, ["t01", "t02"], ["a"])
    assert (locked.passed, locked.offenders) == (False, ("t02@a",))

    during = request("x1", "sx", status=503, phase="postgres_stopped")
    assert acc.no_unexpected_5xx([during], {"postgres_stopped": {503}}).passed
    unexpected = acc.no_unexpected_5xx([during], {"docker_restarted": {503}})
    assert unexpected.offenders == ("x1 (503 in postgres_stopped)",)
    assert not acc.no_unexpected_5xx([request("x2", "sy", status=500)], {"steady": {503}}).passed

    clean, broken = tmp_path / "a.log", tmp_path / "b.log"
    clean.write_text("INFO ok\nERROR one line\n")
    broken.write_text('Traceback (most recent call last):\n  File "x", line 1\n')
    assert acc.no_tracebacks([clean, tmp_path / "absent.log"]).passed
    assert acc.no_tracebacks([clean, broken]).offenders == ("b.log",)

    assert acc.no_hang([request("h1", "sh", elapsed_s=3.0)], 30).passed
    assert acc.no_hang([request("h2", "sh", elapsed_s=31.0)], 30).offenders == ("h2",)


def test_account_and_summary_over_a_small_run(tmp_path: Path) -> None:
    tenants = tenants_with(tmp_path, {"r-1.md": CONTENT})
    a = write_replica(tmp_path, "a", [event("c1-op", "r1"), event("pa", "r2")])
    answers = [save(), request("p1", "pa", "probe", elapsed_s=0.1)]
    answer_file = tmp_path / "answers.jsonl"
    answer_file.write_text("".join(x.to_json() + "\n" for x in answers))
    evidence = acc.gather([answer_file], tenants, [a])
    checks = acc.account(evidence, [a], allowed_5xx={}, call_limit_s=30)
    by_name = {c.name: c for c in checks}
    assert len(by_name) == len(checks) == 10
    assert all(c.passed for c in checks if c.name != "unauthenticated_counted"), checks
    assert by_name["unauthenticated_counted"].passed  # no flood in this run: nothing to count
    doc = acc.summary(
        "docker", evidence, checks, {"sandbox_killed": True}, tenants=1, clients=1, duration_s=1.23456
    )
    assert doc == {
        "run": "docker",
        "tenants": 1,
        "clients": 1,
        "requests": 2,
        "saves_ok": 1,
        "result_unknown": 0,
        "duration_s": 1.235,
        "faults": [{"name": "sandbox_killed", "entered": True}],
        "checks": [c.as_json() for c in checks],
    }
