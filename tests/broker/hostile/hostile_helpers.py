"""What the attacker's-side tests see: raw 2026-07-28 JSON-RPC through the broker, the audit
log, approvals over REST, and the hostile server's own record of what reached it.

Raw HTTP shows exactly what a client receives (status, headers, every SSE event); the real
`mcp.Client` (harness `Broker.client`) shows that a real client copes with it.
"""

from __future__ import annotations

import itertools
import json
import secrets
import time
from dataclasses import dataclass, field
from typing import Any

import httpx2

from broker.testing import ALL_SCOPES, Broker

MODERN = "2026-07-28"
# The brokers' settings (conftest). The call timeout is generous for a loaded CI host, yet far
# below the hostile server's 30-second sleeps.
CALL_TIMEOUT = 2.0
BREAKER_THRESHOLD = 2
BREAKER_COOLDOWN = 2.0
_ids = itertools.count(1)


@dataclass
class Reply:
    """One HTTP exchange with the broker's /mcp endpoint."""

    status: int
    headers: httpx2.Headers
    answer: dict[str, Any] | None  # the JSON-RPC message answering our request
    others: list[Any] = field(default_factory=list)  # any other messages (SSE), as received
    raw: bytes = b""

    @property
    def result(self) -> dict[str, Any]:
        assert self.answer is not None and "result" in self.answer, self
        value = self.answer["result"]
        assert isinstance(value, dict)
        return value

    @property
    def structured(self) -> dict[str, Any]:
        value = self.result.get("structuredContent")
        assert isinstance(value, dict), self
        return value

    @property
    def error_code(self) -> int | None:
        if self.answer is None or "error" not in self.answer:
            return None
        return int(self.answer["error"]["code"])


# The handshake era's version header: `initialize`, `ping` and client notifications are that
# era's (at 2026-07-28 the SDK answers the first two -32601 and drops notifications, 202).
HANDSHAKE = {"mcp-protocol-version": "2025-11-25"}


class Rpc:
    """A minimal 2026-07-28 client for one tenant: one JSON POST per request."""

    def __init__(self, broker: Broker, tenant: str, scope: str = ALL_SCOPES, timeout: float = 30) -> None:
        self.broker = broker
        self.tenant = tenant
        self.token = broker.token(tenant=tenant, scope=scope)
        self.timeout = timeout

    def post(
        self,
        method: str,
        params: dict[str, Any] | None = None,
        *,
        notification: bool = False,
        headers: dict[str, str] | None = None,
        body: dict[str, Any] | None = None,
    ) -> Reply:
        rid = None if notification else f"t-{next(_ids)}"
        meta = {
            "io.modelcontextprotocol/protocolVersion": MODERN,
            "io.modelcontextprotocol/clientCapabilities": {},
        }
        if body is None:
            handshake = (headers or {}).get("mcp-protocol-version") == HANDSHAKE["mcp-protocol-version"]
            envelope = {} if handshake else {"_meta": meta}  # that era's requests carry none
            body = {"jsonrpc": "2.0", "method": method, "params": {**(params or {}), **envelope}}
            if rid is not None:
                body["id"] = rid
        sent = {
            "authorization": f"Bearer {self.token}",
            "content-type": "application/json",
            "accept": "application/json, text/event-stream",
            "mcp-protocol-version": MODERN,
            "mcp-method": method,
            **({"mcp-name": params["name"]} if method == "tools/call" and params else {}),
            **(headers or {}),
        }
        response = httpx2.post(
            self.broker.mcp_url, content=json.dumps(body), headers=sent, timeout=self.timeout
        )
        return _reply(response, body.get("id"))

    def call(self, tool: str, arguments: dict[str, Any], **kwargs: Any) -> Reply:
        return self.post("tools/call", {"name": tool, "arguments": arguments}, **kwargs)

    def read(self, filename: str) -> Reply:
        return self.call("read_document", {"filename": filename})

    def search(self, query: str) -> Reply:
        return self.call("search_documents", {"query": query})

    def tool_names(self) -> list[str]:
        reply = self.post("tools/list")
        assert reply.status == 200, reply
        return sorted(t["name"] for t in reply.result["tools"])

    def save_approved(self, filename: str, content: str) -> Reply:
        """save_report the out-of-band way: ask, approve over REST, ask again."""
        first = self.call("save_report", {"filename": filename, "content": content})
        assert first.structured["status"] == "waiting_approval", first
        approval_id = first.structured["data"]["approval_id"]
        with self.broker.http(self.token) as http:
            assert http.get(f"/v1/approvals/{approval_id}").status_code == 200  # read first
            decided = http.post(f"/v1/approvals/{approval_id}/approve")
        assert decided.status_code == 200, decided.text
        return self.call("save_report", {"filename": filename, "content": content})


def _reply(response: httpx2.Response, rid: Any) -> Reply:
    raw = response.content
    ctype = response.headers.get("content-type", "")
    messages: list[Any] = []
    if ctype.startswith("text/event-stream"):
        for event in raw.decode().replace("\r\n", "\n").split("\n\n"):
            data = [line[5:].lstrip() for line in event.split("\n") if line.startswith("data:")]
            if data:
                messages.append(json.loads("\n".join(data)))
    elif ctype.startswith("application/json") and raw:
        messages.append(json.loads(raw))
    answers = [m for m in messages if isinstance(m, dict) and m.get("id") == rid and "method" not in m]
    others = [m for m in messages if not (isinstance(m, dict) and m.get("id") == rid and "method" not in m)]
    assert len(answers) <= 1, f"more than one answer to one request: {answers}"
    return Reply(response.status_code, response.headers, answers[0] if answers else None, others, raw)


# -- what the broker recorded ------------------------------------------------------------------


def events(broker: Broker, event: str | None = None, **match: Any) -> list[dict[str, Any]]:
    return [
        e
        for e in broker.audit_events()
        if (event is None or e["event"] == event) and all(e.get(k) == v for k, v in match.items())
    ]


def last_request(broker: Broker, tenant: str, **match: Any) -> dict[str, Any]:
    """The latest terminal event of a tenant's requests (mcp.request or policy.denied)."""
    found = [
        e
        for e in broker.audit_events()
        if e["event"] in ("mcp.request", "policy.denied")
        and e.get("tenant") == tenant
        and "request_id" in e
        and e.get("reason") != "sandbox_message_refused"
        and all(e.get(k) == v for k, v in match.items())
    ]
    assert found, f"no terminal event for {tenant} matching {match}"
    return found[-1]


def rejected(broker: Broker, tenant: str) -> set[tuple[str | None, str]]:
    """(tool, reason) of the tenant's tools.rejected events; tool None when not allow-listed."""
    return {(e.get("tool"), e["reason"]) for e in events(broker, "tools.rejected", tenant=tenant)}


# -- what reached the sandbox ------------------------------------------------------------------


def sandbox_calls(broker: Broker, tenant: str, method: str | None = None) -> list[dict[str, Any]]:
    path = broker.data_dir / "tenants" / tenant / "hostile-calls.jsonl"
    if not path.exists():
        return []
    calls = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [c for c in calls if method is None or c["method"] == method]


def tool_calls(broker: Broker, tenant: str, tool: str | None = None) -> list[dict[str, Any]]:
    return [c for c in sandbox_calls(broker, tenant, "tools/call") if tool is None or c["tool"] == tool]


def unique(prefix: str = "r") -> str:
    return f"{prefix}-{secrets.token_hex(4)}.md"


def wait_for(predicate: Any, timeout: float = 10.0, interval: float = 0.05) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError("condition not reached in time")


# -- contract pinning --------------------------------------------------------------------------


def contract_breaks(broker: Broker, tenant: str) -> str:
    """Drive a "changing" sandbox from honest to changed: the call that sees it is refused, the
    sandbox is replaced at once, and calls are refused for the breaker's cool-down without
    anything reaching a sandbox. Returns the changed sandbox's id."""
    rpc = Rpc(broker, tenant)
    assert rpc.tool_names() == ["read_document", "save_report", "search_documents"]  # unchanged
    assert rpc.read("notes.md").structured["status"] == "ok"
    broken = last_request(broker, tenant)["sandbox"]
    (broker.data_dir / "tenants" / tenant / "hostile-change").touch()  # the sandbox changes its mind
    calls = len(tool_calls(broker, tenant))

    listed = rpc.post("tools/list")
    assert (listed.status, listed.error_code) == (503, -32001), listed
    assert int(listed.headers["retry-after"]) >= 1
    changed = events(broker, "contract.changed", tenant=tenant)
    assert [(e["reason"], e["outcome"], e["sandbox"]) for e in changed] == [
        ("descriptors_changed", "denied", broken)
    ]
    assert last_request(broker, tenant)["reason"] == "contract_changed"
    assert "IGNORE" not in listed.raw.decode()
    # replaced at once, not when it has been idle for long enough
    assert events(broker, "sandbox.stopped", tenant=tenant, sandbox=broken, reason="contract_changed")
    read = rpc.read("notes.md")  # within the cool-down: refused at once, nothing started
    assert (read.status, read.error_code) == (503, -32001), read
    assert last_request(broker, tenant, tool="read_document")["reason"] == "circuit_open"
    assert len(tool_calls(broker, tenant)) == calls  # nothing reached the changed sandbox
    return broken
