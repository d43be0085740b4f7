"""What a sandbox's replacement ends: a changed contract, an operator's replacement, and a
sandbox that never starts.

A broker of its own: a start gives up after a few seconds, one failure opens a tenant's
circuit breaker for a few seconds, and sandboxes are never idle long enough to be reaped
during a test (so only a replacement can end a broken pin).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from typing import Any

from broker.testing import ROOT, Broker
from tests.broker.hostile.hostile_helpers import (
    Rpc,
    contract_breaks,
    events,
    last_request,
    rejected,
    sandbox_calls,
    tool_calls,
    unique,
    wait_for,
)

TENANTS = ("changing", "nostart", "honest", "injected")
PREWARM = ()  # each test waits for its sandbox (`ready`)
START_TIMEOUT = 3
COOLDOWN = 4
BROKER_ENV = {
    "DOCBROKER_IDLE_TIMEOUT": "600",
    "DOCBROKER_START_TIMEOUT": str(START_TIMEOUT),
    "DOCBROKER_BREAKER_THRESHOLD": "1",
    "DOCBROKER_BREAKER_COOLDOWN": str(COOLDOWN),
}


def sandbox_replace(broker: Broker, tenant: str) -> subprocess.CompletedProcess[str]:
    """`docbroker sandbox replace TENANT`, as an operator runs it: another process, same settings."""
    return subprocess.run(
        [sys.executable, "-m", "broker", "sandbox", "replace", tenant, "--json"],
        cwd=ROOT, env=broker.env, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip


def ready(broker: Broker, tenant: str) -> None:
    """The tenant's sandbox answers: a first start slowed down by a busy host (other brokers
    start theirs at the same time) may have opened the one-failure breaker for a moment."""
    rpc = Rpc(broker, tenant)
    wait_for(lambda: rpc.read("notes.md").status == 200, timeout=3 * (START_TIMEOUT + COOLDOWN), interval=0.5)


def replaced(broker: Broker, tenant: str) -> dict[str, Any]:
    done = sandbox_replace(broker, tenant)
    assert done.returncode == 0, done.stderr
    answer: dict[str, Any] = json.loads(done.stdout)
    return answer


def test_a_changed_contract_replaces_the_sandbox(hostile: Broker) -> None:
    ready(hostile, "changing")
    broken = contract_breaks(hostile, "changing")
    time.sleep(COOLDOWN + 0.5)
    # the first call after the cool-down starts the successor (of the same, changed program),
    # listed and pinned as it now is: its read_document is not the contract's, its search is
    rpc = Rpc(hostile, "changing")
    search = rpc.search("docbroker")
    assert search.structured["status"] == "ok", search
    successor = last_request(hostile, "changing")["sandbox"]
    assert successor != broken
    assert events(hostile, "sandbox.started", tenant="changing", sandbox=successor)
    assert ("read_document", "description_mismatch") in rejected(hostile, "changing")
    assert rpc.tool_names() == ["save_report", "search_documents"]
    assert rpc.read("notes.md").error_code == -32602
    assert len(events(hostile, "contract.changed", tenant="changing")) == 1  # no flapping


def test_an_operator_replaces_a_tenants_sandbox(hostile: Broker) -> None:
    ready(hostile, "honest")
    rpc = Rpc(hostile, "honest")
    assert rpc.read("notes.md").structured["status"] == "ok"
    old = last_request(hostile, "honest")["sandbox"]
    name, content = unique(), "# Report\nafter a replacement\n"
    waiting = rpc.call("save_report", {"filename": name, "content": content})
    approval_id = waiting.structured["data"]["approval_id"]
    with hostile.http(rpc.token) as http:
        assert http.get(f"/v1/approvals/{approval_id}").status_code == 200  # read first
        assert http.post(f"/v1/approvals/{approval_id}/approve").status_code == 200

    assert replaced(hostile, "honest") == {"tenant": "honest", "removed": 1}
    # The broker finds the sandbox gone on the next call. The approved save never reached the
    # gone sandbox (no connection could be made), so it is sent once, to the successor only.
    saved = rpc.call("save_report", {"filename": name, "content": content})
    assert saved.structured["status"] == "ok", saved
    new = last_request(hostile, "honest", tool="save_report")["sandbox"]
    assert new != old
    assert [c["pid"] for c in tool_calls(hostile, "honest", "save_report")] == [int(new)]
    assert (hostile.reports("honest") / name).read_text() == content
    assert events(hostile, "sandbox.failed", tenant="honest", sandbox=old)
    assert events(hostile, "sandbox.started", tenant="honest", sandbox=new)
    # pinned afresh: the broker listed the successor's tools before anything else reached it
    first = next(c["method"] for c in sandbox_calls(hostile, "honest") if c["pid"] == int(new))
    assert first == "tools/list"
    assert rpc.read("notes.md").structured["status"] == "ok"


def test_an_operator_replacement_touches_only_that_tenant(hostile: Broker) -> None:
    """Other tenants are untouched, a tenant with no sandbox has nothing to remove, and a name
    that is not a tenant id is refused without a traceback."""
    ready(hostile, "injected")
    injected = Rpc(hostile, "injected")
    assert injected.read("plan.md").structured["status"] == "ok"
    before = last_request(hostile, "injected")["sandbox"]
    assert replaced(hostile, "nostart") == {"tenant": "nostart", "removed": 0}
    assert injected.read("plan.md").structured["status"] == "ok"
    assert last_request(hostile, "injected")["sandbox"] == before
    bad = sandbox_replace(hostile, "../etc")
    assert bad.returncode != 0 and "Traceback" not in bad.stderr
    assert "not a tenant id" in bad.stderr


def test_a_sandbox_that_never_starts_opens_the_breaker(hostile: Broker) -> None:
    rpc = Rpc(hostile, "nostart")
    began = time.monotonic()
    first = rpc.read("notes.md")
    assert time.monotonic() - began < START_TIMEOUT + 5
    assert (first.status, first.error_code) == (503, -32001), first
    assert int(first.headers["retry-after"]) >= 1
    assert last_request(hostile, "nostart")["reason"] == "sandbox_start_failed"
    assert events(hostile, "sandbox.failed", tenant="nostart")
    # open: refused at once, with the time left to wait
    began = time.monotonic()
    second = rpc.read("notes.md")
    assert time.monotonic() - began < 1.5
    assert (second.status, second.error_code) == (503, -32001), second
    assert 1 <= int(second.headers["retry-after"]) <= COOLDOWN
    assert last_request(hostile, "nostart")["reason"] == "circuit_open"
