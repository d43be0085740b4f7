"""Hot reload through a real broker: a changed policies folder replaces the set in force
(polled, or at once on SIGHUP); a folder that does not load never replaces a good set (logged,
counted, /readyz says stale); and requests in flight while the set flips are all answered and
audited, each decided by one set or the other."""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from broker.policy import Policies, PolicyEngine
from broker.testing import ROOT, Broker, make_broker
from tests.broker.support import READ_SCOPE, call_modern, open_http, rpc_reply, tool_status, wait_for

EXAMPLE = ROOT / "policies" / "examples" / "contractors-no-hr.cedar"
FORBID_ID = "examples.contractors.no_hr_documents"


@pytest.fixture
def broker(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Broker]:
    interval = getattr(request, "param", "0.2")
    b = make_broker(tmp_path, env={"DOCBROKER_POLICY_RELOAD": interval})
    b.start()
    sources = b.sources("acme")
    sources.mkdir(parents=True, exist_ok=True)
    (sources / "hr-pay.md").write_text("pay\n")
    (sources / "plan.md").write_text("plan\n")
    try:
        yield b
    finally:
        b.stop()


def policy_state(broker: Broker) -> dict[str, Any]:
    with open_http(broker) as http:
        body = http.get("/readyz", headers=broker.ops_headers).json()
    state: dict[str, Any] = body["checks"]["policy"]
    return state


def folder(broker: Broker) -> Path:
    return Path(broker.env["DOCBROKER_POLICIES_DIR"])


def contractor_reads(broker: Broker, name: str) -> dict[str, Any]:
    token = broker.token("acme", "carol", READ_SCOPE, groups=["contractors"])
    with open_http(broker, token) as http:
        return rpc_reply(call_modern(http, "read_document", {"filename": name}))


def test_a_changed_folder_replaces_the_set_and_a_broken_one_never_does(broker: Broker) -> None:
    first = policy_state(broker)
    assert first["stale"] is False
    assert "result" in contractor_reads(broker, "hr-pay.md")

    shutil.copy(EXAMPLE, folder(broker) / EXAMPLE.name)
    assert wait_for(lambda: policy_state(broker)["set"] != first["set"])
    with_example = policy_state(broker)
    assert "error" in contractor_reads(broker, "hr-pay.md")
    denied = [e for e in broker.audit_events() if e["event"] == "policy.denied"]
    assert denied[-1]["policy_ids"] == [FORBID_ID] and denied[-1]["policy_hash"] == with_example["set"]

    (folder(broker) / "broken.cedar").write_text(
        '@id("x")\npermit (principal, action, resource) when { context.nope };'
    )
    assert wait_for(lambda: policy_state(broker)["stale"] is True)
    assert policy_state(broker)["set"] == with_example["set"]  # the good set stays in force
    assert "error" in contractor_reads(broker, "hr-pay.md")
    assert "result" in contractor_reads(broker, "plan.md")
    assert "policy set not replaced: broken.cedar: policy x does not validate" in broker.logs()
    with open_http(broker) as http:
        metrics = http.get("/metrics", headers=broker.ops_headers).text
    assert 'docbroker_policy_reloads_total{result="failed"}' in metrics

    (folder(broker) / "broken.cedar").unlink()
    (folder(broker) / EXAMPLE.name).unlink()
    assert wait_for(lambda: policy_state(broker) == {"set": first["set"], "stale": False})
    assert "result" in contractor_reads(broker, "hr-pay.md")


@pytest.mark.parametrize("broker", ["0"], indirect=True)
def test_sighup_reloads_at_once(broker: Broker) -> None:
    first = policy_state(broker)["set"]
    shutil.copy(EXAMPLE, folder(broker) / EXAMPLE.name)
    time.sleep(0.5)  # not synchronisation: with polling off, nothing may change by itself
    assert policy_state(broker)["set"] == first
    assert broker.proc is not None
    os.kill(broker.proc.pid, signal.SIGHUP)
    assert wait_for(lambda: policy_state(broker)["set"] != first)
    assert "error" in contractor_reads(broker, "hr-pay.md")


def test_reload_under_load_loses_no_request(broker: Broker) -> None:
    """Four clients read without pause while the set flips between two versions; every
    request gets its answer and its one terminal audit line, and the flips were seen."""
    stop = threading.Event()
    answers: list[str] = []
    marker = f"load{secrets.token_hex(3)}"

    def client() -> None:
        token = broker.token("acme", marker, READ_SCOPE, groups=["contractors"])
        with open_http(broker, token) as http:
            while not stop.is_set():
                answers.append(
                    tool_status(call_modern(http, "read_document", {"filename": "plan.md"}))["status"]
                )

    without = policy_state(broker)["set"]
    shutil.copy(EXAMPLE, folder(broker) / EXAMPLE.name)
    with_example = PolicyEngine.load(folder(broker), Policies.load(folder(broker))).hash
    (folder(broker) / EXAMPLE.name).unlink()
    threads = [threading.Thread(target=client) for _ in range(4)]
    for thread in threads:
        thread.start()
    seen: set[str] = set()
    try:
        for n in range(8):
            if n % 2 == 0:
                shutil.copy(EXAMPLE, folder(broker) / EXAMPLE.name)
            else:
                (folder(broker) / EXAMPLE.name).unlink()
            expected = with_example if n % 2 == 0 else without
            assert wait_for(lambda expected=expected: policy_state(broker)["set"] == expected)
            seen.add(expected)
            served = len(answers)
            assert wait_for(lambda served=served: len(answers) > served + 10)  # load ran under this set
    finally:
        stop.set()
        for thread in threads:
            thread.join(timeout=30)
    assert len(seen) == 2  # both versions were in force while the load ran
    assert len(answers) > 50 and set(answers) == {"ok"}
    lines = [e for e in broker.audit_events() if e.get("subject") == marker]
    assert len(lines) == len(answers)
    assert {e["policy_hash"] for e in lines} == seen  # decided by one set or the other, both seen
