"""The real server process over all its transports, driven by the SDK's own `mcp.Client`.

Every case runs over stdio, Streamable HTTP on TCP, Streamable HTTP on a unix socket, and a
pooled server (`--bind`: warmed up tenant-less, then bound to the tenant over a socket with
the folders passed as descriptors, and locked down with Landlock), each with protocol
2026-07-28 (`mode="auto"`) and with the 2025-11-25 handshake (`mode="legacy"`). The HTTP
servers are started once per module and one client per combination is held open for the
module, so the whole matrix costs about five server start-ups.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import selectors
import socket
import stat
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx2
import pytest
from mcp import Client, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp.client.streamable_http import streamable_http_client

from server import contracts as c
from server.binding import send_binding
from server.contracts import Message

pytestmark = pytest.mark.anyio

TRANSPORTS = ("stdio", "http", "socket", "pooled")
MODES = ("auto", "legacy")
PROTOCOL_VERSION = {"auto": "2026-07-28", "legacy": "2025-11-25"}
FIXED_MESSAGES = {m.value for m in Message}

EXPECTED_ANNOTATIONS = {
    c.TOOL_SEARCH: {"readOnlyHint": True, "openWorldHint": False},
    c.TOOL_READ: {"readOnlyHint": True, "openWorldHint": False},
    c.TOOL_SAVE: {
        "readOnlyHint": False,
        "destructiveHint": False,
        "idempotentHint": False,
        "openWorldHint": False,
    },
}

# The fixed tenant of this module. Entries of sources/ and what a search makes of them:
NOTES = "Quarterly notes.\nThe Needle is in this haystack.\n"
SOURCE_ENTRIES = 12
SOURCE_SKIPPED = 8  # all but notes.md, lower.md, plan.md and fits.md


@dataclass(frozen=True)
class Tenant:
    root: Path
    secret_file: Path
    logs: Path
    outside: Path

    @property
    def reports(self) -> Path:
        return self.root / "reports"

    def log_text(self) -> str:
        return "".join(p.read_text(errors="replace") for p in sorted(self.logs.iterdir()))


@pytest.fixture(scope="module")
def tenant(kit: Any, tmp_path_factory: pytest.TempPathFactory) -> Tenant:
    base = tmp_path_factory.mktemp("proto")
    root, secret_file = kit.make_tenant(base)
    sources = root / "sources"
    outside = base / "outside"
    outside.mkdir()
    (outside / "secret.md").write_text("Needle outside")
    (sources / "notes.md").write_text(NOTES)
    (sources / "lower.md").write_text("the needle, in lower case")
    (sources / "plan.md").write_text("plan: a.c literal")
    (sources / "fits.md").write_bytes(b"f" * 24_000)
    (sources / "big.md").write_bytes(b"Needle" + b"x" * 24_000)
    (sources / "latin.md").write_bytes("Needle caf\u00e9".encode("latin-1"))
    (sources / "link.md").symlink_to(outside / "secret.md")
    os.link(outside / "secret.md", sources / "hard.md")
    os.mkfifo(sources / "fifo.md")
    (sources / "dir.md").mkdir()
    (sources / "sub").mkdir()
    (sources / "sub" / "deep.md").write_text("Needle deep")
    (sources / "bad name.txt").write_text("Needle")
    assert len(os.listdir(sources)) == SOURCE_ENTRIES
    logs = base / "logs"
    logs.mkdir()
    return Tenant(root=root, secret_file=secret_file, logs=logs, outside=outside)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_until_serving(proc: subprocess.Popen[bytes], connect: Any, log: Path) -> None:
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"server exited with {proc.returncode}: {log.read_text()}")
        try:
            connect().close()
            return
        except OSError:
            time.sleep(0.05)
    pytest.fail(f"server did not start: {log.read_text()}")


@pytest.fixture(scope="module")
def http_servers(kit: Any, tenant: Tenant) -> Iterator[dict[str, str]]:
    """The three HTTP servers, started side by side (each start imports the SDK: ~1 s)."""
    port = _free_port()
    sock_path = str(tenant.root.parent / "mcp.sock")
    pool_dir = tenant.root.parent / "pooled"
    pool_dir.mkdir()
    pooled_path, bind_path = str(pool_dir / "mcp.sock"), str(pool_dir / "bind.sock")
    procs: list[subprocess.Popen[bytes]] = []
    try:
        for name, args, env in (
            ("http", ["--http", f"127.0.0.1:{port}"], kit.env(tenant.root, tenant.secret_file)),
            ("socket", ["--socket", sock_path], kit.env(tenant.root, tenant.secret_file)),
            # Pooled: no DOCS_* at all; everything arrives with the binding.
            ("pooled", ["--socket", pooled_path, "--bind", bind_path], kit.env(None, None, None)),
        ):
            with open(tenant.logs / f"{name}.log", "wb") as log:
                procs.append(
                    subprocess.Popen(
                        [sys.executable, "-m", "server", *args],
                        cwd=kit.repo,
                        env=env,
                        stdin=subprocess.DEVNULL,
                        stdout=log,
                        stderr=subprocess.STDOUT,
                    )
                )

        def connect_unix(path: str) -> socket.socket:
            s = socket.socket(socket.AF_UNIX)
            try:
                s.connect(path)
            except OSError:
                s.close()
                raise
            return s

        _wait_until_serving(
            procs[0], lambda: socket.create_connection(("127.0.0.1", port)), tenant.logs / "http.log"
        )
        _wait_until_serving(procs[1], lambda: connect_unix(sock_path), tenant.logs / "socket.log")
        _wait_until_serving(procs[2], lambda: connect_unix(bind_path), tenant.logs / "pooled.log")
        send_binding(
            bind_path,
            tenant=kit.tenant,
            sources_dir=str(tenant.root / "sources"),
            dropbox_dir=str(tenant.reports),
            secret_file=str(tenant.secret_file),
            timeout=10,
        )
        _wait_until_serving(procs[2], lambda: connect_unix(pooled_path), tenant.logs / "pooled.log")
        yield {"http": f"http://127.0.0.1:{port}/mcp", "socket": sock_path, "pooled": pooled_path}
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


@pytest.fixture(
    scope="module",
    params=[(t, m) for t in TRANSPORTS for m in MODES],
    ids=[f"{t}-{m}" for t in TRANSPORTS for m in MODES],
)
async def client(
    request: pytest.FixtureRequest, anyio_backend: str, kit: Any, tenant: Tenant, http_servers: dict[str, str]
) -> AsyncIterator[Client]:
    transport, mode = request.param
    async with AsyncExitStack() as stack:
        target: Any
        if transport == "stdio":
            errlog = stack.enter_context(open(tenant.logs / f"stdio-{mode}.log", "w"))
            params = StdioServerParameters(
                command=sys.executable,
                args=["-m", "server"],
                cwd=str(kit.repo),
                env=kit.env(tenant.root, tenant.secret_file),
            )
            target = stdio_client(params, errlog=errlog)
        elif transport == "http":
            target = http_servers["http"]
        else:
            await stack.enter_async_context(_tolerating_anyio_unix_read_race())
            http = await stack.enter_async_context(
                httpx2.AsyncClient(transport=httpx2.AsyncHTTPTransport(uds=http_servers[transport]))
            )
            target = streamable_http_client("http://localhost/mcp", http_client=http)
        connected = await stack.enter_async_context(Client(target, mode=mode))
        assert connected.protocol_version == PROTOCOL_VERSION[mode]
        yield connected


@asynccontextmanager
async def _tolerating_anyio_unix_read_race() -> AsyncIterator[None]:
    """Ignore one known client-side race of anyio 4.16 on asyncio, and nothing else.

    anyio's UNIX socket stream waits for data with `loop.add_reader(sock, fut.set_result, None)`.
    When the client cancels that read (closing its SSE stream) in the loop iteration in which
    the socket turns readable, the reader callback runs on the cancelled future and raises
    InvalidStateError inside a loop callback. asyncio would only log it; anyio's pytest runner
    turns it into an error of whichever test runs next. It never reaches the server.
    """
    loop = asyncio.get_running_loop()
    previous = loop.get_exception_handler()

    def handler(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        callback = getattr(context.get("handle"), "_callback", None)
        future = getattr(callback, "__self__", None)
        if (
            isinstance(context.get("exception"), asyncio.InvalidStateError)
            and getattr(callback, "__name__", None) == "set_result"
            and isinstance(future, asyncio.Future)
            and future.cancelled()
        ):
            return
        if previous is not None:
            previous(loop, context)
        else:
            loop.default_exception_handler(context)

    loop.set_exception_handler(handler)
    try:
        yield
        for _ in range(5):  # let callbacks queued by the client's shutdown run under this handler
            await asyncio.sleep(0)
    finally:
        loop.set_exception_handler(previous)


@pytest.fixture
def tag(request: pytest.FixtureRequest) -> str:
    """A prefix for report names, unique per test and client combination (they share reports/)."""
    transport, mode = request.node.callspec.params["client"]
    return f"{transport}-{mode}-{abs(hash(request.node.name)) % 10**8}"


async def call(client: Client, tool: str, arguments: dict[str, Any] | None) -> dict[str, Any]:
    result = await client.call_tool(tool, arguments)
    assert result.is_error is False
    structured = result.structured_content
    assert structured is not None
    # The data travels once, in structuredContent; the text block only names the outcome.
    assert [block.text for block in result.content] == [  # type: ignore[union-attr]
        f"{structured['status']}: {structured['message']}"
    ]
    assert structured["message"] in FIXED_MESSAGES
    return structured


def rejected(message: Message) -> dict[str, Any]:
    return {"status": "rejected", "message": message.value, "data": None}


# --- discovery ---------------------------------------------------------------------------------


async def test_discovery(client: Client) -> None:
    tools = {tool.name: tool for tool in (await client.list_tools()).tools}
    assert sorted(tools) == sorted(c.TOOL_NAMES)
    for name, tool in tools.items():
        assert tool.input_schema == c.input_schema(name)
        assert tool.input_schema["additionalProperties"] is False
        assert tool.output_schema == c.output_schema(name)
        assert tool.output_schema is not None
        assert "waiting_approval" in tool.output_schema["properties"]["status"]["enum"]
        assert tool.annotations is not None
        assert tool.annotations.model_dump(by_alias=True, exclude_none=True) == EXPECTED_ANNOTATIONS[name]
    search = tools[c.TOOL_SEARCH].input_schema["properties"]
    assert (search["query"]["minLength"], search["query"]["maxLength"]) == (1, 80)
    assert (search["max_results"]["minimum"], search["max_results"]["maximum"]) == (1, 3)
    assert search["max_results"]["default"] == 3
    save = tools[c.TOOL_SAVE].input_schema
    assert sorted(save["required"]) == ["approval_token", "content", "filename"]


# --- search_documents --------------------------------------------------------------------------


async def test_search(client: Client) -> None:
    result = await call(client, c.TOOL_SEARCH, {"query": "Needle"})
    assert result["status"] == "ok" and result["message"] == Message.SEARCHED.value
    assert result["data"]["hits"] == [
        {"filename": "notes.md", "excerpt": "Quarterly notes. The Needle is in this haystack. "}
    ]
    assert (result["data"]["examined"], result["data"]["skipped"]) == (SOURCE_ENTRIES, SOURCE_SKIPPED)
    assert result["data"]["truncated"] is False
    lower = await call(client, c.TOOL_SEARCH, {"query": "needle", "max_results": 1})
    assert [h["filename"] for h in lower["data"]["hits"]] == ["lower.md"]
    literal = await call(client, c.TOOL_SEARCH, {"query": "a.c"})
    assert [h["filename"] for h in literal["data"]["hits"]] == ["plan.md"]


async def test_search_hit_limit_truncates(client: Client) -> None:
    # "f", "e" and "n" are in several documents: one hit, then it stops with entries left.
    result = await call(client, c.TOOL_SEARCH, {"query": "e", "max_results": 1})
    assert len(result["data"]["hits"]) == 1
    assert result["data"]["truncated"] is True
    assert result["data"]["examined"] < SOURCE_ENTRIES


@pytest.mark.parametrize(
    "arguments",
    [
        {"query": ""},
        {"query": "q" * 81},
        {"query": "Needle", "max_results": True},
        {"query": "Needle", "max_results": "3"},
        {"query": "Needle", "max_results": 0},
        {"query": "Needle", "max_results": 4},
        {"query": "Needle", "max_results": 2.5},
        {"query": "Needle", "path": "sub"},
        {"query": 7},
        {},
        None,
    ],
    ids=lambda a: json.dumps(a)[:40],
)
async def test_search_rejections(client: Client, arguments: dict[str, Any] | None) -> None:
    assert await call(client, c.TOOL_SEARCH, arguments) == rejected(Message.INVALID_INPUT)


# --- read_document ----------------------------------------------------------------------------


async def test_read(client: Client) -> None:
    assert await call(client, c.TOOL_READ, {"filename": "notes.md"}) == {
        "status": "ok",
        "message": Message.READ.value,
        "data": {"filename": "notes.md", "content": NOTES},
    }
    fits = await call(client, c.TOOL_READ, {"filename": "fits.md"})
    assert fits["data"]["content"] == "f" * 24_000


@pytest.mark.parametrize(
    ("arguments", "expected"),
    [
        ({"filename": "../secret.md"}, rejected(Message.INVALID_FILENAME)),
        ({"filename": "/etc/passwd"}, rejected(Message.INVALID_FILENAME)),
        ({"filename": "sub/deep.md"}, rejected(Message.INVALID_FILENAME)),
        ({"filename": "a\x00.md"}, rejected(Message.INVALID_FILENAME)),
        ({"filename": "a" * 65 + ".md"}, rejected(Message.INVALID_FILENAME)),
        ({"filename": "bad name.txt"}, rejected(Message.INVALID_FILENAME)),
        ({"filename": 1}, rejected(Message.INVALID_INPUT)),
        ({"filename": "notes.md", "offset": 0}, rejected(Message.INVALID_INPUT)),
        ({}, rejected(Message.INVALID_INPUT)),
        ({"filename": "absent.md"}, {"status": "failed", "message": Message.NOT_FOUND.value, "data": None}),
        ({"filename": "link.md"}, rejected(Message.NOT_REGULAR)),
        ({"filename": "hard.md"}, rejected(Message.NOT_REGULAR)),
        ({"filename": "fifo.md"}, rejected(Message.NOT_REGULAR)),
        ({"filename": "dir.md"}, rejected(Message.NOT_REGULAR)),
        ({"filename": "big.md"}, rejected(Message.TOO_LARGE)),
        ({"filename": "latin.md"}, rejected(Message.NOT_UTF8)),
    ],
    ids=lambda a: json.dumps(a)[:40] if "filename" in a or not a else "",
)
async def test_read_rejections(client: Client, arguments: dict[str, Any], expected: dict[str, Any]) -> None:
    assert await call(client, c.TOOL_READ, arguments) == expected


# --- save_report -------------------------------------------------------------------------------


async def test_save_with_approval(client: Client, kit: Any, tenant: Tenant, tag: str) -> None:
    name, content = f"{tag}.md", "# Report\r\nGrüße \U0001f600\n"
    result = await call(
        client, c.TOOL_SAVE, {"filename": name, "content": content, "approval_token": kit.mint(name, content)}
    )
    size = len(content.encode())
    assert result == {
        "status": "ok",
        "message": Message.SAVED.value,
        "data": {"filename": name, "bytes": size},
    }
    assert (tenant.reports / name).read_bytes() == content.encode()
    assert stat.S_IMODE((tenant.reports / name).stat().st_mode) & stat.S_IRUSR == 0


def _changed(field: str, value: Any) -> Any:
    return lambda kit, name, content: kit.sign(kit.payload(name, content, **{field: value}))


def _tampered_mac(kit: Any, name: str, content: str) -> str:
    token = kit.mint(name, content)
    return token[:-1] + ("0" if token[-1] != "0" else "1")


def _tampered_payload(kit: Any, name: str, content: str) -> str:
    # A validly minted token for another file, with this call's payload swapped in.
    _, _, mac = kit.mint("other.md", content).rpartition(".")
    encoded, _, _ = kit.mint(name, content).rpartition(".")
    return f"{encoded}.{mac}"


TOKEN_CASES = {
    "scope": _changed("scope", "globex"),
    "tool": _changed("tool", "read_document"),
    "filename": _changed("filename", "other.md"),
    "sha256": _changed("sha256", "0" * 64),
    "expired": _changed("expires", int(time.time()) - 1),
    "too-far-ahead": _changed("expires", int(time.time()) + 3600),
    "expires-string": _changed("expires", str(int(time.time()) + 60)),
    "expires-float": _changed("expires", time.time() + 60),
    "expires-bool": _changed("expires", True),
    "bad-jti": _changed("jti", "XYZ"),
    "extra-key": _changed("approved_by", "mallory"),
    "tampered-mac": _tampered_mac,
    "tampered-payload": _tampered_payload,
    "other-tenant-secret": lambda kit, name, content: kit.mint(name, content, secret="g" * 40),
    "garbage": lambda kit, name, content: "not-a-token",
}


@pytest.mark.parametrize("case", sorted(TOKEN_CASES))
async def test_save_rejects_invalid_approval(
    client: Client, kit: Any, tenant: Tenant, tag: str, case: str
) -> None:
    name, content = f"{tag}.md", "approved content"
    token = TOKEN_CASES[case](kit, name, content)
    result = await call(client, c.TOOL_SAVE, {"filename": name, "content": content, "approval_token": token})
    assert result == rejected(Message.APPROVAL_INVALID)
    assert not (tenant.reports / name).exists()


@pytest.mark.parametrize(
    "arguments",
    [
        {"content": "x", "approval_token": "t"},
        {"filename": "x.md", "content": "x"},  # no token at all
        {"filename": "x.md", "content": "x", "approval_token": ""},
        {"filename": "x.md", "content": "", "approval_token": "t"},
        {"filename": "x.md", "content": "x", "approval_token": "t", "overwrite": True},
    ],
    ids=["no-filename", "no-token", "empty-token", "empty-content", "unknown-field"],
)
async def test_save_rejects_bad_input(client: Client, tenant: Tenant, arguments: dict[str, Any]) -> None:
    assert await call(client, c.TOOL_SAVE, arguments) == rejected(Message.INVALID_INPUT)
    assert not (tenant.reports / "x.md").exists()


@pytest.mark.parametrize(
    "content",
    ["\U0001f600" * 8000, "x" * 8001],
    ids=["8000-chars-32000-bytes", "8001-chars"],
)
async def test_save_rejects_oversized_content(
    client: Client, kit: Any, tenant: Tenant, tag: str, content: str
) -> None:
    name = f"{tag}.md"
    result = await call(
        client, c.TOOL_SAVE, {"filename": name, "content": content, "approval_token": kit.mint(name, content)}
    )
    assert result == rejected(Message.INVALID_INPUT)
    assert not (tenant.reports / name).exists()


async def test_save_rejects_bad_filename(client: Client, kit: Any, tenant: Tenant) -> None:
    for name in ("../escape.md", "/tmp/escape.md", "sub/x.md", "x.txt"):
        token = kit.mint(name, "x")
        result = await call(client, c.TOOL_SAVE, {"filename": name, "content": "x", "approval_token": token})
        assert result == rejected(Message.INVALID_FILENAME)
    assert not (tenant.root / "escape.md").exists()


async def test_replayed_approval_is_rejected(client: Client, kit: Any, tenant: Tenant, tag: str) -> None:
    first, second = f"{tag}-a.md", f"{tag}-b.md"
    token = kit.mint(first, "x")
    assert (await call(client, c.TOOL_SAVE, {"filename": first, "content": "x", "approval_token": token}))[
        "status"
    ] == "ok"
    # The very same token again: refused for the token, before the existing file is even considered.
    again = await call(client, c.TOOL_SAVE, {"filename": first, "content": "x", "approval_token": token})
    assert again == rejected(Message.APPROVAL_INVALID)
    # Another valid token reusing the jti.
    jti = json.loads(base64.urlsafe_b64decode(token.rpartition(".")[0]))["jti"]
    reused = kit.mint(second, "x", jti=jti)
    result = await call(client, c.TOOL_SAVE, {"filename": second, "content": "x", "approval_token": reused})
    assert result == rejected(Message.APPROVAL_INVALID)
    assert not (tenant.reports / second).exists()


async def test_existing_report_is_not_overwritten(client: Client, kit: Any, tenant: Tenant, tag: str) -> None:
    name = f"{tag}.md"
    (tenant.reports / name).write_bytes(b"original")
    token = kit.mint(name, "replacement")
    result = await call(
        client, c.TOOL_SAVE, {"filename": name, "content": "replacement", "approval_token": token}
    )
    assert result == rejected(Message.REPORT_EXISTS)
    assert (tenant.reports / name).read_bytes() == b"original"


async def test_nothing_echoed_in_results_or_logs(client: Client, kit: Any, tenant: Tenant, tag: str) -> None:
    path, content, token, query = kit.canaries
    calls = [
        (c.TOOL_SEARCH, {"query": query}),
        (c.TOOL_SEARCH, {"query": query, "max_results": path}),
        (c.TOOL_SEARCH, {"query": query, path: content}),
        (c.TOOL_READ, {"filename": f"../{path}.md"}),
        (c.TOOL_READ, {"filename": f"{path}.md"}),
        (c.TOOL_SAVE, {"filename": f"{path}/x.md", "content": content, "approval_token": token}),
        (c.TOOL_SAVE, {"filename": f"{tag}.md", "content": content, "approval_token": token}),
        (c.TOOL_SAVE, {"filename": f"{tag}.md", "content": content * 1000, "approval_token": token}),
    ]
    for tool, arguments in calls:
        result = await client.call_tool(tool, arguments)
        kit.assert_no_canary(result.model_dump_json())
    name = f"{tag}-ok.md"
    saved = await client.call_tool(
        c.TOOL_SAVE, {"filename": name, "content": content, "approval_token": kit.mint(name, content)}
    )
    assert saved.structured_content is not None and saved.structured_content["status"] == "ok"
    kit.assert_no_canary(saved.model_dump_json())
    kit.assert_no_canary(tenant.log_text())
    assert kit.secret not in tenant.log_text()


# --- stdio: stdout carries protocol frames only ------------------------------------------------


def _read_responses(proc: subprocess.Popen[bytes], want: set[int], timeout: float) -> list[bytes]:
    assert proc.stdout is not None
    lines: list[bytes] = []
    buffer = b""
    seen: set[int] = set()
    deadline = time.monotonic() + timeout
    with selectors.DefaultSelector() as sel:
        sel.register(proc.stdout, selectors.EVENT_READ)
        while not want <= seen:
            remaining = deadline - time.monotonic()
            assert remaining > 0, f"no answer for ids {want - seen}; stdout so far: {lines!r}"
            if not sel.select(remaining):
                continue
            chunk = os.read(proc.stdout.fileno(), 65_536)
            assert chunk, "server closed stdout early"
            buffer += chunk
            *complete, buffer = buffer.split(b"\n")
            for line in complete:
                lines.append(line)
                message = json.loads(line)  # every line must be a JSON-RPC frame
                if "id" in message:
                    seen.add(message["id"])
    return lines


def test_stdio_stdout_is_protocol_only_and_logs_go_to_stderr(kit: Any, tenant: Tenant) -> None:
    path = kit.canaries[0]
    frames = [
        {
            "jsonrpc": "2.0",
            "id": 1,
            "method": "initialize",
            "params": {
                "protocolVersion": "2025-11-25",
                "capabilities": {},
                "clientInfo": {"name": "t", "version": "0"},
            },
        },
        {"jsonrpc": "2.0", "method": "notifications/initialized"},
        {
            "jsonrpc": "2.0",
            "id": 2,
            "method": "tools/call",
            "params": {"name": c.TOOL_READ, "arguments": {"filename": f"../{path}.md"}},
        },
        {
            "jsonrpc": "2.0",
            "id": 3,
            "method": "tools/call",
            "params": {"name": c.TOOL_SEARCH, "arguments": {"query": path, "max_results": True}},
        },
        {"jsonrpc": "2.0", "id": 4, "method": "tools/list"},
    ]
    proc = subprocess.Popen(
        [sys.executable, "-m", "server"],
        cwd=kit.repo,
        env=kit.env(tenant.root, tenant.secret_file),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        assert proc.stdin is not None
        proc.stdin.write(b"".join(json.dumps(f).encode() + b"\n" for f in frames))
        proc.stdin.flush()
        lines = _read_responses(proc, {1, 2, 3, 4}, timeout=30)
        proc.stdin.close()
        proc.wait(timeout=15)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.stderr is not None
    stderr = proc.stderr.read().decode()
    responses = {m["id"]: m for m in map(json.loads, lines) if "id" in m}
    assert responses[2]["result"]["structuredContent"] == rejected(Message.INVALID_FILENAME)
    assert responses[3]["result"]["structuredContent"] == rejected(Message.INVALID_INPUT)
    assert "rejected input fields" in stderr  # the log line went to stderr, not stdout
    kit.assert_no_canary(stderr)
    kit.assert_no_canary(b"\n".join(lines).decode())
