"""Per-tenant rate limit and concurrency cap from the TOML policies (DESIGN §1 step 2).

The shared broker's tenant "ratelimited" may send 3 requests at once and then one every
10 s; "solo" may have one request in flight and one standing GET stream (a POST held in flight
is tested in test_request_slots.py, with a server that takes its time). Limits are per tenant:
one tenant hitting its limit never slows another.
"""

from __future__ import annotations

import threading

import pytest

from broker.testing import Broker
from tests.broker.support import (
    CALL_TIMEOUT_SECONDS,
    LegacySession,
    call_modern,
    events_since,
    last_seq,
    mcp_error,
    open_http,
    open_mcp,
    rpc_reply,
    terminal,
    wait_for,
)

pytestmark = pytest.mark.anyio
FREED_WITHIN = CALL_TIMEOUT_SECONDS / 2


def test_rate_limit_answers_429_with_retry_after(broker: Broker) -> None:
    before = last_seq(broker)
    statuses = []
    with open_http(broker, broker.token(tenant="ratelimited")) as http:
        for _ in range(6):
            # a tool outside every policy: refused after the limiter, so no sandbox is needed
            response = call_modern(http, "no_such_tool", {})
            statuses.append(response.status_code)
            if response.status_code == 429:
                limited = response
    assert statuses[:3] == [400, 400, 400] and statuses[3:] == [429, 429, 429]  # -32602, then 429
    assert 1 <= int(limited.headers["retry-after"]) <= 10
    assert limited.json()["error"] == {"code": -32002, "message": "Too many requests"}
    events = terminal(events_since(broker, before))
    assert [e["reason"] for e in events][-3:] == ["rate_limited"] * 3
    assert all(e["tenant"] == "ratelimited" and e["status"] == 429 for e in events[-3:])
    # other tenants are not affected
    with open_http(broker, broker.token(tenant="acme")) as http:
        assert call_modern(http, "no_such_tool", {}).status_code == 400


async def test_rate_limited_mcp_client_gets_a_clean_error(broker: Broker) -> None:
    with pytest.raises(BaseException) as raised:
        async with open_mcp(broker, broker.token(tenant="ratelimited-too"), mode="auto") as client:
            for _ in range(5):
                await client.call_tool("no_such_tool", {})
    error = mcp_error(raised.value)
    assert error is not None and error.code in (-32002, -32602), raised.value


def test_stream_cap_answers_429_and_frees_the_slot(broker: Broker) -> None:
    """The tenant "solo" may hold one standing GET stream and have one request in flight: the stream is
    capped on its own (`max_streams`), never in the request slot (an idle client held it,
    and eight of them locked their tenant out)."""
    token = broker.token(tenant="solo")
    with open_http(broker, token) as http:
        session = LegacySession(http)
        listing = {"jsonrpc": "2.0", "id": 5, "method": "tools/list"}
        assert session.post(listing).status_code == 200
        before = last_seq(broker)
        with (
            open_http(broker, token) as streamer,
            streamer.stream(
                "GET", "/mcp", headers={**session.headers(), "accept": "text/event-stream"}
            ) as stream,
        ):
            assert stream.status_code == 200
            with open_http(broker, token) as other:
                busy = other.get("/mcp", headers={**session.headers(), "accept": "text/event-stream"})
                # the stream does not take the tenant's one request slot
                assert session.post(listing, other).status_code == 200
            assert busy.status_code == 429
            assert busy.headers["retry-after"] == "1"
            assert busy.json()["error"] == {"code": -32002, "message": "Too many open streams"}
            refused = [e for e in terminal(events_since(broker, before)) if e["status"] == 429]
            assert [(e["method"], e["reason"], e["outcome"]) for e in refused] == [
                ("GET", "streams_limited", "denied")
            ]
            # another tenant is not affected
            with open_http(broker, broker.token(tenant="acme")) as acme:
                assert call_modern(acme, "read_document", {"filename": "nothing.md"}).status_code == 200
        # the client went away: its slot comes back at once, not when some upstream read times
        # out (CALL_TIMEOUT_SECONDS) or never (the sandbox pings an idle stream every 15 s)
        assert wait_for(lambda: session.stream_status(http) == 200, timeout=FREED_WITHIN)


def test_slot_is_freed_when_a_client_drops_a_stream(broker: Broker) -> None:
    """A client that vanishes (no DELETE, connection cut) must not keep the slot forever."""
    token = broker.token(tenant="solo")
    with open_http(broker, token) as http:
        session = LegacySession(http)
        listing = {"jsonrpc": "2.0", "id": 6, "method": "tools/list"}
        opened = threading.Event()
        held: list[int] = []

        def open_and_vanish() -> None:
            client = open_http(broker, token)
            with client.stream(
                "GET", "/mcp", headers={**session.headers(), "accept": "text/event-stream"}
            ) as s:
                assert s.status_code == 200
                opened.set()
                with open_http(broker, token) as other:  # the stream holds the slot meanwhile
                    held.append(session.stream_status(other))
            client.close()  # the TCP connection is cut; nothing else is said

        worker = threading.Thread(target=open_and_vanish)
        worker.start()
        assert opened.wait(10)
        worker.join()
        assert held == [429]
        assert wait_for(lambda: session.stream_status(http) == 200, timeout=FREED_WITHIN)
        assert rpc_reply(session.post(listing))["result"]["tools"]
