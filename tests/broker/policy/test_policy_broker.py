"""Cedar decides through a real broker (DESIGN §14): the shipped example "contractors may search
but not read hr-* documents" loaded beside today's TOML, with real tokens whose groups claim
names the caller's groups; every decision-bearing audit line names the determining policy ids
and the set's hash, and no document name (a canary) reaches the audit log or the logs.

A broker of its own: the shared one runs without any .cedar file.
"""

from __future__ import annotations

import secrets
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from broker.policy import Policies, PolicyEngine
from broker.testing import ROOT, Broker, make_broker
from tests.broker.policy.policy_support import broker_with, set_hash
from tests.broker.support import READ_SCOPE, call_modern, open_http, rpc_reply, tool_status

EXAMPLE = ROOT / "policies" / "examples" / "contractors-no-hr.cedar"
FORBID_ID = "examples.contractors.no_hr_documents"


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Broker]:
    with broker_with(tmp_path_factory.mktemp("cedar-broker"), EXAMPLE) as b:
        yield b


def lines_of(broker: Broker, request_ids: set[str]) -> list[dict[str, object]]:
    return [e for e in broker.audit_events() if e.get("request_id") in request_ids]


def test_contractors_search_but_do_not_read_hr_documents(broker: Broker) -> None:
    canary = f"hr-cnry{secrets.token_hex(6)}"  # the document's name: decided on, never logged
    sources = broker.sources("acme")
    sources.mkdir(parents=True, exist_ok=True)
    (sources / f"{canary}.md").write_text("salaries: confidential\n")
    (sources / "plan.md").write_text("the plan\n")
    contractor = broker.token("acme", "carol", READ_SCOPE, groups=["contractors"])
    employee = broker.token("acme", "dave", READ_SCOPE, groups=["employees"])

    with open_http(broker, contractor) as http:
        found = tool_status(call_modern(http, "search_documents", {"query": "salaries", "max_results": 1}))
        assert found["status"] == "ok"
        assert tool_status(call_modern(http, "read_document", {"filename": "plan.md"}))["status"] == "ok"
        refused = rpc_reply(call_modern(http, "read_document", {"filename": f"{canary}.md"}))
        assert "error" in refused and canary not in str(refused)
    with open_http(broker, employee) as http:
        read = tool_status(call_modern(http, "read_document", {"filename": f"{canary}.md"}))
        assert read["status"] == "ok" and "confidential" in read["data"]["content"]

    expected_hash = set_hash(broker)
    events = [e for e in broker.audit_events() if e.get("tool") in ("search_documents", "read_document")]
    denied = [e for e in events if e["event"] == "policy.denied" and e.get("subject") == "carol"]
    assert len(denied) == 1, denied
    assert denied[0]["policy_ids"] == [FORBID_ID]
    assert denied[0]["policy_hash"] == expected_hash
    assert denied[0]["reason"] == "tool_not_allowed"
    allowed = [e for e in events if e["event"] == "mcp.request" and e.get("outcome") == "ok"]
    assert {e["subject"] for e in allowed} == {"carol", "dave"}
    for event in allowed:  # the permit that allowed it, from the compiled tenants/acme.toml
        assert event["policy_ids"] == ["toml.tenants.acme"]
        assert event["policy_hash"] == expected_hash
    audit, logs = broker.audit_file.read_text(), broker.logs()
    assert canary not in audit and canary not in logs


def test_a_contractor_still_sees_read_document_in_tools_list(broker: Broker) -> None:
    """Listing names no document: the forbid needs one, so the tool is shown (and each call
    is decided on its own document)."""
    contractor = broker.token("acme", "carol", READ_SCOPE, groups=["contractors"])
    with open_http(broker, contractor) as http:
        reply = rpc_reply(
            http.post(
                "/mcp",
                json={"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {"_meta": {
                    "io.modelcontextprotocol/protocolVersion": "2026-07-28",
                    "io.modelcontextprotocol/clientCapabilities": {}}}},
                headers={"content-type": "application/json", "accept": "application/json, text/event-stream",
                         "mcp-protocol-version": "2026-07-28", "mcp-method": "tools/list"},
            )
        )  # fmt: skip
    names = {t["name"] for t in reply["result"]["tools"]}
    assert names == {"search_documents", "read_document"}  # no docs:write: no save_report


def test_a_malformed_groups_claim_refuses_the_token(broker: Broker) -> None:
    """Read as "no groups", it would let a contractor out of every group rule."""
    for groups in ("contractors", [1], ["x" * 300], [""]):
        token = broker.token("acme", "carol", READ_SCOPE, groups=groups)
        with open_http(broker, token) as http:
            response = call_modern(http, "search_documents", {"query": "plan"})
        assert response.status_code == 401, groups


def test_a_policy_that_does_not_validate_refuses_the_start(tmp_path: Path) -> None:
    b = make_broker(tmp_path)
    (Path(b.env["DOCBROKER_POLICIES_DIR"]) / "broken.cedar").write_text(
        '@id("typo")\npermit (principal, action == Docbroker::Action::"read_document", resource)\n'
        'when { context.documnet == "x.md" };\n'
    )
    done = subprocess.run(
        [sys.executable, "-m", "broker", "serve"], cwd=ROOT, env=b.env, capture_output=True, text=True,
        timeout=60,
    )  # fmt: skip
    assert done.returncode != 0
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert lines[-1].startswith("docbroker: cannot start: broken.cedar: policy typo does not validate")
    assert "Traceback" not in done.stderr


def test_decision_lines_name_policies_and_never_a_request_value(broker: Broker) -> None:
    """Every decided tools/call line carries ids of the loaded set and its hash; the values the
    policy decided on (document names, queries, contents, groups) appear nowhere; and the log
    with the new fields still verifies."""
    values = {where: f"cnry{secrets.token_hex(6)}" for where in ("query", "doc", "content", "group", "hrdoc")}
    sources = broker.sources("acme")
    sources.mkdir(parents=True, exist_ok=True)
    (sources / f"{values['doc']}.md").write_text("x\n")
    contractor = broker.token("acme", "erin", "docs:read docs:write", groups=["contractors", values["group"]])
    outsider = broker.token("acme", "erin", "", groups=[values["group"]])  # no scope: a builtin forbid
    calls = [
        (contractor, "search_documents", {"query": values["query"]}),
        (contractor, "read_document", {"filename": f"{values['doc']}.md"}),
        (contractor, "read_document", {"filename": f"hr-{values['hrdoc']}.md"}),
        (contractor, "save_report", {"filename": f"hr-{values['hrdoc']}.md", "content": values["content"]}),
        (outsider, "read_document", {"filename": f"{values['doc']}.md"}),
    ]
    for token, tool, arguments in calls:
        with open_http(broker, token) as http:
            call_modern(http, tool, arguments)
    engine_ids = set(PolicyEngine.load(Path(broker.env["DOCBROKER_POLICIES_DIR"]), Policies.load(
        Path(broker.env["DOCBROKER_POLICIES_DIR"]))).policy_ids)  # fmt: skip
    mine = [e for e in broker.audit_events() if e.get("subject") == "erin"]
    assert [(e["event"], e["tool"]) for e in mine] == [
        ("mcp.request", "search_documents"),
        ("mcp.request", "read_document"),
        ("policy.denied", "read_document"),
        ("policy.denied", "save_report"),
        ("policy.denied", "read_document"),
    ]
    assert [e.get("policy_ids") for e in mine] == [
        ["toml.tenants.acme"], ["toml.tenants.acme"], [FORBID_ID], [FORBID_ID], ["builtin.scope.docs_read"],
    ]  # fmt: skip
    for event in mine:
        assert set(event["policy_ids"]) <= engine_ids and event["policy_hash"] == set_hash(broker)
    audit, logs = broker.audit_file.read_text(), broker.logs()
    leaked = {w for w, v in values.items() if v in audit or v in logs}
    assert leaked == set()
    verified = subprocess.run(
        [sys.executable, "-m", "broker", "audit", "verify", str(broker.audit_file)], cwd=ROOT,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT)}, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert verified.returncode == 0, verified.stdout + verified.stderr
