"""The server on the pod network (DESIGN §10), attacked over real TCP.

A real `python -m server --http` with DOCS_SANDBOX_KEY_FILE. Every request here is a complete,
valid `save_report` with a valid approval token: had any of the refused ones reached the
tool, a report would exist. Requests go out as raw bytes, so the attacks are exactly what is
on the wire (two Authorization headers, a lowercase scheme); the right key is then shown to
work through the SDK's own client. The key never reaches the server's log.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import secrets
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import AsyncExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx2
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError

from broker.testing import free_port
from server import contracts as c

pytestmark = pytest.mark.anyio

MODERN = "2026-07-28"
MASTER = secrets.token_bytes(32)


def tenant_key(tenant: str) -> str:
    """The contract's derivation (DESIGN §10), computed here, not imported from the broker."""
    return hmac.new(MASTER, b"docbroker/sandbox/v1/" + tenant.encode(), hashlib.sha256).hexdigest()


KEY = tenant_key("acme")


@dataclass
class Served:
    port: int
    root: Path
    log: Path
    proc: subprocess.Popen[bytes]

    @property
    def reports(self) -> Path:
        return self.root / "reports"


def write_key(path: Path, key: str) -> Path:
    path.write_text(key + "\n", encoding="ascii")
    path.chmod(0o600)
    return path


def start(kit: Any, base: Path, args: list[str], **extra_env: str) -> tuple[subprocess.Popen[bytes], Path]:
    root, secret_file = kit.make_tenant(base)
    env = {**kit.env(root, secret_file), **extra_env}
    log = base / "server.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "server", *args],
            cwd=kit.repo,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    return proc, log


def wait_serving(proc: subprocess.Popen[bytes], port: int, log: Path) -> None:
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"server exited with {proc.returncode}: {log.read_text()}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.05)
    pytest.fail(f"server did not start: {log.read_text()}")


def stop(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


@pytest.fixture(scope="module")
def served(kit: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    base = tmp_path_factory.mktemp("bearer")
    port = free_port()
    key_file = write_key(base / "sandbox.key", KEY)
    proc, log = start(kit, base, ["--http", f"127.0.0.1:{port}"], DOCS_SANDBOX_KEY_FILE=str(key_file))
    try:
        wait_serving(proc, port, log)
        yield Served(port=port, root=base / "docs", log=log, proc=proc)
    finally:
        stop(proc)


def save_request(kit: Any, port: int, name: str, auth: list[bytes], *, target: str = "/mcp") -> bytes:
    """A whole, valid save_report request (2026-07-28), with these Authorization values."""
    content = "approved bytes\n"
    meta = {
        "io.modelcontextprotocol/protocolVersion": MODERN,
        "io.modelcontextprotocol/clientCapabilities": {},
    }
    arguments = {"filename": name, "content": content, "approval_token": kit.mint(name, content)}
    body = json.dumps(
        {
            "jsonrpc": "2.0",
            "id": 1,
            "method": "tools/call",
            "params": {"name": c.TOOL_SAVE, "arguments": arguments, "_meta": meta},
        }
    ).encode()
    head = [
        f"POST {target} HTTP/1.1",
        f"host: 127.0.0.1:{port}",
        "content-type: application/json",
        "accept: application/json, text/event-stream",
        f"mcp-protocol-version: {MODERN}",
        "mcp-method: tools/call",
        f"mcp-name: {c.TOOL_SAVE}",
        f"content-length: {len(body)}",
        "connection: close",
    ]
    lines = [line.encode() for line in head] + [b"authorization: " + value for value in auth]
    return b"\r\n".join(lines) + b"\r\n\r\n" + body


def exchange(port: int, request: bytes) -> tuple[int, bytes]:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(request)
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    return int(head.split(b" ", 2)[1]), body


def bearer(key: str) -> bytes:
    return b"Bearer " + key.encode()


ATTACKS: dict[str, tuple[list[bytes], str]] = {
    "no-header": ([], "/mcp"),
    "wrong-key": ([bearer(secrets.token_hex(32))], "/mcp"),
    "other-tenant-key": ([bearer(tenant_key("globex"))], "/mcp"),
    "key-prefix": ([bearer(KEY[:-1])], "/mcp"),
    "key-plus-one": ([bearer(KEY + "0")], "/mcp"),
    "key-in-query-string": ([], f"/mcp?access_token={KEY}"),
    "key-in-query-and-wrong-header": ([bearer("0" * 64)], f"/mcp?key={KEY}"),
    "lowercase-bearer": ([b"bearer " + KEY.encode()], "/mcp"),
    "uppercase-bearer": ([b"BEARER " + KEY.encode()], "/mcp"),
    "no-scheme": ([KEY.encode()], "/mcp"),
    "basic-scheme": ([b"Basic " + KEY.encode()], "/mcp"),
    "two-spaces": ([b"Bearer  " + KEY.encode()], "/mcp"),
    "trailing-garbage": ([bearer(KEY) + b" x"], "/mcp"),
    "two-headers-right-first": ([bearer(KEY), bearer("0" * 64)], "/mcp"),
    "two-headers-right-second": ([bearer("0" * 64), bearer(KEY)], "/mcp"),
    "two-headers-both-right": ([bearer(KEY), bearer(KEY)], "/mcp"),
    "empty-header": ([b""], "/mcp"),
}


@pytest.mark.parametrize("attack", sorted(ATTACKS))
def test_request_without_the_tenants_key_is_refused_before_any_tool(
    kit: Any, served: Served, attack: str
) -> None:
    auth, target = ATTACKS[attack]
    name = f"{attack}.md"
    status, body = exchange(served.port, save_request(kit, served.port, name, auth, target=target))
    assert (status, body) == (401, b"")  # no detail at all
    assert not (served.reports / name).exists()
    assert served.proc.poll() is None


def test_the_same_request_with_the_key_saves(kit: Any, served: Served) -> None:
    """The control: the refused requests above were complete; only the key was missing."""
    status, body = exchange(served.port, save_request(kit, served.port, "control.md", [bearer(KEY)]))
    assert status == 200, body
    assert (served.reports / "control.md").read_bytes() == b"approved bytes\n"


def test_every_path_and_method_needs_the_key(served: Served) -> None:
    for request in (
        b"GET /mcp HTTP/1.1\r\nhost: 127.0.0.1\r\nconnection: close\r\n\r\n",
        b"DELETE /mcp HTTP/1.1\r\nhost: 127.0.0.1\r\nconnection: close\r\n\r\n",
        b"GET /nowhere HTTP/1.1\r\nhost: 127.0.0.1\r\nconnection: close\r\n\r\n",
        b"OPTIONS * HTTP/1.1\r\nhost: 127.0.0.1\r\nconnection: close\r\n\r\n",
    ):
        assert exchange(served.port, request) == (401, b"")


async def test_the_right_key_works_through_the_sdk_client(kit: Any, served: Served) -> None:
    for mode in ("auto", "legacy"):
        async with AsyncExitStack() as stack:
            http = await stack.enter_async_context(
                httpx2.AsyncClient(headers={"authorization": f"Bearer {KEY}"})
            )
            target = streamable_http_client(f"http://127.0.0.1:{served.port}/mcp", http_client=http)
            client = await stack.enter_async_context(Client(target, mode=mode))
            tools = await client.list_tools()
            assert {tool.name for tool in tools.tools} == set(c.TOOL_NAMES)
            name, content = f"sdk-{mode}.md", "via the SDK\n"
            result = await client.call_tool(
                c.TOOL_SAVE, {"filename": name, "content": content, "approval_token": kit.mint(name, content)}
            )
            assert result.structured_content is not None
            assert result.structured_content["status"] == "ok"
            assert (served.reports / name).read_bytes() == content.encode()


async def test_the_sdk_client_without_the_key_gets_nothing(served: Served) -> None:
    async with httpx2.AsyncClient(headers={"authorization": f"Bearer {tenant_key('globex')}"}) as http:
        target = streamable_http_client(f"http://127.0.0.1:{served.port}/mcp", http_client=http)
        with pytest.raises((MCPError, ExceptionGroup)) as info:  # the SDK wraps it in task groups
            async with Client(target, mode="auto") as client:
                await client.list_tools()
    assert any(isinstance(exc, MCPError) for exc in leaves(info.value))


def leaves(exc: BaseException) -> Iterator[BaseException]:
    if isinstance(exc, BaseExceptionGroup):
        for inner in exc.exceptions:
            yield from leaves(inner)
    else:
        yield exc


def test_the_key_never_reaches_the_log(kit: Any, served: Served) -> None:
    # What the server does log (the SDK's warning naming a refused Host) must not carry a key.
    exchange(served.port, save_request(kit, served.port, "log-a.md", [bearer(tenant_key("globex"))]))
    exchange(served.port, save_request(kit, served.port, "log-b.md", [b"bearer " + KEY.encode()]))
    assert host_status(served.port, "10.244.0.9:8080") == 421
    text = served.log.read_text(errors="replace")
    assert "Invalid Host header" in text  # the log is written to: the check below can fail
    for secret in (KEY, tenant_key("globex"), KEY[:-1]):
        assert secret[:16] not in text


# --- start-up: refuse to serve unauthenticated off loopback, fail loudly when nothing binds --------


def run_to_exit(kit: Any, base: Path, args: list[str], **env: str) -> tuple[int, str]:
    proc, log = start(kit, base, args, **env)
    try:
        code = proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            stop(proc)
    return code, log.read_text()


@pytest.mark.parametrize(
    "host",
    [
        "0.0.0.0",  # noqa: S104 - the point of the test
        "[::]",
        "10.1.2.3",
        "example.invalid",
    ],
)
def test_http_off_loopback_without_a_key_refuses_to_start(kit: Any, tmp_path: Path, host: str) -> None:
    code, out = run_to_exit(kit, tmp_path, ["--http", f"{host}:{free_port()}"])
    assert code == 2
    assert "needs DOCS_SANDBOX_KEY_FILE" in out
    assert "Traceback" not in out


@pytest.mark.parametrize(
    ("content", "expected"),
    [(None, "cannot be opened"), ("short", "weak secret"), ("\xff" * 40, "ASCII")],
)
def test_bad_key_file_refuses_to_start(kit: Any, tmp_path: Path, content: str | None, expected: str) -> None:
    key_file = tmp_path / "sandbox.key"
    if content is not None:
        key_file.write_bytes(content.encode("latin-1"))
    code, out = run_to_exit(
        kit, tmp_path, ["--http", f"0.0.0.0:{free_port()}"], DOCS_SANDBOX_KEY_FILE=str(key_file)
    )
    assert code == 2
    assert "DOCS_SANDBOX_KEY_FILE" in out and expected in out
    assert "Traceback" not in out


def test_a_port_that_cannot_be_bound_fails_loudly(kit: Any, tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        code, out = run_to_exit(kit, tmp_path, ["--http", f"127.0.0.1:{port}"])
    assert code == 1
    assert f"cannot listen on 127.0.0.1:{port}: EADDRINUSE" in out
    assert "Traceback" not in out


# --- DOCS_ALLOWED_HOSTS: the Host allow-list of the SDK's DNS-rebinding check ---------------------


def host_status(port: int, host: str) -> int:
    request = (
        f"POST /mcp HTTP/1.1\r\nhost: {host}\r\nauthorization: Bearer {KEY}\r\n"
        "content-type: application/json\r\naccept: application/json, text/event-stream\r\n"
        "content-length: 2\r\nconnection: close\r\n\r\n{}"
    ).encode()
    return exchange(port, request)[0]


def test_allowed_hosts_replace_the_default(kit: Any, tmp_path: Path) -> None:
    port = free_port()
    key_file = write_key(tmp_path / "sandbox.key", KEY)
    proc, log = start(
        kit,
        tmp_path,
        ["--http", f"127.0.0.1:{port}"],
        DOCS_SANDBOX_KEY_FILE=str(key_file),
        DOCS_ALLOWED_HOSTS="10.244.0.7:8080, docbroker-tenant-acme:*",
    )
    try:
        wait_serving(proc, port, log)
        assert host_status(port, "10.244.0.7:8080") != 421
        assert host_status(port, "docbroker-tenant-acme:8080") != 421
        assert host_status(port, "10.244.0.8:8080") == 421
        assert host_status(port, f"127.0.0.1:{port}") == 421  # the default is replaced, not extended
    finally:
        stop(proc)


def test_default_hosts_refuse_a_pod_ip(kit: Any, served: Served) -> None:
    assert host_status(served.port, f"127.0.0.1:{served.port}") != 421
    assert host_status(served.port, "10.244.0.7:8080") == 421


@pytest.mark.parametrize("value", ["a b", "host/path", "x,,y", "evil\x01", ",".join(["h"] * 33)])
def test_bad_allowed_hosts_refuse_to_start(kit: Any, tmp_path: Path, value: str) -> None:
    code, out = run_to_exit(kit, tmp_path, ["--http", f"127.0.0.1:{free_port()}"], DOCS_ALLOWED_HOSTS=value)
    assert code == 2
    assert "DOCS_ALLOWED_HOSTS must be" in out
    assert value not in out and "Traceback" not in out


def test_key_file_is_required_only_off_loopback(kit: Any, tmp_path: Path) -> None:
    """Loopback without a key still serves (local runtime, tests): nothing but this host reaches it."""
    port = free_port()
    proc, log = start(kit, tmp_path, ["--http", f"127.0.0.1:{port}"])
    try:
        wait_serving(proc, port, log)
        status, _ = exchange(port, save_request(kit, port, "loopback.md", []))
    finally:
        stop(proc)
    assert status == 200
    assert (tmp_path / "docs" / "reports" / "loopback.md").exists()


# --- the broker's side: the upstream client sends the endpoint's bearer ---------------------------


async def test_the_brokers_upstream_client_sends_the_endpoints_token(kit: Any, tmp_path: Path) -> None:
    """As on Kubernetes: the Pod allows its own address as the Host, the broker names it so
    (not `localhost`, as over a unix socket) and authenticates with the tenant's key; a
    caller's Authorization never goes along."""
    from broker.types import Endpoint
    from broker.upstream import Upstream

    port = free_port()
    key_file = write_key(tmp_path / "sandbox.key", KEY)
    proc, log = start(
        kit,
        tmp_path,
        ["--http", f"127.0.0.1:{port}"],
        DOCS_SANDBOX_KEY_FILE=str(key_file),
        DOCS_ALLOWED_HOSTS=f"127.0.0.1:{port}",
    )
    body = json.dumps(
        {
            "jsonrpc": "2.0",
            "id": 1,
            "method": "tools/list",
            "params": {
                "_meta": {
                    "io.modelcontextprotocol/protocolVersion": MODERN,
                    "io.modelcontextprotocol/clientCapabilities": {},
                }
            },
        }
    ).encode()
    headers = {
        "host": "localhost",
        "content-type": "application/json",
        "accept": "application/json, text/event-stream",
        "mcp-protocol-version": MODERN,
        "mcp-method": "tools/list",
    }

    async def status(endpoint: Endpoint, extra: dict[str, str]) -> tuple[int, bytes]:
        client = Upstream(endpoint, connect_timeout=5, read_timeout=10)
        try:
            response = await client.send("POST", {**headers, **extra}, body)
            return response.status_code, await response.read(1 << 20)
        finally:
            await client.close()

    url = f"http://127.0.0.1:{port}/mcp"
    try:
        wait_serving(proc, port, log)
        assert (await status(Endpoint(url=url), {}))[0] == 401
        assert (await status(Endpoint(url=url, token=tenant_key("globex")), {}))[0] == 401
        code, answer = await status(Endpoint(url=url, token=KEY), {})
        assert code == 200 and all(name.encode() in answer for name in c.TOOL_NAMES)
        # A stray Authorization in what is forwarded is replaced, not sent beside ours (two → 401).
        assert (await status(Endpoint(url=url, token=KEY), {"authorization": "Bearer caller"}))[0] == 200
        assert KEY not in repr(Endpoint(url=url, token=KEY))
    finally:
        stop(proc)
