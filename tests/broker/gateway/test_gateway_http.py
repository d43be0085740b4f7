"""The /mcp endpoint as a gateway: what it refuses before a sandbox sees anything, legacy
session ownership, and what a caller may see and call (DESIGN §4, §5, §8)."""

from __future__ import annotations

from collections.abc import Iterator

import httpx2
import pytest

from broker.testing import ALL_SCOPES, Broker, structured
from tests.broker.support import (
    MODERN,
    MODES,
    READ_SCOPE,
    LegacySession,
    call_modern,
    last_seq,
    mcp_error,
    modern_body,
    modern_headers,
    open_http,
    open_mcp,
    post_modern,
    rpc_reply,
    terminal,
    unique,
)

JSON = {"content-type": "application/json", "accept": "application/json, text/event-stream"}
MAX_BODY = 256 * 1024  # DOCBROKER_MAX_BODY_BYTES default


@pytest.fixture
def http(broker: Broker) -> Iterator[httpx2.Client]:
    with open_http(broker, broker.token()) as client:
        yield client


def refused(response: httpx2.Response, status: int, code: int) -> str:
    assert response.status_code == status, response.text
    body = response.json()
    assert body["jsonrpc"] == "2.0" and body["error"]["code"] == code, body
    message: str = body["error"]["message"]
    return message


# -- malformed requests -------------------------------------------------------------------------


def test_json_rpc_batch_is_rejected_with_a_clear_error(broker: Broker, http: httpx2.Client) -> None:
    before = last_seq(broker)
    batch = [modern_body("tools/list", request_id=1), modern_body("tools/list", request_id=2)]
    message = refused(http.post("/mcp", json=batch, headers=modern_headers("tools/list")), 400, -32600)
    assert message == "Body must be a single JSON-RPC request or notification object"  # the SDK's text
    [event] = terminal([e for e in broker.audit_events() if e["seq"] > before])
    assert (event["outcome"], event["reason"], event["status"]) == ("error", "batch_rejected", 400)


def test_body_that_is_not_json_is_a_parse_error(http: httpx2.Client) -> None:
    message = refused(http.post("/mcp", content=b'{"jsonrpc": "2.0", "id": 1,', headers=JSON), 400, -32700)
    assert "parse" in message.lower()


@pytest.mark.parametrize(
    "request_id", [2**70, -(2**64), 12345678901234567890], ids=["2^70", "-2^64", "20-digits"]
)
def test_an_id_past_64_bits_is_answered_with_exactly_that_id(http: httpx2.Client, request_id: int) -> None:
    # JSON-RPC ids are the client's; the fast JSON path would turn these into floats.
    meta = (
        b'{"io.modelcontextprotocol/protocolVersion":"2026-07-28",'
        + b'"io.modelcontextprotocol/clientCapabilities":{}}'
    )
    raw = b'{"jsonrpc":"2.0","id":%d,"method":"resources/list","params":{"_meta":%s}}' % (request_id, meta)
    response = http.post("/mcp", content=raw, headers=modern_headers("resources/list"))
    assert response.status_code == 404  # -32601: the status the SDK gives it at 2026-07-28
    assert f'"id":{request_id},'.encode() in response.content, response.content


@pytest.mark.parametrize(
    "body",
    [b'"just a string"', b'{"jsonrpc": "1.0", "id": 1, "method": "ping"}', b'{"jsonrpc": "2.0", "id": 1}'],
    ids=["not-an-object", "wrong-version", "no-method"],
)
def test_invalid_json_rpc_objects_are_invalid_requests(http: httpx2.Client, body: bytes) -> None:
    # The SDK's answers: -32600 at 2026-07-28; its handshake-era transport says -32602.
    refused(http.post("/mcp", content=body, headers={**JSON, "mcp-protocol-version": MODERN}), 400, -32600)
    refused(http.post("/mcp", content=body, headers=JSON), 400, -32602)


def test_oversized_body_is_rejected_before_reading_it(broker: Broker, http: httpx2.Client) -> None:
    before = last_seq(broker)
    huge = modern_body(
        "tools/call", {"name": "search_documents", "arguments": {"query": "x" * (MAX_BODY + 1)}}
    )
    message = refused(
        http.post("/mcp", json=huge, headers=modern_headers("tools/call", "search_documents")), 413, -32600
    )
    assert "too large" in message.lower()
    [event] = terminal([e for e in broker.audit_events() if e["seq"] > before])
    assert (event["reason"], event["status"]) == ("body_too_large", 413)


def test_oversized_chunked_body_without_length_is_rejected(http: httpx2.Client) -> None:
    def chunks() -> Iterator[bytes]:
        yield b'{"jsonrpc":"2.0","id":1,"method":"ping","params":{"pad":"'
        for _ in range(MAX_BODY // 65536 + 2):
            yield b"x" * 65536
        yield b'"}}'

    response = http.post("/mcp", content=chunks(), headers=JSON)
    assert "content-length" not in response.request.headers
    refused(response, 413, -32600)


def test_wrong_content_type_and_http_method(http: httpx2.Client) -> None:
    # the SDK's answer: 400, a plain-text body
    response = http.post("/mcp", content=b"{}", headers={"content-type": "text/plain"})
    assert (response.status_code, response.text) == (400, "Invalid Content-Type header")
    refused(http.put("/mcp", content=b"{}", headers=JSON), 405, -32600)
    refused(http.get("/mcp"), 400, -32600)  # a GET stream belongs to a session


@pytest.mark.parametrize(
    "method",
    ["resources/list", "prompts/list", "completion/complete", "logging/setLevel", "sampling/createMessage"],
)
def test_methods_the_tools_do_not_need_are_refused(http: httpx2.Client, method: str) -> None:
    response = post_modern(http, method, {})
    assert response.status_code == 404  # -32601's status at 2026-07-28 (the SDK's table)
    assert rpc_reply(response)["error"]["code"] == -32601


def test_routing_headers_must_match_the_body(http: httpx2.Client) -> None:
    body = modern_body(
        "tools/call", {"name": "save_report", "arguments": {"filename": "a.md", "content": "x"}}
    )
    # A policy that judged the header would see a read; the body asks for a write.
    response = http.post("/mcp", json=body, headers=modern_headers("tools/call", "read_document"))
    assert response.status_code == 400
    response = http.post("/mcp", json=body, headers=modern_headers("tools/list"))
    assert response.status_code == 400


# -- legacy sessions belong to their principal --------------------------------------------------


def test_legacy_session_id_is_bound_to_tenant_and_subject(broker: Broker) -> None:
    with open_http(broker, broker.token(subject="alice")) as alice_http:
        session = LegacySession(alice_http)
        listing = {"jsonrpc": "2.0", "id": 3, "method": "tools/list"}
        assert session.post(listing).status_code == 200
        others = {
            "same tenant, other subject": broker.token(subject="bob"),
            "other tenant, same subject": broker.token(tenant="globex", subject="alice"),
            "other tenant, other subject": broker.token(tenant="globex", subject="bob"),
        }
        for who, token in others.items():
            with open_http(broker, token) as other:
                response = session.post(listing, other)
                assert response.status_code == 404, who
                assert response.json()["error"]["message"] == "Session not found"
                assert other.get("/mcp", headers=session.headers()).status_code == 404, who
                assert other.delete("/mcp", headers=session.headers()).status_code == 404, who
        # a stranger's DELETE did not end it: the owner still uses it, and ends it
        assert session.post(listing).status_code == 200
        assert alice_http.delete("/mcp", headers=session.headers()).status_code == 200
        assert session.post(listing).status_code == 404


def test_unknown_or_overlong_session_ids_are_not_found(http: httpx2.Client) -> None:
    for session_id in ("0" * 32, "x" * 4096):
        headers = {**JSON, "mcp-session-id": session_id, "mcp-protocol-version": "2025-11-25"}
        response = http.post(
            "/mcp", json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"}, headers=headers
        )
        assert response.status_code == 404


@pytest.mark.anyio
async def test_legacy_client_works_and_its_session_is_its_own(broker: Broker) -> None:
    async with open_mcp(broker, broker.token(), mode="legacy") as client:
        assert client.protocol_version == "2025-11-25"
        assert {t.name for t in (await client.list_tools()).tools} == {
            "search_documents",
            "read_document",
            "save_report",
        }


# -- what a caller may see and call -------------------------------------------------------------


async def listed(broker: Broker, mode: str, tenant: str = "acme", scope: str = ALL_SCOPES) -> dict[str, dict]:
    async with open_mcp(broker, broker.token(tenant=tenant, scope=scope), mode=mode) as client:
        return {t.name: t.input_schema for t in (await client.list_tools()).tools}


@pytest.mark.anyio
@pytest.mark.parametrize("mode", MODES)
async def test_tools_list_hides_approval_token(broker: Broker, mode: str) -> None:
    tools = await listed(broker, mode)
    assert set(tools) == {"search_documents", "read_document", "save_report"}
    schema = tools["save_report"]
    assert set(schema["properties"]) == {"filename", "content"}
    assert "approval_token" not in schema.get("required", [])
    assert "approval_token" not in str(tools)


@pytest.mark.anyio
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize(
    ("tenant", "scope", "expected"),
    [
        ("acme", "docs:read", {"search_documents", "read_document"}),
        ("acme", "docs:write", {"save_report"}),
        ("acme", "reports:approve", set()),
        ("acme", "", set()),
        ("readonly", ALL_SCOPES, {"search_documents", "read_document"}),
        ("readonly", "docs:write", set()),
    ],
    ids=["read", "write", "approve-only", "no-scope", "policy-read-only", "policy-read-only-write-scope"],
)
async def test_tools_list_is_filtered_by_scope_and_tenant_policy(
    broker: Broker, mode: str, tenant: str, scope: str, expected: set[str]
) -> None:
    assert set(await listed(broker, mode, tenant, scope)) == expected


@pytest.mark.anyio
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize(
    ("tenant", "scope", "tool", "arguments"),
    [
        ("readonly", ALL_SCOPES, "save_report", {"filename": "x.md", "content": "x"}),
        ("acme", READ_SCOPE, "save_report", {"filename": "x.md", "content": "x"}),
        ("acme", "docs:write", "read_document", {"filename": "a.md"}),
        ("acme", "", "search_documents", {"query": "x"}),
        ("acme", ALL_SCOPES, "delete_everything", {}),
    ],
    ids=["outside-tenant-policy", "write-without-scope", "read-without-scope", "no-scope", "unknown-tool"],
)
async def test_tool_outside_scope_or_policy_cannot_be_called(
    broker: Broker, mode: str, tenant: str, scope: str, tool: str, arguments: dict
) -> None:
    before = last_seq(broker)
    reports = set(broker.reports(tenant).iterdir()) if broker.reports(tenant).exists() else set()
    async with open_mcp(broker, broker.token(tenant=tenant, scope=scope), mode=mode) as client:
        with pytest.raises(BaseException) as raised:
            await client.call_tool(tool, arguments)
    error = mcp_error(raised.value)
    assert error is not None and error.code == -32602, raised.value
    events = terminal(
        [e for e in broker.audit_events() if e["seq"] > before and e.get("method") == "tools/call"]
    )
    assert [(e["event"], e["outcome"], e["reason"]) for e in events] == [
        ("policy.denied", "denied", "tool_not_allowed")
    ]
    after = set(broker.reports(tenant).iterdir()) if broker.reports(tenant).exists() else set()
    assert after == reports


def test_tool_outside_policy_refused_on_raw_http_too(broker: Broker) -> None:
    with open_http(broker, broker.token(tenant="readonly")) as http:
        response = call_modern(http, "save_report", {"filename": unique(), "content": "x"})
    assert response.status_code == 400  # -32602's status at 2026-07-28 (the SDK's table)
    assert rpc_reply(response)["error"] == {"code": -32602, "message": "Unknown tool"}


@pytest.mark.anyio
async def test_modern_client_negotiates_2026(broker: Broker) -> None:
    broker.sources("acme").mkdir(parents=True, exist_ok=True)
    (broker.sources("acme") / "gateway-note.md").write_text("the gateway forwards this")
    async with open_mcp(broker, broker.token(), mode="auto") as client:
        assert client.protocol_version == MODERN
        result = structured(await client.call_tool("read_document", {"filename": "gateway-note.md"}))
    assert result["status"] == "ok"
    assert result["data"]["content"] == "the gateway forwards this"
