"""Votes across policy versions (issue 34 items 5 and 6), through a real broker on each
approval store (SQLite, PostgreSQL): every yes whose set is not the one in force is decided
again before a save writes — not only the yes that completed the count — and a record reopened
by that needs the count the set in force asks for, whoever completes it."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from broker.testing import ISSUER, ROOT, Broker
from tests.broker.policy.policy_support import broker_on, set_in_force
from tests.broker.support import (
    APPROVER_SCOPE,
    WRITE_SCOPE,
    call_modern,
    open_http,
    tool_status,
    unique,
    wait_for,
)

TWO_APPROVERS = ROOT / "policies" / "examples" / "big-reports-two-approvers.cedar"
BIG = "b" * 5000  # over 4 kB: the example asks two approvers


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def broker(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Broker]:
    tmp = tmp_path_factory.mktemp(f"redecision-{request.param}")
    files = {TWO_APPROVERS.name: TWO_APPROVERS.read_text()}
    with broker_on(tmp, request.param, files, {"DOCBROKER_POLICY_RELOAD": "0.2"}) as b:
        yield b


@contextlib.contextmanager
def rule(broker: Broker, name: str, text: str) -> Iterator[None]:
    """A policy file added to the set in force for the block, and taken out after it."""
    before = set_in_force(broker)
    path = Path(broker.env["DOCBROKER_POLICIES_DIR"]) / name
    path.write_text(text)
    try:
        assert wait_for(lambda: set_in_force(broker) != before)
        yield
    finally:
        path.unlink()
        assert wait_for(lambda: set_in_force(broker) == before)


def save(broker: Broker, name: str) -> dict[str, Any]:
    with open_http(broker, broker.token("acme", "rita", WRITE_SCOPE)) as http:
        return tool_status(call_modern(http, "save_report", {"filename": name, "content": BIG}))


def approve(broker: Broker, who: str, approval_id: str, groups: tuple[str, ...] = ()) -> dict[str, Any]:
    with open_http(broker, broker.token("acme", who, APPROVER_SCOPE, groups=list(groups))) as http:
        http.get(f"/v1/approvals/{approval_id}")  # a yes counts only from someone shown the content
        answer = http.post(f"/v1/approvals/{approval_id}/approve")
    assert answer.status_code == 200, answer.text
    body: dict[str, Any] = answer.json()
    return body


def counted(record: dict[str, Any]) -> tuple[str, int, int]:
    return record["state"], record["approvals"], record["required"]


def policy_changed(broker: Broker) -> list[dict[str, Any]]:
    return [
        e for e in broker.audit_events()
        if e["event"] == "mcp.request" and e.get("reason") == "approval_policy_changed"
    ]  # fmt: skip


def test_a_yes_cast_under_an_old_set_is_decided_again_when_another_completes_the_count(
    broker: Broker,
) -> None:
    """mallory says yes under the first set; a second set forbids mallory; bob's yes under the
    second completes the count. The save is refused (mallory's yes no longer holds), naming
    the forbid, and the record waits with bob's yes; carol completes it and it is written."""
    name = unique()
    approval_id = save(broker, name)["data"]["approval_id"]
    assert counted(approve(broker, "mallory", approval_id)) == ("pending", 1, 2)
    before = len(policy_changed(broker))
    forbid = (
        '@id("acme.mallory_no_longer_approves")\n'
        f'forbid (principal == Docbroker::User::"acme/mallory#{ISSUER}", '
        'action == Docbroker::Action::"approve", resource);\n'
    )
    with rule(broker, "no-mallory.cedar", forbid):
        assert counted(approve(broker, "bob", approval_id)) == ("approved", 2, 2)
        refused = save(broker, name)
        assert refused["status"] == "rejected" and not (broker.reports("acme") / name).exists()
        lines = policy_changed(broker)[before:]
        assert len(lines) == 1 and lines[0]["policy_ids"] == ["acme.mallory_no_longer_approves"]
        assert lines[0]["approval_id"] == approval_id
        assert save(broker, name)["status"] == "waiting_approval"
        assert counted(approve(broker, "carol", approval_id)) == ("approved", 2, 2)
        assert save(broker, name)["status"] == "ok"
    assert (broker.reports("acme") / name).read_text() == BIG


def test_a_record_reopened_needing_three_is_not_approved_by_two(broker: Broker) -> None:
    """Approved by june (a junior) and dave under the first set. The second asks three
    approvers when a junior approves and forbids dave: the save reopens the record with june's
    yes, needing three. erin's yes (her own decision asks two) leaves it waiting; a third
    approver completes it."""
    name = unique()
    approval_id = save(broker, name)["data"]["approval_id"]
    approve(broker, "june", approval_id, groups=("juniors",))
    assert counted(approve(broker, "dave", approval_id)) == ("approved", 2, 2)
    second_set = (
        '@id("acme.dave_no_longer_approves")\n'
        f'forbid (principal == Docbroker::User::"acme/dave#{ISSUER}", '
        'action == Docbroker::Action::"approve", resource);\n'
        '@id("acme.juniors_need_three")\n@approvers("3")\npermit (principal in Docbroker::Group::"juniors", '
        'action == Docbroker::Action::"approve", resource)\n'
        "when { context has content_bytes && context.content_bytes > 4096 };\n"
    )
    with rule(broker, "juniors.cedar", second_set):
        assert save(broker, name)["status"] == "rejected"
        with open_http(broker, broker.token("acme", "erin", APPROVER_SCOPE)) as http:
            assert counted(http.get(f"/v1/approvals/{approval_id}").json()) == ("pending", 1, 3)
        assert counted(approve(broker, "erin", approval_id)) == ("pending", 2, 3)
        assert save(broker, name)["status"] == "waiting_approval"
        assert counted(approve(broker, "frank", approval_id)) == ("approved", 3, 3)
        assert save(broker, name)["status"] == "ok"
    assert (broker.reports("acme") / name).read_text() == BIG
