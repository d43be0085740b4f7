"""Bodies the broker could not write back are refused before anything runs, and no approval is
used up by a save that never reached the sandbox (issue: a lone-surrogate id gave a 500 after the
call had run, unaudited, with the approval marked consumed and nothing written)."""

from __future__ import annotations

import json
from pathlib import Path

import httpx2
import pytest

from broker.testing import Broker, running_broker
from tests.broker.support import (
    MODERN,
    approver,
    decide,
    events_since,
    last_seq,
    modern_headers,
    open_http,
    open_mcp,
    rpc_reply,
    terminal,
    unique,
)

pytestmark = pytest.mark.anyio

META = (
    '"_meta":{"io.modelcontextprotocol/protocolVersion":"' + MODERN + '",'
    '"io.modelcontextprotocol/clientCapabilities":{}}'
)


def raw_call(tool: str, arguments_json: str, id_json: str = '"\\ud800"') -> bytes:
    """A tools/call body spelled by hand: json.dumps would refuse to write what we test."""
    return (
        '{"jsonrpc":"2.0","id":' + id_json + ',"method":"tools/call",'
        '"params":{"name":"' + tool + '","arguments":' + arguments_json + "," + META + "}}"
    ).encode()


def post_raw(http: httpx2.Client, tool: str, body: bytes) -> httpx2.Response:
    return http.post("/mcp", content=body, headers=modern_headers("tools/call", tool))


async def approved_save(broker: Broker, name: str, content: str) -> str:
    """An out-of-band approval for exactly this report, decided by a human. Raw JSON-RPC: the
    gate answers it without a sandbox (the mcp.Client would first discover through one)."""
    with open_http(broker, broker.token()) as http:
        r = post_raw(http, "save_report", raw_call("save_report", json.dumps(
            {"filename": name, "content": content}), "1"))  # fmt: skip
    waiting = rpc_reply(r)["result"]["structuredContent"]
    assert waiting["status"] == "waiting_approval", waiting
    approval_id: str = waiting["data"]["approval_id"]
    assert decide(broker, approval_id).status_code == 200
    return approval_id


def approval_state(broker: Broker, approval_id: str) -> str:
    with approver(broker) as http:
        r = http.get(f"/v1/approvals/{approval_id}")
    assert r.status_code == 200, r.text
    state: str = r.json()["state"]
    return state


BAD_READS = {
    "lone-surrogate-id": raw_call("read_document", '{"filename":"welcome.md"}'),
    "lone-surrogate-argument": raw_call("read_document", '{"filename":"welcome\\ud800.md"}', "1"),
    "nan-argument": raw_call("search_documents", '{"query":"a","max_results":NaN}', "1"),
    "big-id-and-lone-surrogate": raw_call(
        "read_document", '{"filename":"\\udc00"}', "123456789012345678901234567890"
    ),
}


@pytest.mark.parametrize("body", BAD_READS.values(), ids=BAD_READS.keys())
def test_an_unencodable_read_is_refused_audited_and_never_forwarded(broker: Broker, body: bytes) -> None:
    seq = last_seq(broker)
    with open_http(broker, broker.token()) as http:
        r = post_raw(http, "read_document", body)
    assert r.status_code == 400, r.text
    reply = rpc_reply(r)
    assert reply["id"] is None and reply["error"]["code"] == -32700
    events = events_since(broker, seq)
    assert [(e["event"], e["outcome"], e["reason"]) for e in terminal(events)] == [
        ("mcp.request", "error", "parse_error")
    ]
    assert "sandbox" not in terminal(events)[0]  # no sandbox was asked


async def test_an_unencodable_save_keeps_its_approval_and_writes_nothing(broker: Broker) -> None:
    name, content = unique("surrogate"), "approved words"
    approval_id = await approved_save(broker, name, content)
    args = '{"filename":"' + name + '","content":"' + content + '"}'
    seq = last_seq(broker)
    with open_http(broker, broker.token()) as http:
        r = post_raw(http, "save_report", raw_call("save_report", args))
    assert r.status_code == 400 and rpc_reply(r)["error"]["code"] == -32700
    assert not (broker.reports("acme") / name).exists()
    assert approval_state(broker, approval_id) == "approved"
    events = events_since(broker, seq)
    assert "approval.consumed" not in {e["event"] for e in events}
    assert len(terminal(events)) == 1
    # the approval still holds for the same save, sent properly
    async with open_mcp(broker, broker.token()) as c:
        done = (await c.call_tool("save_report", {"filename": name, "content": content})).structured_content
    assert done is not None and done["status"] == "ok"
    assert (broker.reports("acme") / name).read_text() == content
    assert approval_state(broker, approval_id) == "consumed"


async def test_a_save_that_never_reached_a_sandbox_gives_its_approval_back(tmp_path: Path) -> None:
    # A sandbox that cannot start: the consumed approval must not be burnt by a call that
    # was refused before anything was sent.
    env = {"DOCBROKER_LOCAL_SERVER_COMMAND": "/bin/false", "DOCBROKER_BREAKER_THRESHOLD": "100"}
    with running_broker(tmp_path, env=env) as broker:
        name, content = unique("unsent"), "words for later"
        approval_id = await approved_save(broker, name, content)
        seq = last_seq(broker)
        with open_http(broker, broker.token()) as http:
            body = raw_call("save_report", f'{{"filename":"{name}","content":"{content}"}}', "5")
            r = post_raw(http, "save_report", body)
        assert r.status_code == 503, r.text
        assert rpc_reply(r)["id"] == 5
        assert approval_state(broker, approval_id) == "approved"
        events = events_since(broker, seq)
        kinds = [e["event"] for e in events if e["event"] in ("approval.consumed", "approval.released")]
        assert kinds == ["approval.consumed", "approval.released"]
        released = next(e for e in events if e["event"] == "approval.released")
        assert (released["approval_id"], released["reason"]) == (approval_id, "not_forwarded")
        assert terminal(events)[-1]["outcome"] == "error"
        assert not (broker.reports("acme") / name).exists()
