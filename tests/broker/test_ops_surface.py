"""What operators and clients see around /mcp (DESIGN §5, §7, §8): health and readiness,
Prometheus metrics, RFC 9728 metadata and the 401 challenge that points at it, and a tenant
server that crashes or hangs — the client gets a clean JSON-RPC error, never a hang, and the
next call gets a fresh sandbox.
"""

from __future__ import annotations

import os
import re
import signal
import time

import anyio
import pytest
from mcp.shared.exceptions import MCPError

from broker.testing import AUDIENCE, ISSUER, Broker, structured
from tests.broker.support import (
    CALL_TIMEOUT_SECONDS,
    MODES,
    call_modern,
    decide,
    events_since,
    gone,
    last_seq,
    mcp_error,
    open_http,
    open_mcp,
    post_modern,
    server_pids,
    unique,
    wait_for,
)

pytestmark = pytest.mark.anyio

NEVER_HANG_SECONDS = CALL_TIMEOUT_SECONDS + 20  # a call timeout plus a sandbox start on a busy host


def metric(text: str, name: str, **labels: str) -> float:
    """The value of one sample in Prometheus text format (0 when absent)."""
    for line in text.splitlines():
        if line.startswith("#") or not line.startswith(name):
            continue
        match = re.fullmatch(r"([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)", line)
        assert match, line
        found = dict(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', match.group(2) or ""))
        if match.group(1) == name and found == labels:
            return float(match.group(3))
    return 0.0


def test_healthz_and_readyz(broker: Broker) -> None:
    with open_http(broker) as http:
        health = http.get("/healthz")
        assert (health.status_code, health.json()) == (200, {"status": "ok"})
        assert "server" not in health.headers  # no software banner for callers to fingerprint
        ready = http.get("/readyz", headers=broker.ops_headers)
    assert ready.status_code == 200
    body = ready.json()
    assert body["status"] == "ready"
    assert body["checks"]["audit"] is True and body["checks"]["keys"] is True
    assert body["checks"]["sandboxes"]["backend"] == "local"
    assert body["checks"]["approvals_database"] == {"backend": "sqlite", "reachable": True}


# Who may see what runs where (issue 24, item 12): anyone on the /mcp listener, before. Each
# of these credentials is refused; only the operators' bearer (DOCBROKER_OPS_TOKEN_FILE) reads.
NOT_OPERATORS = {
    "nobody": {},
    "a wrong bearer": {"authorization": "Bearer " + "x" * 43},
    "basic": {"authorization": "Basic b3BzOm9wcw=="},
}


@pytest.mark.parametrize("who", sorted(NOT_OPERATORS))
def test_metrics_and_readiness_details_are_for_operators_only(broker: Broker, who: str) -> None:
    headers = NOT_OPERATORS[who]
    with open_http(broker) as http:
        metrics = http.get("/metrics", headers=headers)
        ready = http.get("/readyz", headers=headers)
        twice = http.get("/metrics", headers=[("authorization", broker.ops_headers["authorization"])] * 2)
    assert metrics.status_code == 401 and twice.status_code == 401
    assert metrics.headers["www-authenticate"] == 'Bearer realm="docbroker-ops"'
    assert metrics.json() == {"error": "unauthorized"} and "docbroker_" not in metrics.text
    # Ready or not, for probes and load balancers: nothing about the engine, limits or images.
    assert (ready.status_code, ready.json()) == (200, {"status": "ready"})
    assert ready.headers["cache-control"] == "no-store"


def test_a_tenant_token_is_not_an_operator(broker: Broker) -> None:
    with open_http(broker, broker.token(scope="docs:read docs:write reports:approve")) as tenant:
        assert tenant.get("/metrics").status_code == 401
        assert tenant.get("/readyz").json() == {"status": "ready"}


def test_metrics_count_requests_sandboxes_and_pending_approvals(broker: Broker) -> None:
    with open_http(broker) as operator:
        before = operator.get("/metrics", headers=broker.ops_headers)
    assert before.status_code == 200 and before.headers["content-type"].startswith("text/plain")
    labels = {"method": "tools/call", "tool": "save_report", "outcome": "waiting_approval"}
    with open_http(broker, broker.token()) as http:
        assert call_modern(http, "read_document", {"filename": "any.md"}).status_code == 200  # a sandbox runs
        waiting = call_modern(http, "save_report", {"filename": unique("metrics"), "content": "count me"})
        assert waiting.status_code == 200
        call_modern(http, "cnrymetriclabel", {})  # a client's tool name must not become a label
        post_modern(http, "cnry/method")
    with open_http(broker) as operator:
        after = operator.get("/metrics", headers=broker.ops_headers).text
    assert (
        metric(after, "docbroker_requests_total", **labels)
        == metric(before.text, "docbroker_requests_total", **labels) + 1
    )
    assert (
        metric(after, "docbroker_approvals_pending") == metric(before.text, "docbroker_approvals_pending") + 1
    )
    assert metric(after, "docbroker_sandboxes_running") >= 1
    assert "docbroker_request_seconds_bucket" in after
    assert "cnry" not in after
    assert metric(after, "docbroker_requests_total", method="other", tool="-", outcome="denied") >= 1

    approval_id = waiting.json()["result"]["structuredContent"]["data"]["approval_id"]
    assert decide(broker, approval_id, approve=False).status_code == 200
    with open_http(broker) as operator:
        decided = operator.get("/metrics", headers=broker.ops_headers).text
    assert metric(decided, "docbroker_approvals_pending") == metric(after, "docbroker_approvals_pending") - 1


def test_protected_resource_metadata_and_challenge(broker: Broker) -> None:
    with open_http(broker, "expired.or.bad") as http:
        refused = post_modern(http, "tools/list")
    assert refused.status_code == 401
    challenge = refused.headers["www-authenticate"]
    match = re.fullmatch(r'Bearer error="invalid_token", resource_metadata="([^"]+)"', challenge)
    assert match, challenge
    url = match.group(1)
    assert url == f"{broker.url}/.well-known/oauth-protected-resource/mcp"
    with open_http(broker) as http:
        document = http.get(url.removeprefix(broker.url))
    assert document.status_code == 200
    assert document.json() == {
        "resource": f"{broker.url}/mcp",
        "authorization_servers": [ISSUER],
        "scopes_supported": ["docs:read", "docs:write", "reports:approve"],
        "bearer_methods_supported": ["header"],
    }
    assert AUDIENCE not in document.text  # the audience is the IdP's business, not published here


# -- a tenant server that crashes or hangs ------------------------------------------------------


def kill(pid: int, sig: signal.Signals = signal.SIGKILL) -> None:
    os.kill(pid, sig)
    if sig == signal.SIGKILL:
        assert wait_for(lambda: gone(pid), timeout=10)


def the_server(broker: Broker, tenant: str) -> int:
    assert wait_for(lambda: len(server_pids(broker, tenant)) == 1, timeout=10), server_pids(broker, tenant)
    return server_pids(broker, tenant)[0]


@pytest.fixture
def crashy(broker: Broker) -> str:
    tenant = "crashy"
    broker.sources(tenant).mkdir(parents=True, exist_ok=True)
    (broker.sources(tenant) / "survivor.md").write_text("still here after a crash")
    return tenant


@pytest.mark.parametrize("mode", MODES)
async def test_crashed_server_gives_clean_error_then_a_fresh_sandbox(
    broker: Broker, crashy: str, mode: str
) -> None:
    token = broker.token(tenant=crashy)
    read = {"filename": "survivor.md"}
    async with open_mcp(broker, token, mode=mode) as client:
        assert structured(await client.call_tool("read_document", read))["status"] == "ok"
    first = the_server(broker, crashy)
    before = last_seq(broker)
    kill(first)

    outcomes: list[object] = []
    for _ in range(3):  # each a new client: a legacy session dies with its server
        with anyio.fail_after(NEVER_HANG_SECONDS):
            try:
                async with open_mcp(broker, token, mode=mode) as client:
                    outcomes.append(structured(await client.call_tool("read_document", read))["status"])
            except Exception as exc:
                error = mcp_error(exc)
                assert error is not None and error.code in (-32001, -32603), exc
                outcomes.append(error.code)
    # reads may be retried once on a fresh sandbox; at the latest the call after a failure works
    assert outcomes[-1] == "ok" and all(o in ("ok", -32001, -32603) for o in outcomes), outcomes
    second = the_server(broker, crashy)
    assert second != first
    events = events_since(broker, before)
    assert any(e["event"] == "sandbox.started" and e["tenant"] == crashy for e in events)


async def test_an_approved_save_that_meets_a_dead_server_is_sent_once_or_unknown_never_twice(
    broker: Broker, crashy: str
) -> None:
    """A save whose server was killed before it: when no connection could be made it is sent
    once, to a fresh sandbox; when a kept-alive connection took the bytes first, it is
    result_unknown. Never ok without a report, never written twice. (A server that dies
    *during* a save: tests/broker/hostile/test_hostile_failures.py.)"""
    token = broker.token(tenant=crashy)
    name, content = unique("crash"), "the sandbox died before this was sent"
    async with open_mcp(broker, token, mode="legacy") as client:
        waiting = structured(await client.call_tool("save_report", {"filename": name, "content": content}))
    approval_id = waiting["data"]["approval_id"]
    assert decide(broker, approval_id, tenant=crashy).status_code == 200
    kill(the_server(broker, crashy))
    # the save is the first request to meet the dead server (a client's handshake would
    # already have been retried on a fresh one)
    started = time.monotonic()
    with open_http(broker, token) as http:
        response = call_modern(http, "save_report", {"filename": name, "content": content})
    assert time.monotonic() - started < NEVER_HANG_SECONDS
    assert response.status_code == 200
    result = response.json()["result"]["structuredContent"]
    async with open_mcp(broker, token, mode="auto") as client:
        with anyio.fail_after(NEVER_HANG_SECONDS):
            after = structured(await client.call_tool("read_document", {"filename": "survivor.md"}))
            again = structured(await client.call_tool("save_report", {"filename": name, "content": content}))
    assert after["status"] == "ok"
    if result["status"] == "ok":
        # No connection to the dead server could be made: sent once to its successor.
        assert (broker.reports(crashy) / name).read_text() == content
        assert (again["status"], again["message"]) == ("rejected", "a report with this name already exists")
    else:
        # A kept-alive connection the broker had not yet seen close took the bytes: the write
        # may or may not have happened, so it is never retried nor reported ok; the approval
        # is spent and nothing landed.
        assert result == {
            "status": "result_unknown",
            "message": "report write did not complete; it may or may not exist",
            "data": None,
        }
        assert not (broker.reports(crashy) / name).exists()
        assert again["status"] == "waiting_approval"


async def test_hung_server_times_out_cleanly(broker: Broker, crashy: str) -> None:
    token = broker.token(tenant=crashy)
    async with open_mcp(broker, token, mode="auto") as client:
        assert (
            structured(await client.call_tool("read_document", {"filename": "survivor.md"}))["status"] == "ok"
        )
        hung = the_server(broker, crashy)
        os.kill(hung, signal.SIGSTOP)
        try:
            started = time.monotonic()
            with anyio.fail_after(NEVER_HANG_SECONDS), pytest.raises((MCPError, ExceptionGroup)) as raised:
                await client.call_tool("read_document", {"filename": "survivor.md"})
            error = mcp_error(raised.value)
            assert error is not None and (error.code, str(error)) == (-32603, "Tool call timed out"), (
                raised.value
            )
            assert time.monotonic() - started < CALL_TIMEOUT_SECONDS + 10  # the deadline, not a hang
        finally:
            os.kill(hung, signal.SIGKILL)
            os.kill(hung, signal.SIGCONT)
        with anyio.fail_after(NEVER_HANG_SECONDS):
            for _ in range(3):  # the breaker may ask for a second; the call after that works
                try:
                    result = structured(await client.call_tool("read_document", {"filename": "survivor.md"}))
                    break
                except Exception as exc:
                    assert mcp_error(exc) is not None, exc
                    await anyio.sleep(1.2)
    assert result["status"] == "ok"
    assert the_server(broker, crashy) != hung
