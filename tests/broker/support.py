"""Helpers shared by the broker's end-to-end tests: raw JSON-RPC over HTTP, approvals over
REST, reading the audit log and finding a tenant's server process.

Raw requests are for what a well-behaved client would never send (batches, forged headers,
client-supplied approval tokens); everything else goes through the real `mcp.Client`.
"""

from __future__ import annotations

import contextlib
import json
import secrets
import ssl
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx2
import mcp_types
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError

from broker.testing import ROOT, Broker

MODERN = "2026-07-28"
LEGACY = "2025-11-25"
MODES = ("auto", "legacy")  # mcp.Client modes: 2026-07-28 via discovery, and the handshake era
TERMINAL_EVENTS = frozenset({"mcp.request", "auth.denied", "policy.denied"})
APPROVER_SCOPE = "reports:approve"
READ_SCOPE = "docs:read"
WRITE_SCOPE = "docs:read docs:write"

# The shared broker's DOCBROKER_CALL_TIMEOUT: short enough that a hung sandbox fails a call
# quickly, long enough for a loaded CI host.
CALL_TIMEOUT_SECONDS = 6

ElicitFn = Callable[[Any, Any], Awaitable[mcp_types.ElicitResult]]


# Every new httpx client loads the CA bundle (~50 ms), and the suite makes hundreds of them:
# they share one context (the broker speaks plain HTTP here anyway).
_TLS = ssl.create_default_context()


def open_http(broker: Broker, token: str | None = None) -> httpx2.Client:
    """`broker.http(token)` with the shared TLS context."""
    return broker.http(token, verify=_TLS)


@contextlib.asynccontextmanager
async def open_mcp(
    broker: Broker, token: str, mode: str = "auto", headers: dict[str, str] | None = None, **kwargs: Any
) -> AsyncIterator[Client]:
    """`broker.client(token, mode)` with the shared TLS context and optional extra headers."""
    http = httpx2.AsyncClient(
        headers={"authorization": f"Bearer {token}", **(headers or {})}, timeout=30, verify=_TLS
    )
    async with (
        http,
        Client(streamable_http_client(broker.mcp_url, http_client=http), mode=mode, **kwargs) as c,
    ):
        yield c


def unique(prefix: str = "r") -> str:
    """A fresh report name: every test writes its own files into a shared broker."""
    return f"{prefix}-{secrets.token_hex(4)}.md"


UNLIMITED = "[limits]\nrate_per_minute = 100000\nburst = 10000\n"


def write_policies(broker: Broker, policies: dict[str, str]) -> None:
    """Rewrite tenants' policy files (read when the broker starts)."""
    folder = Path(broker.env["DOCBROKER_POLICIES_DIR"]) / "tenants"
    for tenant, text in policies.items():
        (folder / f"{tenant}.toml").write_text(text)


# -- raw JSON-RPC -------------------------------------------------------------------------------


def modern_body(
    method: str,
    params: dict[str, Any] | None = None,
    request_id: int | str | None = 1,
    capabilities: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """A 2026-07-28 request: version and capabilities travel in every request's `_meta`."""
    meta = {
        "io.modelcontextprotocol/protocolVersion": MODERN,
        "io.modelcontextprotocol/clientCapabilities": capabilities or {},
    }
    body: dict[str, Any] = {"jsonrpc": "2.0", "method": method, "params": {**(params or {}), "_meta": meta}}
    if request_id is not None:
        body["id"] = request_id
    return body


def modern_headers(method: str, name: str | None = None) -> dict[str, str]:
    headers = {
        "accept": "application/json, text/event-stream",
        "content-type": "application/json",
        "mcp-protocol-version": MODERN,
        "mcp-method": method,
    }
    if name is not None:
        headers["mcp-name"] = name
    return headers


def post_modern(
    http: httpx2.Client, method: str, params: dict[str, Any] | None = None, **kwargs: Any
) -> httpx2.Response:
    name = params.get("name") if params and method == "tools/call" else None
    return http.post("/mcp", json=modern_body(method, params, **kwargs), headers=modern_headers(method, name))


def call_modern(http: httpx2.Client, tool: str, arguments: dict[str, Any], **kwargs: Any) -> httpx2.Response:
    return post_modern(http, "tools/call", {"name": tool, "arguments": arguments}, **kwargs)


def rpc_reply(response: httpx2.Response) -> dict[str, Any]:
    """The JSON-RPC response in a plain JSON or an SSE body."""
    if response.headers.get("content-type", "").startswith("text/event-stream"):
        replies = [
            json.loads(line[5:])
            for line in response.text.splitlines()
            if line.startswith("data:") and line[5:].strip()
        ]
        final = [r for r in replies if "id" in r and ("result" in r or "error" in r)]
        assert final, response.text
        return final[-1]
    value = response.json()
    assert isinstance(value, dict)
    return value


def tool_status(response: httpx2.Response) -> dict[str, Any]:
    reply = rpc_reply(response)
    assert "result" in reply, reply
    structured = reply["result"]["structuredContent"]
    assert isinstance(structured, dict)
    return structured


class LegacySession:
    """A 2025-11-25 session over raw HTTP: initialize, then requests carrying the session id."""

    def __init__(self, http: httpx2.Client) -> None:
        self.http = http
        init = {
            "jsonrpc": "2.0",
            "id": 0,
            "method": "initialize",
            "params": {
                "protocolVersion": LEGACY,
                "capabilities": {},
                "clientInfo": {"name": "t", "version": "1"},
            },
        }
        r = http.post("/mcp", json=init, headers={"accept": "application/json, text/event-stream"})
        assert r.status_code == 200, r.text
        self.session_id = r.headers["mcp-session-id"]
        assert self.post({"jsonrpc": "2.0", "method": "notifications/initialized"}).status_code == 202

    def headers(self) -> dict[str, str]:
        return {
            "accept": "application/json, text/event-stream",
            "mcp-session-id": self.session_id,
            "mcp-protocol-version": LEGACY,
        }

    def post(self, body: dict[str, Any], http: httpx2.Client | None = None) -> httpx2.Response:
        return (http or self.http).post("/mcp", json=body, headers=self.headers())

    def stream_status(self, http: httpx2.Client | None = None) -> int:
        """Open the session's standing GET stream and close it at once: its status."""
        headers = {**self.headers(), "accept": "text/event-stream"}
        with (http or self.http).stream("GET", "/mcp", headers=headers) as stream:
            return stream.status_code

    def call(
        self, tool: str, arguments: dict[str, Any], http: httpx2.Client | None = None
    ) -> httpx2.Response:
        body = {
            "jsonrpc": "2.0",
            "id": 7,
            "method": "tools/call",
            "params": {"name": tool, "arguments": arguments},
        }
        return self.post(body, http)


# -- the mcp.Client -----------------------------------------------------------------------------


def mcp_error(exc: BaseException) -> MCPError | None:
    """The MCPError inside whatever (possibly nested) exception group the client raised."""
    if isinstance(exc, MCPError):
        return exc
    for inner in getattr(exc, "exceptions", ()):
        found = mcp_error(inner)
        if found is not None:
            return found
    return None


def approve_in_band() -> ElicitFn:
    async def callback(_ctx: Any, _params: Any) -> mcp_types.ElicitResult:
        return mcp_types.ElicitResult(action="accept", content={"decision": "approve"})

    return callback


def decline_in_band() -> ElicitFn:
    async def callback(_ctx: Any, _params: Any) -> mcp_types.ElicitResult:
        return mcp_types.ElicitResult(action="accept", content={"decision": "deny"})

    return callback


# -- approvals over REST ------------------------------------------------------------------------


def approver(broker: Broker, tenant: str = "acme", subject: str = "carol") -> httpx2.Client:
    return open_http(broker, broker.token(tenant=tenant, subject=subject, scope=APPROVER_SCOPE))


def decide(
    broker: Broker, approval_id: str, *, approve: bool = True, tenant: str = "acme", subject: str = "carol"
) -> httpx2.Response:
    with approver(broker, tenant, subject) as http:
        if approve:  # a yes counts only from someone the content was shown to
            http.get(f"/v1/approvals/{approval_id}")
        return http.post(f"/v1/approvals/{approval_id}/{'approve' if approve else 'deny'}")


# -- audit and processes ------------------------------------------------------------------------


def events_since(broker: Broker, seq: int) -> list[dict[str, Any]]:
    return [e for e in broker.audit_events() if e["seq"] > seq]


def last_seq(broker: Broker) -> int:
    events = broker.audit_events()
    return events[-1]["seq"] if events else 0


def terminal(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [e for e in events if e["event"] in TERMINAL_EVENTS]


def server_pids(broker: Broker, tenant: str) -> list[int]:
    pattern = f"server --socket {broker.data_dir}/run/{tenant}/mcp.sock"
    out = subprocess.run(["pgrep", "-f", pattern], capture_output=True, text=True, check=False).stdout
    return [int(p) for p in out.split()]


def gone(pid: int) -> bool:
    """The process has exited (a zombie counts: it runs nothing)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] == "Z"
    except (FileNotFoundError, ProcessLookupError):  # ESRCH: it exited between open and read
        return True


def wait_for(predicate: Callable[[], bool], timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return predicate()


def serve_once(broker: Broker, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """`python -m broker serve` with the broker's environment, to the end: for settings the
    broker must refuse at start-up (one line on stderr, never a traceback)."""
    return subprocess.run(
        [sys.executable, "-m", "broker", "serve"],
        cwd=ROOT,
        env=broker.env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
