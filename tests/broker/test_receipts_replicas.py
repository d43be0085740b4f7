"""A receipt for every report (issue 37), end to end: real brokers write a report approved by
two people (the shipped "reports over 4 kB need two approvers" policy), `docbroker audit
receipt` makes its receipt from the approvals store and the replicas' logs, and `docbroker
audit verify-receipt` checks it offline with nothing but the replicas' public keys and the
written report. Two replicas on PostgreSQL (requested, decided and consumed on different
replicas, each log with its own key), and one broker on SQLite."""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from broker.audit.sink import rotated_files
from broker.testing import ROOT
from broker.testing.replicas import Replica, make_replicas
from tests.broker.pgtest import fresh_schema
from tests.broker.support import (
    APPROVER_SCOPE,
    WRITE_SCOPE,
    call_modern,
    open_http,
    tool_status,
    unique,
    wait_for,
)

EXAMPLE = ROOT / "policies" / "examples" / "big-reports-two-approvers.cedar"
BIG = "quarterly numbers, all of them\n" * 200  # over 4 kB: two approvers
FAST_CHECKPOINTS = {"DOCBROKER_AUDIT_CHECKPOINT_INTERVAL": "0.2"}  # a written report's lines soon signed


def docbroker(replica: Replica, *args: str | Path) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(
        [sys.executable, "-m", "broker", *map(str, args)],
        cwd=ROOT, env=replica.env, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert "Traceback" not in result.stderr, result.stderr
    return result


def save(replica: Replica, token: str, name: str) -> dict[str, Any]:
    with open_http(replica, token) as http:
        return tool_status(call_modern(http, "save_report", {"filename": name, "content": BIG}))


def approve(replica: Replica, who: str, approval_id: str) -> dict[str, Any]:
    with open_http(replica, replica.token("acme", who, APPROVER_SCOPE)) as http:
        assert http.get(f"/v1/approvals/{approval_id}").status_code == 200  # read first
        answer = http.post(f"/v1/approvals/{approval_id}/approve")
        assert answer.status_code == 200, answer.text
        body: dict[str, Any] = answer.json()
        return body


@pytest.mark.parametrize("backend", ["postgresql", "sqlite"])
def test_a_two_person_report_yields_a_receipt_that_verifies_offline(tmp_path: Path, backend: str) -> None:
    with fresh_schema() as url:
        replicas = (
            make_replicas(tmp_path, 2, database_url=url, env=FAST_CHECKPOINTS)
            if backend == "postgresql"
            else make_replicas(tmp_path, 1, env=FAST_CHECKPOINTS)
        )
        members = list(replicas)
        first, last = members[0], members[-1]
        shutil.copy(EXAMPLE, Path(first.env["DOCBROKER_POLICIES_DIR"]) / EXAMPLE.name)
        with replicas:
            rita = first.token("acme", "rita", WRITE_SCOPE)
            name = unique()
            approval_id = save(first, rita, name)["data"]["approval_id"]
            assert approve(first, "carol", approval_id)["state"] == "pending"
            with open_http(first, rita) as http:  # not written yet: no receipt
                assert http.get(f"/v1/approvals/{approval_id}/receipt").json() == {"error": "not_written"}
            assert approve(last, "dave", approval_id)["state"] == "approved"
            assert save(last, rita, name)["status"] == "ok"

            # Over REST, from either replica (their logs share a folder), for the requester
            # and the tenant's approvers; nobody else. 409 until the last lines are signed.
            served: dict[str, Any] = {}

            def receipt_served() -> bool:
                with open_http(first, rita) as http:
                    answer = http.get(f"/v1/approvals/{approval_id}/receipt")
                served.update(answer.json())
                return answer.status_code == 200

            assert wait_for(receipt_served, timeout=30), served
            assert served["approval"]["filename"] == name and len(served["decisions"]) == 2
            with open_http(last, last.token("acme", "mallory", WRITE_SCOPE)) as http:
                assert http.get(f"/v1/approvals/{approval_id}/receipt").status_code == 403
            token_file = tmp_path / "carol.token"
            token_file.write_text(last.token("acme", "carol", APPROVER_SCOPE))
            shown = docbroker(
                last,
                "approvals",
                "show",
                approval_id,
                "--receipt",
                "--url",
                last.url,
                "--token-file",
                token_file,
            )
            assert shown.returncode == 0, shown.stderr
            assert json.loads(shown.stdout)["approval"]["id"] == approval_id
            (tmp_path / "served.json").write_text(shown.stdout)
        # Stopped: each log's last lines are under its closing checkpoint.
        report = first.reports("acme") / name
        assert report.read_text() == BIG
        logs = [p for r in members for p in [*rotated_files(r.audit_file), r.audit_file]]
        for member in members:  # the audit is name-only: neither the file name nor the content's hash
            data = member.audit_file.read_bytes()
            sha256 = hashlib.sha256(BIG.encode()).hexdigest().encode()
            assert name.encode() not in data and b"quarterly" not in data and sha256 not in data

        made = docbroker(first, "audit", "receipt", "--tenant", "acme", approval_id, *logs)
        assert made.returncode == 0, made.stderr
        receipt = json.loads(made.stdout)
        assert receipt["approval"]["filename"] == name and receipt["approval"]["required"] == 2
        assert [d["approver"]["subject"] for d in receipt["decisions"]] == ["carol", "dave"]
        assert all(d["approver"]["issuer"] for d in receipt["decisions"])
        assert receipt["approval"]["requester"]["subject"] == "rita" and receipt["write"]["outcome"] == "ok"
        assert len({p["checkpoint"]["replica"] for p in receipt["proofs"]}) == len(members)

        keys: list[str | Path] = []
        for member in members:
            pem = tmp_path / f"{member.replica_id}.pem"
            printed = docbroker(member, "audit", "key")
            assert printed.returncode == 0, printed.stderr
            pem.write_text(printed.stdout)
            keys += ["--key", pem]
        path = tmp_path / "receipt.json"
        path.write_text(made.stdout)
        verified = docbroker(first, "audit", "verify-receipt", path, *keys, "--report", report)
        assert verified.returncode == 0, verified.stdout
        assert "carol" in verified.stdout and "dave" in verified.stdout and "byte for byte" in verified.stdout

        # The receipt the API served checks as well.
        again = docbroker(
            first, "audit", "verify-receipt", tmp_path / "served.json", *keys, "--report", report
        )
        assert again.returncode == 0, again.stdout
        # The joint: one approval, the same story from the API and from the logs (the proofs may
        # differ: the CLI's came after the brokers' closing checkpoints).
        api_receipt = json.loads((tmp_path / "served.json").read_text())
        told = ("approval", "decisions", "write")
        assert {k: api_receipt[k] for k in told} == {k: receipt[k] for k in told}

        changed = tmp_path / name
        changed.write_text(BIG[:-1] + "!")
        refused = docbroker(first, "audit", "verify-receipt", path, *keys, "--report", changed)
        assert refused.returncode == 1 and "NOT the approved" in refused.stdout
        unknown = docbroker(first, "audit", "receipt", "--tenant", "acme", "0" * 32, *logs)
        assert unknown.returncode == 1 and "no such approval" in unknown.stderr
