"""The broker is transparent (DESIGN §15): each request variant is sent to the document-tools
server alone (`python -m server --http`) and to a broker in front of the same server, in the
same test, and the two answers must agree — HTTP status, JSON-RPC error code, result kind —
unless the variant is one of the broker-first answers docs/architecture.md lists.

A row is one line: `V(name, body, headers, http_method, broker_first)`. `body` is a dict (sent
as JSON), bytes (sent as they are) or a callable of the modern body; `headers` are changes to
the modern request's headers (None removes one).
"""

# ruff: noqa: E501 - a row of the table is one line, however long

from __future__ import annotations

import contextlib
import os
import secrets
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx2
import pytest

from broker.protocol.codec import encode
from broker.testing import ROOT, Broker, free_port
from tests.broker.support import LEGACY, MODERN, events_since, last_seq, open_http, terminal

META = {
    "io.modelcontextprotocol/protocolVersion": MODERN,
    "io.modelcontextprotocol/clientCapabilities": {},
}
Body = dict[str, Any] | list[Any] | bytes | None


def req(method: str, params: dict[str, Any] | None = None, rid: Any = 1, meta: Any = META) -> dict[str, Any]:
    """A 2026-07-28 request; `meta=None` leaves `_meta` out, `rid=...` leaves the id out."""
    p = dict(params or {})
    if meta is not None:
        p["_meta"] = meta
    body: dict[str, Any] = {"jsonrpc": "2.0", "method": method, "params": p}
    if rid is not ...:
        body["id"] = rid
    return body


def call(tool: str = "search_documents", arguments: Any = None, **kw: Any) -> dict[str, Any]:
    return req(
        "tools/call", {"name": tool, "arguments": {"query": "x"} if arguments is None else arguments}, **kw
    )


def init(version: str = LEGACY, **extra: Any) -> dict[str, Any]:
    params = {"protocolVersion": version, "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}
    return {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {**params, **extra}}


def legacy(method: str, params: dict[str, Any] | None = None, rid: Any = 1) -> dict[str, Any]:
    body: dict[str, Any] = {"jsonrpc": "2.0", "method": method, "params": params or {}}
    if rid is not ...:
        body["id"] = rid
    return body


ACCEPT = "application/json, text/event-stream"
MODERN_HEADERS = {"content-type": "application/json", "accept": ACCEPT, "mcp-protocol-version": MODERN}
LEGACY_HEADERS = {"content-type": "application/json", "accept": ACCEPT}
# The entries of docs/architecture.md's list of broker-first answers.
UNKNOWN_TOOL = "an unknown tool"
ALLOW_LIST = "the method allow-list"
HTTP_METHOD = "an HTTP method other than POST, GET or DELETE"
VERSIONS_2099 = {**META, "io.modelcontextprotocol/protocolVersion": "2099-01-01"}


@dataclass(frozen=True)
class V:
    name: str
    body: Body
    headers: dict[str, str | None] = field(default_factory=dict)
    http_method: str = "POST"
    legacy: bool = False  # the handshake era's headers (no version header, no routing headers)
    session: bool = False  # sent in a handshake-era session opened (initialize) just before
    # A difference docs/architecture.md explains: its entry's name and the broker's answer.
    broker_first: tuple[str, tuple[int, int | None, str]] | None = None


# fmt: off
VARIANTS = [
    # -- the table: 2026-07-28 ---------------------------------------------------------------
    V("tools/list", req("tools/list")),
    V("server/discover", req("server/discover")),
    V("tools/call search", call()),
    V("tools/call read", call("read_document", {"filename": "a.md"})),
    V("mcp-method missing", req("tools/list"), {"mcp-method": None}),
    V("mcp-method missing on a call", call(), {"mcp-method": None}),
    V("mcp-method disagrees", req("tools/list"), {"mcp-method": "server/discover"}),
    V("mcp-name disagrees", call(), {"mcp-name": "read_document"}),
    V("mcp-name missing on a call", call(), {"mcp-name": None}),
    V("version header missing", req("tools/list"), {"mcp-protocol-version": None}),
    V("version header not the _meta version", req("tools/list"), {"mcp-protocol-version": "2025-06-18"}),
    V("version header unknown, _meta modern", req("tools/list"), {"mcp-protocol-version": "2099-01-01"}),
    V("_meta missing", req("tools/list", meta=None)),
    V("_meta without capabilities", req("tools/list", meta={"io.modelcontextprotocol/protocolVersion": MODERN})),
    V("_meta not an object", req("tools/list", meta=[1])),
    V("unsupported version 2099", req("tools/list", meta=VERSIONS_2099), {"mcp-protocol-version": "2099-01-01"}),
    V("version not a string", req("tools/list", meta={**META, "io.modelcontextprotocol/protocolVersion": 7})),
    V("arguments a list", call(arguments=[1])),
    V("_meta missing on a call", call(meta=None)),
    V("notification", req("notifications/initialized", rid=...), {"mcp-method": "notifications/initialized"}),
    V("notification unknown method", req("notifications/nothing", rid=...), {"mcp-method": "notifications/nothing"}),
    V("notification at 2099", req("notifications/initialized", rid=...), {"mcp-method": "notifications/initialized", "mcp-protocol-version": "2099-01-01"}),
    V("id an object", req("tools/list", rid={"a": 1})),
    V("id null", req("tools/list", rid=None)),
    V("id a boolean", req("tools/list", rid=True)),
    V("ping", req("ping"), {"mcp-method": "ping"}),
    V("unknown method", req("resources/list"), {"mcp-method": "resources/list"}, broker_first=(ALLOW_LIST, (404, -32601, "error"))),
    V("accept json only", req("tools/list"), {"accept": "application/json"}),
    V("accept html", req("tools/list"), {"accept": "text/html"}),
    V("accept missing", req("tools/list"), {"accept": None}),
    V("accept */*", req("tools/list"), {"accept": "*/*"}),
    V("content-type text/plain", req("tools/list"), {"content-type": "text/plain"}),
    V("content-type missing", req("tools/list"), {"content-type": None}),
    V("content-type with charset", req("tools/list"), {"content-type": "application/json; charset=utf-8"}),
    V("unknown tool", call("nope", {}), broker_first=(UNKNOWN_TOOL, (400, -32602, "error"))),
    V("tools/list cursor not a string", req("tools/list", {"cursor": 5})),
    V("params not an object", {"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": [1]}),
    V("jsonrpc 1.0", {**req("tools/list"), "jsonrpc": "1.0"}),
    V("method not a string", {**req("tools/list"), "method": 5}),
    V("not json", b"{nope"),
    V("a JSON string", b'"tools/list"'),
    V("a response posted", {"jsonrpc": "2.0", "id": 1, "result": {}}),
    V("batch", [req("tools/list")]),
    V("empty batch", []),
    V("huge id", req("tools/list", rid=10**30)),
    V("long string id", req("tools/list", rid="x" * 2000)),
    V("unicode mcp-name (base64)", call("söch", {}), {"mcp-name": "=?base64?c8O2Y2g=?="}, broker_first=(UNKNOWN_TOOL, (400, -32602, "error"))),
    V("mcp-name bad base64", call(), {"mcp-name": "=?base64?!!?="}),
    V("mcp-name base64 of the tool", call(), {"mcp-name": "=?base64?c2VhcmNoX2RvY3VtZW50cw==?="}),
    V("mcp-param header unknown", call(), {"mcp-param-query": "x"}),
    V("mcp-param header base64", call(), {"mcp-param-query": "=?base64?eA==?="}),
    V("session id on a modern request", req("tools/list"), {"mcp-session-id": "abc"}),
    V("GET modern", None, http_method="GET"),
    V("DELETE modern", None, http_method="DELETE"),
    V("PUT", req("tools/list"), http_method="PUT"),
    V("legacy PUT", init(), http_method="PUT", legacy=True, broker_first=(HTTP_METHOD, (405, -32600, "error"))),
    # -- the handshake era (2025-11-25) ------------------------------------------------------------
    V("initialize", init(), legacy=True),
    V("initialize 2025-06-18", init("2025-06-18"), legacy=True),
    V("initialize unknown version", init("1999-01-01"), legacy=True),
    V("initialize without params", {"jsonrpc": "2.0", "id": 1, "method": "initialize"}, legacy=True),
    V("initialize with a modern header", init(), {"mcp-protocol-version": MODERN}, legacy=True),
    V("legacy tools/list without a session", legacy("tools/list"), legacy=True),
    V("legacy tools/list unknown session", legacy("tools/list"), {"mcp-session-id": "abc"}, legacy=True),
    V("legacy ping without a session", legacy("ping"), legacy=True),
    V("legacy notification", legacy("notifications/initialized", rid=...), legacy=True),
    V("legacy batch", [init()], legacy=True),
    V("legacy not json", b"{", legacy=True),
    V("legacy content-type text/plain", init(), {"content-type": "text/plain"}, legacy=True),
    V("legacy accept html", init(), {"accept": "text/html"}, legacy=True),
    V("legacy GET without a session", None, http_method="GET", legacy=True),
    V("legacy DELETE without a session", None, http_method="DELETE", legacy=True),
    V("legacy tools/list in a session", legacy("tools/list"), legacy=True, session=True),
    V("legacy tools/call in a session", legacy("tools/call", {"name": "search_documents", "arguments": {"query": "x"}}), legacy=True, session=True),
    V("legacy tools/call arguments a list", legacy("tools/call", {"name": "search_documents", "arguments": [1]}), legacy=True, session=True),
    V("legacy tools/call without a name", legacy("tools/call", {"arguments": {}}), legacy=True, session=True),
    V("legacy unknown tool", legacy("tools/call", {"name": "nope", "arguments": {}}), legacy=True, session=True, broker_first=(UNKNOWN_TOOL, (200, -32602, "error"))),
    V("legacy ping in a session", legacy("ping"), legacy=True, session=True),
    V("legacy unknown method in a session", legacy("resources/list"), legacy=True, session=True, broker_first=(ALLOW_LIST, (200, -32601, "error"))),
    V("legacy modern envelope in a session", req("tools/list"), legacy=True, session=True),
    V("legacy notification in a session", legacy("notifications/initialized", rid=...), legacy=True, session=True),
    V("legacy initialize again in a session", init(), legacy=True, session=True),
    V("legacy DELETE in a session", None, http_method="DELETE", legacy=True, session=True),
]
# fmt: on


def _headers(v: V) -> dict[str, str]:
    headers: dict[str, str] = dict(LEGACY_HEADERS if v.legacy else MODERN_HEADERS)
    body = v.body
    if not v.legacy and isinstance(body, dict) and isinstance(body.get("method"), str):
        headers["mcp-method"] = body["method"]
        name = body.get("params", {}).get("name") if isinstance(body.get("params"), dict) else None
        if body["method"] == "tools/call" and isinstance(name, str) and name.isascii():
            headers["mcp-name"] = name
    for key, value in v.headers.items():
        if value is None:
            headers.pop(key, None)
        else:
            headers[key] = value
    return headers


def _content(body: Body) -> bytes | None:
    if body is None or isinstance(body, bytes):
        return body
    return encode(body) if isinstance(body, dict) else encode({"_": body})[5:-1]


@dataclass(frozen=True)
class Answer:
    status: int
    code: int | None  # the JSON-RPC error code, if any
    kind: str  # "error", "result", "tool-error", "empty", "not-json"

    def key(self) -> tuple[int, int | None, str]:
        return (self.status, self.code, self.kind)


def _read(response: httpx2.Response) -> Answer:
    text = response.text
    if not text.strip():
        return Answer(response.status_code, None, "empty")
    if response.headers.get("content-type", "").startswith("text/event-stream"):
        data = [line[5:].strip() for line in text.splitlines() if line.startswith("data:")]
        text = data[-1] if data else ""
    try:
        body = httpx2.Response(200, content=text.encode()).json()
    except ValueError:
        return Answer(response.status_code, None, "not-json")
    if not isinstance(body, dict):
        return Answer(response.status_code, None, "not-json")
    if isinstance(body.get("error"), dict):
        return Answer(response.status_code, body["error"].get("code"), "error")
    result = body.get("result")
    if isinstance(result, dict) and result.get("isError") is True:
        return Answer(response.status_code, None, "tool-error")
    return Answer(response.status_code, None, "result")


def _send(client: httpx2.Client, v: V) -> Answer:
    headers = _headers(v)
    if v.session:
        headers["mcp-session-id"] = _open_session(client)
    request = client.build_request(v.http_method, "/mcp", content=_content(v.body), headers=headers)
    return _read(client.send(request))


def _open_session(client: httpx2.Client) -> str:
    """A handshake-era session, initialized: its id."""
    opened = client.post("/mcp", content=encode(init()), headers=LEGACY_HEADERS)
    assert opened.status_code == 200, opened.text
    session = opened.headers["mcp-session-id"]
    done = legacy("notifications/initialized", rid=...)
    ack = client.post("/mcp", content=encode(done), headers={**LEGACY_HEADERS, "mcp-session-id": session})
    assert ack.status_code == 202, ack.text
    return session


@pytest.fixture(scope="module")
def server_alone(tmp_path_factory: pytest.TempPathFactory) -> Iterator[httpx2.Client]:
    """`python -m server --http` over the same (empty) folders a tenant's sandbox serves."""
    root = tmp_path_factory.mktemp("alone")
    for folder in ("sources", "reports"):
        (root / folder).mkdir()
    secret = root / "secret"
    secret.write_text(secrets.token_hex(32))
    port = free_port()
    env = {**os.environ, "DOCS_ROOT": str(root), "DOCS_SCOPE": "acme", "DOCS_SECRET_FILE": str(secret),
           "PYTHONPATH": str(ROOT)}  # fmt: skip
    log = (root / "server.log").open("wb")
    proc = subprocess.Popen([sys.executable, "-m", "server", "--http", f"127.0.0.1:{port}"], cwd=ROOT, env=env,
                            stdout=log, stderr=log, stdin=subprocess.DEVNULL)  # fmt: skip
    try:
        client = httpx2.Client(base_url=f"http://127.0.0.1:{port}", timeout=30)
        _wait_listening(client, proc, Path(log.name))
        yield client
        client.close()
    finally:
        proc.terminate()
        proc.wait(timeout=15)
        log.close()


def _wait_listening(client: httpx2.Client, proc: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        assert proc.poll() is None, log.read_text()
        with contextlib.suppress(httpx2.TransportError):
            client.get("/mcp")
            return
        time.sleep(0.05)
    raise AssertionError("the server alone did not start")


SUBJECT = "differential"  # this table's requests in the shared broker's audit log


@pytest.fixture(scope="module")
def through_broker(broker: Broker) -> Iterator[httpx2.Client]:
    with open_http(broker, broker.token(subject=SUBJECT)) as client:
        yield client


ARCHITECTURE = (ROOT / "docs" / "architecture.md").read_text()


def test_the_table_has_enough_variants() -> None:
    assert len(VARIANTS) >= 40
    assert len({v.name for v in VARIANTS}) == len(VARIANTS)


@pytest.mark.parametrize("variant", VARIANTS, ids=[v.name for v in VARIANTS])
def test_the_broker_answers_as_the_server_alone(
    variant: V, server_alone: httpx2.Client, through_broker: httpx2.Client, broker: Broker
) -> None:
    alone = _send(server_alone, variant)
    before = last_seq(broker)
    brokered = _send(through_broker, variant)
    # A client's error is never audited as the sandbox's failure (issue 35).
    ours = [e for e in terminal(events_since(broker, before)) if e.get("subject") == SUBJECT]
    assert ours and not [e for e in ours if e["reason"].startswith("upstream_")], ours
    if variant.broker_first is None:
        assert brokered.key() == alone.key(), f"{variant.name}: alone {alone}, broker {brokered}"
    else:  # a documented difference: the broker's answer is the documented one
        entry, expected = variant.broker_first
        assert entry in ARCHITECTURE, f"{entry!r} is not in docs/architecture.md's list"
        assert brokered.key() == expected, f"{variant.name}: alone {alone}, broker {brokered}"
