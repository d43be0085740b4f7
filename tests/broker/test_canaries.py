"""Canaries: unique values placed in every argument, file content, token and header — on
requests that succeed and on requests that are refused — must never appear in the audit log
or in any log the broker (or a tenant server it started) writes (DESIGN §5, §6).

Each canary is distinct, so a failure names the place that leaked. The test also checks that
the canaries really went through the system (the client got the document's canary back, the
report holds the content canary): a canary that never travelled proves nothing.
"""

from __future__ import annotations

import secrets
from typing import Any

import mcp_types
import pytest

from broker.testing import Broker, structured
from tests.broker.support import (
    MODES,
    LegacySession,
    call_modern,
    decide,
    modern_body,
    modern_headers,
    open_http,
    open_mcp,
    post_modern,
    tool_status,
)

pytestmark = pytest.mark.anyio


class Canaries:
    def __init__(self) -> None:
        self.values: dict[str, str] = {}

    def __call__(self, where: str) -> str:
        # Letters and digits only, so a canary fits a filename, a tenant-safe header, a query.
        value = f"cnry{secrets.token_hex(6)}"
        self.values[where] = value
        return value


@pytest.fixture(scope="module")
def canaries() -> Canaries:
    return Canaries()


def headers_with(c: Canaries, where: str) -> dict[str, str]:
    return {
        "x-canary": c(f"{where}:x-header"),
        "user-agent": c(f"{where}:user-agent"),
        "cookie": f"session={c(f'{where}:cookie')}",
        "referer": f"https://example.test/{c(f'{where}:referer')}",
        "x-forwarded-for": c(f"{where}:forwarded"),
        "mcp-param-query": c(f"{where}:mcp-param"),
    }


def canary_token(broker: Broker, c: Canaries, where: str, **claims: Any) -> str:
    token = broker.token(
        jti=c(f"{where}:jti"), name=c(f"{where}:claim"), email=f"{c(f'{where}:email')}@x.test", **claims
    )
    c.values[f"{where}:whole-token"] = token
    c.values[f"{where}:signature"] = token.rsplit(".", 1)[1]
    return token


@pytest.mark.parametrize("mode", MODES)
async def test_successful_calls_leak_nothing(broker: Broker, canaries: Canaries, mode: str) -> None:
    c = canaries
    doc_name = f"{c(f'{mode}:source-filename')}.md"
    doc_word = c(f"{mode}:file-content")
    broker.sources("acme").mkdir(parents=True, exist_ok=True)
    (broker.sources("acme") / doc_name).write_text(f"intro\n{doc_word} is the secret\n")
    report_name = f"{c(f'{mode}:report-filename')}.md"
    report_text = f"report body {c(f'{mode}:report-content')}"

    token = canary_token(broker, c, mode)

    async def human(_ctx: Any, _params: Any) -> mcp_types.ElicitResult:
        return mcp_types.ElicitResult(action="accept", content={"decision": "approve"})

    headers = headers_with(c, mode)
    async with open_mcp(broker, token, mode, headers=headers, elicitation_callback=human) as client:
        found = structured(await client.call_tool("search_documents", {"query": doc_word, "max_results": 1}))
        assert found["status"] == "ok" and doc_word in str(found)
        read = structured(await client.call_tool("read_document", {"filename": doc_name}))
        assert read["status"] == "ok" and doc_word in read["data"]["content"]
        saved = structured(
            await client.call_tool("save_report", {"filename": report_name, "content": report_text})
        )
        if mode == "legacy":  # no in-band in the handshake era: approve over REST, call again
            assert saved["status"] == "waiting_approval"
            assert decide(broker, saved["data"]["approval_id"]).status_code == 200
            saved = structured(
                await client.call_tool("save_report", {"filename": report_name, "content": report_text})
            )
        assert saved["status"] == "ok", saved
    assert (broker.reports("acme") / report_name).read_text() == report_text
    assert_no_leak(broker, c)


async def test_refused_and_invalid_calls_leak_nothing(broker: Broker, canaries: Canaries) -> None:
    c = canaries
    good = canary_token(broker, c, "refused")
    extra = headers_with(c, "refused")
    with open_http(broker, good) as http:
        http.headers.update(extra)
        invalid_arguments = [
            ("search_documents", {"query": c("query-too-long") + "x" * 80}),
            ("search_documents", {"query": "a", "max_results": c("max-results-not-int")}),
            ("search_documents", {"query": "a", "unexpected": c("unknown-argument-value")}),
            ("read_document", {"filename": f"../{c('filename-traversal')}.md"}),
            ("read_document", {"filename": f"{c('missing-file')}.md"}),
            ("save_report", {"filename": f"{c('bad-report-name')}.txt", "content": "x"}),
            ("save_report", {"filename": "big.md", "content": c("content-too-long") + "y" * 8000}),
            (
                "save_report",
                {"filename": "tok.md", "content": "x", "approval_token": c("client-approval-token")},
            ),
        ]
        for tool, arguments in invalid_arguments:
            status = tool_status(call_modern(http, tool, arguments))
            assert status["status"] in ("rejected", "failed"), (tool, status)
        # a canary as the JSON-RPC id, in _meta, in the URL, in a broken body
        post_modern(http, "tools/list", {"_extra": c("params-value")}, request_id=c("jsonrpc-id"))
        body = modern_body("tools/list")
        body["params"]["_meta"]["progressToken"] = c("meta-value")
        http.post("/mcp", json=body, headers=modern_headers("tools/list"))
        http.post(
            f"/mcp?q={c('url-query')}", json=modern_body("tools/list"), headers=modern_headers("tools/list")
        )
        http.post(
            "/mcp",
            content=f'{{"jsonrpc":"2.0","id":1,"method":"{c("broken-json")}'.encode(),
            headers={"content-type": "application/json"},
        )
        http.post(
            "/mcp",
            json=[{"jsonrpc": "2.0", "id": 1, "method": c("batch-member")}],
            headers={"content-type": "application/json"},
        )
        http.post(
            "/mcp",
            json={
                "jsonrpc": "2.0",
                "id": 1,
                "method": "tools/call",
                "params": {"name": "read_document", "arguments": {"filename": "a.md"}},
            },
            headers={**modern_headers("tools/call", c("mismatched-routing-header"))},
        )
        http.post(f"/v1/approvals/{c('approval-id-path')}/approve")
        session = LegacySession(http)
        session.call("read_document", {"filename": f"{c('legacy-filename')}.md"})
        http.post(
            "/mcp",
            json=modern_body("tools/list"),
            headers={**modern_headers("tools/list"), "mcp-session-id": c("forged-session-id")},
        )

    # refused tokens that carry canaries: bad signature, expired, unknown tenant, not a JWT at all
    refused_tokens = [
        canary_token(broker, c, "expired", iat=1, exp=2),
        canary_token(broker, c, "unknown-tenant", tenant="initech"),
        canary_token(broker, c, "tampered")[:-4] + "AAAA",
        c("garbage-token"),
        "eyJhbGciOiJub25lIn0." + c("unsigned-payload") + ".",
    ]
    for token in refused_tokens:
        with open_http(broker, token) as http:
            assert http.post(
                "/mcp", json=modern_body("tools/list"), headers=modern_headers("tools/list")
            ).status_code in (401, 403)
            assert http.get("/v1/approvals").status_code in (401, 403)
    with open_http(broker) as http:
        http.post(
            "/mcp",
            json=modern_body("tools/list"),
            headers={**modern_headers("tools/list"), "authorization": f"Basic {c('basic-credentials')}"},
        )
    assert_no_leak(broker, c)


async def test_approvals_page_and_api_leak_nothing(broker: Broker, canaries: Canaries) -> None:
    c = canaries
    name, content = f"{c('approval-filename')}.md", f"to approve: {c('approval-content')}"
    async with open_mcp(broker, canary_token(broker, c, "approval"), mode="legacy") as client:
        waiting = structured(await client.call_tool("save_report", {"filename": name, "content": content}))
    approval_id = waiting["data"]["approval_id"]
    with open_http(broker, broker.token(subject="carol", scope="reports:approve")) as http:
        http.headers.update(headers_with(c, "approver"))
        assert http.get(f"/v1/approvals/{approval_id}").json()["content"] == content
        assert http.post(f"/v1/approvals/{approval_id}/deny").status_code == 200
        assert http.get("/approvals", params={"id": approval_id}).status_code == 200
    assert_no_leak(broker, c)


def assert_no_leak(broker: Broker, c: Canaries) -> None:
    audit = broker.audit_file.read_text()
    logs = broker.logs()
    assert audit and c.values
    leaked = {where: value for where, value in c.values.items() if value in audit or value in logs}
    assert leaked == {}, f"canaries found in the audit log or broker logs: {sorted(leaked)}"
