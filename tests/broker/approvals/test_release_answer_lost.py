"""A give-back whose commit landed but whose answer was lost is still audited, once (issue 25).

A real broker on a real PostgreSQL, reached through a wire proxy that lets the release's
statement commit and then cuts the connection before its answer reaches the broker
(`tests.broker.pg_lost_answer`): the broker sees the store unavailable and keeps the release
owed. Its retry must recognise the release as already done and audit `approval.released` then,
so that when the approval is consumed again the log shows it consumed, given back, consumed —
never consumed twice with the give-back missing (the reliability run's `approvals_consumed_once`).
"""

from __future__ import annotations

import re
import shlex
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx2
import pytest

from broker.testing.replicas import Replica, running_replicas
from tests.broker.pg_lost_answer import LostAnswerProxy
from tests.broker.pgtest import fresh_schema
from tests.broker.support import call_modern, tool_status, wait_for
from tests.reliability.accounting import approvals_consumed_once

NAME, CONTENT = "lost-answer.md", "given back once, written once\n"
# The release's transition (revert, the other statement that starts so, never runs here: this
# broker's own claim is never lost to itself).
RELEASE = b"SET state = 'approved', consumed_at = NULL"


def failing_start_env(marker: Path) -> dict[str, str]:
    """The tenant's server fails to start while `marker` exists: a save refused before its bytes
    were sent, so its consumed approval is given back."""
    wrapper = f'if [ -e {shlex.quote(str(marker))} ]; then exit 1; fi; exec "$0" -m server "$@"'
    return {
        "DOCBROKER_LOCAL_SERVER_COMMAND": shlex.join(["/bin/sh", "-c", wrapper, sys.executable]),
        "DOCBROKER_DATABASE_POOL_TIMEOUT": "2",
        "DOCBROKER_DATABASE_STATEMENT_TIMEOUT": "2",
        "DOCBROKER_BREAKER_THRESHOLD": "100",
    }


def save(replica: Replica, token: str) -> httpx2.Response:
    with replica.http(token) as http:
        return call_modern(http, "save_report", {"filename": NAME, "content": CONTENT})


def approval_lines(replica: Replica, approval_id: str) -> list[str]:
    return [
        e["event"] for e in replica.audit_events()
        if e.get("approval_id") == approval_id and e["event"] in ("approval.consumed", "approval.released")
    ]  # fmt: skip


@pytest.fixture
def database() -> Iterator[str]:
    with fresh_schema() as url:
        yield url


def test_a_release_whose_answer_was_lost_is_audited_once_by_its_retry(tmp_path: Path, database: str) -> None:
    socket_dir = re.search(r"host=([^&]+)", database)
    assert socket_dir is not None
    marker = tmp_path / "sandbox-fails"
    with (
        LostAnswerProxy(socket_dir.group(1), RELEASE) as proxy,
        running_replicas(
            tmp_path, 1, env=failing_start_env(marker), database_url=proxy.url(database)
        ) as replicas,
    ):
        [a] = replicas
        token = a.token()
        first = tool_status(save(a, token))
        assert first["status"] == "waiting_approval", first
        approval_id = first["data"]["approval_id"]
        with a.http(a.token(subject="carol", scope="reports:approve")) as http:
            assert http.get(f"/v1/approvals/{approval_id}").status_code == 200  # read first
            assert http.post(f"/v1/approvals/{approval_id}/approve").status_code == 200

        # consumed, then refused before its bytes were sent: the release commits, its answer
        # never arrives
        marker.touch()
        refused = save(a, token)
        assert refused.status_code in (200, 503), refused.text
        assert proxy.dropped.is_set()  # the race was entered: committed, answer withheld
        assert "an unsent approval could not be given back yet" in a.logs()

        # the broker retries the owed release by itself (within about a second): the store
        # tells it the release happened, and it is audited then
        wait_for(lambda: "approval.released" in approval_lines(a, approval_id), timeout=15)

        marker.unlink()
        saved = tool_status(save(a, token))
        assert saved["status"] == "ok", saved
        assert (a.reports("acme") / NAME).read_text() == CONTENT
    events = a.audit_events()  # the broker has stopped: its log is complete
    assert approval_lines(a, approval_id) == ["approval.consumed", "approval.released", "approval.consumed"]
    check = approvals_consumed_once([{**e, "replica": "a"} for e in events])
    assert check.passed, check
