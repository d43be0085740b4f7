"""`docbroker approvals list|show|approve|deny` through a real broker (issue 29 item 1): the
CLI is a client of /v1/approvals, so it meets the API's rules and audit — another tenant's
id is not found, the requester may not approve their own report where the policy says so, a
decision is audited with the approver's subject, a second decision is refused — and the
token never appears in its output or on its command line."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

from broker.testing import ROOT, Broker
from tests.broker.cli.cli_helpers import cli, json_out, one_line_error, token_file
from tests.broker.support import (
    APPROVER_SCOPE,
    WRITE_SCOPE,
    call_modern,
    events_since,
    last_seq,
    open_http,
    tool_status,
    unique,
)

CONTENT = "# Quarterly\nnumbers go here\n"


def open_approval(broker: Broker, tenant: str, subject: str = "alice") -> str:
    with open_http(broker, broker.token(tenant=tenant, subject=subject, scope=WRITE_SCOPE)) as http:
        status = tool_status(
            call_modern(http, "save_report", {"filename": unique("cli"), "content": CONTENT})
        )
    assert status["status"] == "waiting_approval", status
    return str(status["data"]["approval_id"])


def approvals(broker: Broker, token: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return cli(broker.env, "approvals", *args, "--url", broker.url, "--token-file", str(token))


@pytest.fixture
def carol(broker: Broker, tmp_path: Path) -> Path:
    return token_file(tmp_path, broker.token(tenant="acme", subject="carol", scope=APPROVER_SCOPE))


def test_list_show_approve_as_the_page_would(broker: Broker, carol: Path) -> None:
    approval_id = open_approval(broker, "acme")
    listed = json_out(approvals(broker, carol, "list", "--json", "--limit", "1000"))
    assert approval_id in [a["approval_id"] for a in listed["approvals"]]
    assert all("content" not in a for a in listed["approvals"])  # the listing carries metadata only

    table = approvals(broker, carol, "list")
    assert table.returncode == 0 and approval_id in table.stdout

    shown = json_out(approvals(broker, carol, "show", approval_id, "--json"))
    assert shown["content"] == CONTENT and shown["state"] == "pending"

    seq = last_seq(broker)
    sha = hashlib.sha256(CONTENT.encode()).hexdigest()  # what carol read, as `show` printed it
    decided = json_out(approvals(broker, carol, "approve", approval_id, "--sha256", sha, "--json"))
    assert (decided["state"], decided["decided_by"]) == ("approved", "carol")
    audited = [e for e in events_since(broker, seq) if e["event"] == "approval.decided"]
    assert [(e["subject"], e["approval_id"], e["decision"]) for e in audited] == [
        ("carol", approval_id, "approved")
    ]

    again = one_line_error(approvals(broker, carol, "deny", approval_id), 1)
    assert again == "docbroker approvals deny: already decided"


def test_deny(broker: Broker, carol: Path) -> None:
    approval_id = open_approval(broker, "acme")
    denied = json_out(approvals(broker, carol, "deny", approval_id, "--json"))
    assert denied["state"] == "denied"


def test_the_requester_may_not_approve_their_own_where_the_policy_says_so(
    broker: Broker, tmp_path: Path
) -> None:
    approval_id = open_approval(broker, "strict", subject="alice")
    alice = token_file(tmp_path, broker.token(tenant="strict", subject="alice", scope=APPROVER_SCOPE))
    sha = hashlib.sha256(CONTENT.encode()).hexdigest()
    line = one_line_error(approvals(broker, alice, "approve", approval_id, "--sha256", sha), 1)
    assert "requester may not approve" in line


def test_another_tenants_approval_is_not_found(broker: Broker, tmp_path: Path) -> None:
    approval_id = open_approval(broker, "acme")
    globex = token_file(tmp_path, broker.token(tenant="globex", subject="mallory", scope=APPROVER_SCOPE))
    for verb in ("show", "approve", "deny"):
        line = one_line_error(approvals(broker, globex, verb, approval_id), 1)
        assert line.endswith("no such approval for this token's tenant")


def test_a_token_without_the_scope_is_refused_and_never_echoed(broker: Broker, tmp_path: Path) -> None:
    token = broker.token(tenant="acme", subject="bob", scope="docs:read")
    result = approvals(broker, token_file(tmp_path, token), "list")
    line = one_line_error(result, 1)
    assert "refused" in line
    assert token not in result.stdout + result.stderr


def test_bad_inputs_are_usage_errors(broker: Broker, carol: Path, tmp_path: Path) -> None:
    assert one_line_error(approvals(broker, carol, "show", "../../v1/x"), 2)
    missing = tmp_path / "missing.token"
    line = one_line_error(approvals(broker, missing, "list"), 2)
    assert str(missing) not in line
    two = token_file(tmp_path, "one two", "two.token")
    assert one_line_error(approvals(broker, two, "list"), 2)


def test_an_unreachable_broker_is_one_line(broker: Broker, carol: Path) -> None:
    result = cli(broker.env, "approvals", "list", "--url", "http://127.0.0.1:9", "--token-file", str(carol))
    line = one_line_error(result, 1)
    assert line.startswith("docbroker approvals list: cannot reach the broker") and "127.0.0.1" not in line


def test_the_token_can_come_from_stdin(broker: Broker) -> None:
    token = broker.token(tenant="acme", subject="carol", scope=APPROVER_SCOPE)
    result = cli(
        broker.env, "approvals", "list", "--json", "--url", broker.url, "--token-file", "-", stdin=token
    )
    assert "approvals" in json_out(result)


def test_a_report_is_shown_never_obeyed_by_the_terminal(broker: Broker, carol: Path) -> None:
    hostile = "title\x1b]0;owned\x07 clear\x1b[2J bidi\u202e done"
    with open_http(broker, broker.token(tenant="acme", subject="alice", scope=WRITE_SCOPE)) as http:
        status = tool_status(
            call_modern(http, "save_report", {"filename": unique("esc"), "content": hostile})
        )
    approval_id = str(status["data"]["approval_id"])
    shown = approvals(broker, carol, "show", approval_id)
    assert shown.returncode == 0, shown.stderr
    out = shown.stdout
    assert "\x1b" not in out and "\x07" not in out and "\u202e" not in out
    assert "title\\x1b]0;owned\\x07 clear\\x1b[2J bidi\\u202e done" in out


# -- `approve` shows the content and asks before it approves (issue 34 item 9) ----------------


def test_approve_without_a_terminal_needs_the_hash_of_what_was_read(broker: Broker, carol: Path) -> None:
    approval_id = open_approval(broker, "acme")
    asked = one_line_error(approvals(broker, carol, "approve", approval_id), 2)
    assert "--sha256" in asked
    wrong = one_line_error(approvals(broker, carol, "approve", approval_id, "--sha256", "0" * 64), 1)
    assert wrong.endswith("nothing was approved")
    with open_http(broker, broker.token(tenant="acme", subject="carol", scope=APPROVER_SCOPE)) as http:
        assert http.get(f"/v1/approvals/{approval_id}").json()["state"] == "pending"
    sha = hashlib.sha256(CONTENT.encode()).hexdigest()
    approved = approvals(broker, carol, "approve", approval_id, "--sha256", sha)
    assert approved.returncode == 0, approved.stderr
    assert "numbers go here" in approved.stdout and "approved" in approved.stdout  # shown, then decided


def run_on_a_terminal(broker: Broker, token: Path, approval_id: str, answer: str) -> tuple[int, str]:
    """`approve` with a terminal for stdin (a pty), `answer` typed at its prompt."""
    leader, follower = os.openpty()
    args = ["approvals", "approve", approval_id, "--url", broker.url, "--token-file", str(token)]
    with subprocess.Popen(
        [sys.executable, "-m", "broker", *args], cwd=ROOT, env=broker.env, stdin=follower,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    ) as proc:  # fmt: skip
        os.close(follower)
        os.write(leader, answer.encode() + b"\n")
        out, err = proc.communicate(timeout=60)
    os.close(leader)
    return proc.returncode, out + err


def test_approve_on_a_terminal_shows_the_content_and_asks(broker: Broker, carol: Path) -> None:
    approval_id = open_approval(broker, "acme")
    code, said = run_on_a_terminal(broker, carol, approval_id, "n")
    assert code == 1 and "numbers go here" in said and "Approve exactly these" in said
    assert "not approved" in said
    code, said = run_on_a_terminal(broker, carol, approval_id, "y")
    assert code == 0, said
    with open_http(broker, broker.token(tenant="acme", subject="carol", scope=APPROVER_SCOPE)) as http:
        assert http.get(f"/v1/approvals/{approval_id}").json()["state"] == "approved"


def test_an_approve_by_someone_never_shown_the_content_is_refused(broker: Broker) -> None:
    approval_id = open_approval(broker, "acme")
    with open_http(broker, broker.token(tenant="acme", subject="dora", scope=APPROVER_SCOPE)) as http:
        refused = http.post(f"/v1/approvals/{approval_id}/approve")
        assert (refused.status_code, refused.json()) == (409, {"error": "content_not_viewed"})
        assert http.get(f"/v1/approvals/{approval_id}").status_code == 200
        assert http.post(f"/v1/approvals/{approval_id}/approve").json()["state"] == "approved"
    refusals = [
        e for e in broker.audit_events()
        if e["event"] == "approval.decided" and e.get("approval_id") == approval_id and e["outcome"] != "ok"
    ]  # fmt: skip
    assert [e["reason"] for e in refusals] == ["content_not_viewed"]
