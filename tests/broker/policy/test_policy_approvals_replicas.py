"""The two-person rule across replicas (issue 28 item 2): two real brokers on one PostgreSQL
database, the shipped example "reports over 4 kB need two approvers" in their shared policies
folder. The approvers' decisions land on different replicas, and each replica counts the
other's: one yes leaves the report waiting everywhere, the second — on the other replica, or
at the same moment as the first — lets it be written, once."""

from __future__ import annotations

import shutil
import threading
from pathlib import Path
from typing import Any

from broker.testing import ROOT
from broker.testing.replicas import Replica, make_replicas
from tests.broker.pgtest import fresh_schema
from tests.broker.support import APPROVER_SCOPE, WRITE_SCOPE, call_modern, open_http, tool_status, unique

EXAMPLE = ROOT / "policies" / "examples" / "big-reports-two-approvers.cedar"
BIG = "x" * 5000


def save(replica: Replica, token: str, name: str) -> dict[str, Any]:
    with open_http(replica, token) as http:
        return tool_status(call_modern(http, "save_report", {"filename": name, "content": BIG}))


def approve(replica: Replica, who: str, approval_id: str) -> Any:
    with open_http(replica, replica.token("acme", who, APPROVER_SCOPE)) as http:
        assert http.get(f"/v1/approvals/{approval_id}").status_code == 200  # read first
        return http.post(f"/v1/approvals/{approval_id}/approve")


def test_two_approvers_on_two_replicas(tmp_path: Path) -> None:
    with fresh_schema() as url:
        replicas = make_replicas(tmp_path, 2, database_url=url)
        a, b = replicas
        shutil.copy(EXAMPLE, Path(a.env["DOCBROKER_POLICIES_DIR"]) / EXAMPLE.name)
        with replicas:
            rita = a.token("acme", "rita", WRITE_SCOPE)
            name = unique()
            approval_id = save(a, rita, name)["data"]["approval_id"]
            first = approve(a, "carol", approval_id)
            assert (first.json()["state"], first.json()["approvals"], first.json()["required"]) == (
                "pending",
                1,
                2,
            )
            waiting = save(b, rita, name)  # the other replica sees one yes of two: it waits
            assert waiting["status"] == "waiting_approval" and waiting["data"]["approval_id"] == approval_id
            assert approve(b, "carol", approval_id).status_code == 409  # carol counted once, everywhere
            second = approve(b, "dave", approval_id)
            assert (second.json()["state"], second.json()["approvals"]) == ("approved", 2)
            assert save(a, rita, name)["status"] == "ok"

            # Two approvers at the same moment, one on each replica: both yeses count.
            other = unique()
            other_id = save(b, rita, other)["data"]["approval_id"]
            start = threading.Barrier(2)
            answers: dict[str, Any] = {}

            def decide(replica: Replica, who: str) -> None:
                start.wait()
                answers[who] = approve(replica, who, other_id)

            threads = [threading.Thread(target=decide, args=p) for p in ((a, "erin"), (b, "frank"))]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            got = sorted((r.status_code, r.json()["state"], r.json()["approvals"]) for r in answers.values())
            assert got == [(200, "approved", 2), (200, "pending", 1)]
            assert save(a, rita, other)["status"] == "ok"
        assert (a.reports("acme") / name).read_text() == BIG
        decided = [e for r in replicas for e in r.audit_events() if e["event"] == "approval.decided"]
        counted = sorted(
            (e["replica"], e["subject"], e["reason"]) for e in decided if e["approval_id"] == approval_id
        )
        assert counted == [
            ("a", "carol", "more_approvers_required"),
            ("b", "carol", "already_decided"),
            ("b", "dave", "decided"),
        ]
        assert all(e.get("policy_hash") and e.get("issuer") for e in decided if e["outcome"] == "ok")
