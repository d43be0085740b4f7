"""A tenant's requests in flight and its standing GET streams are capped apart (`max_concurrent`,
`max_streams`): a client holding its session's stream never takes a request's place.

Found by the conformance run and noted in the last round: every handshake-era client holds a
GET stream for as long as it stays, and the stream counted as a request in flight, so eight idle
clients (the default `max_concurrent`) locked their tenant out of every call.

Here a real broker (local runtime, the real server) with both caps at 1: one client holds its
stream; a call is held in flight by the tenant's sandbox, frozen (SIGSTOP); both are admitted
at once, a second of each is refused with its own reason, and both come back when released.
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Iterator

import httpx2
import pytest

from broker.testing import Broker, make_broker
from tests.broker.cli.cli_helpers import cli, json_out
from tests.broker.support import (
    UNLIMITED,
    LegacySession,
    events_since,
    last_seq,
    open_http,
    rpc_reply,
    server_pids,
    terminal,
    wait_for,
)

TENANT = "acme"
LISTING = {"jsonrpc": "2.0", "id": 5, "method": "tools/list"}
# A probe the broker answers itself once admitted (no such tool: refused by policy, never sent
# to the frozen sandbox), so probing before the held call takes its slot cannot hang.
PROBE = {
    "jsonrpc": "2.0",
    "id": 6,
    "method": "tools/call",
    "params": {"name": "no_such_tool", "arguments": {}},
}


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Broker]:
    b = make_broker(
        tmp_path_factory.mktemp("slots"),
        tenants=(TENANT,),
        env={"DOCBROKER_CALL_TIMEOUT": "60"},
        limits=UNLIMITED + "max_concurrent = 1\nmax_streams = 1\n",
    )
    b.sources(TENANT).mkdir(parents=True, exist_ok=True)
    (b.sources(TENANT) / "notes.md").write_text("held, then answered\n")
    b.start()
    try:
        yield b
    finally:
        b.stop()


def test_a_held_stream_and_a_call_in_flight_are_each_within_their_own_cap(broker: Broker) -> None:
    token = broker.token(tenant=TENANT)
    clients = [open_http(broker, token) for _ in range(4)]
    http, streamer, caller, probe = clients
    try:
        session = LegacySession(http)
        assert session.post(LISTING).status_code == 200  # the sandbox runs
        sandboxes = server_pids(broker, TENANT)
        assert sandboxes
        before = last_seq(broker)
        answers: list[httpx2.Response] = []

        def read() -> None:
            # A probe may hold the one slot for an instant as this call comes in: it asks again
            # (bounded: never admitted, its 429 is the answer the test then refuses).
            tries: list[httpx2.Response] = []

            def admitted() -> bool:
                tries.append(session.call("read_document", {"filename": "notes.md"}, caller))
                return tries[-1].status_code != 429

            wait_for(admitted)
            answers.append(tries[-1])

        reader = threading.Thread(target=read)
        with streamer.stream(
            "GET", "/mcp", headers={**session.headers(), "accept": "text/event-stream"}
        ) as stream:
            assert stream.status_code == 200
            for pid in sandboxes:
                os.kill(pid, signal.SIGSTOP)
            try:
                # A read the frozen sandbox cannot answer: it holds the one request slot.
                reader.start()
                # The call is in flight once another request meets the request cap (the
                # stream alone did not: the call itself was admitted beside it).
                assert wait_for(lambda: session.post(PROBE, probe).status_code == 429)
                assert reader.is_alive() and not answers
                assert session.stream_status(probe) == 429  # the stream cap: its own
            finally:
                for pid in sandboxes:
                    os.kill(pid, signal.SIGCONT)
            reader.join(timeout=30)
        assert [a.status_code for a in answers] == [200]
        assert rpc_reply(answers[0])["result"]["structuredContent"]["status"] == "ok"
        refused = [e for e in terminal(events_since(broker, before)) if e["status"] == 429]
        reasons = {(e["method"], e["reason"]) for e in refused}
        assert reasons == {("tools/call", "concurrency_limited"), ("GET", "streams_limited")}, refused
        # Both released: the stream (its client gone) and the call (answered) come back.
        assert wait_for(lambda: session.stream_status(probe) == 200)
        assert session.post(LISTING, probe).status_code == 200
    finally:
        for client in clients:
            client.close()


def test_tenant_show_reports_the_caps_serve_enforces(broker: Broker) -> None:
    """The joint: `docbroker tenant show` reads the policies `serve` enforces above (both at 1)."""
    shown = json_out(cli(broker.env, "tenant", "show", TENANT, "--json"))["effective_policy"]
    assert (shown["limits.max_concurrent"], shown["limits.max_streams"]) == (1, 1)
