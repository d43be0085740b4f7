"""The broker keeps a sandbox client no longer than the sandbox (issue 24 item 7), seen the way
an operator sees it: `/metrics` of a real broker whose tenant's sandbox is reaped when idle.

A client was kept for every endpoint ever used (each warm slot and Pod IP on Kubernetes), each
holding up to 16 dead connections: memory that only grows."""

from __future__ import annotations

import re
from pathlib import Path

from broker.testing import Broker, running_broker
from tests.broker.support import call_modern, open_http, wait_for


def gauge(broker: Broker, name: str) -> float:
    with open_http(broker) as operator:
        text = operator.get("/metrics", headers=broker.ops_headers).text
    match = re.search(rf"^{name} (\S+)$", text, re.MULTILINE)
    assert match, f"{name} not in /metrics"
    return float(match.group(1))


def test_a_sandboxs_client_goes_when_the_sandbox_is_reaped(tmp_path: Path) -> None:
    with running_broker(tmp_path, env={"DOCBROKER_IDLE_TIMEOUT": "3"}) as broker:
        with open_http(broker, broker.token()) as http:
            assert call_modern(http, "search_documents", {"query": "hello"}).status_code == 200
        assert gauge(broker, "docbroker_upstream_clients") == 1

        def reaped() -> bool:
            return any(
                e["event"] == "sandbox.stopped" and e.get("reason") == "idle" for e in broker.audit_events()
            )

        assert wait_for(reaped, timeout=30), "the idle sandbox was never reaped"
        assert gauge(broker, "docbroker_sandboxes_running") == 0
        assert gauge(broker, "docbroker_upstream_clients") == 0
        with open_http(broker, broker.token()) as http:  # a new sandbox, a new client
            assert call_modern(http, "search_documents", {"query": "hello"}).status_code == 200
        assert gauge(broker, "docbroker_upstream_clients") == 1
