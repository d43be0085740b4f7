"""A real MCP client talks to the hardened server through the socket, and a report lands.

Proves the hardening leaves the server working: list, search, read, and save_report with a
token minted exactly as the broker does (server.approval.mint_token, derived secret). The
report appears in the drop-box with the exact bytes, readable by the broker's user.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import secrets
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx2
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from server.approval import mint_token

if TYPE_CHECKING:
    from tests.docker.conftest import LiveSandbox

pytestmark = pytest.mark.docker


async def call_all(socket_path: str, secret: str, tenant: str, content: str) -> dict[str, Any]:
    transport = httpx2.AsyncHTTPTransport(uds=socket_path)
    async with httpx2.AsyncClient(transport=transport, timeout=20) as http:
        async with Client(streamable_http_client("http://localhost/mcp", http_client=http)) as client:
            tools = sorted(t.name for t in (await client.list_tools()).tools)
            search = await client.call_tool("search_documents", {"query": "docbroker"})
            read = await client.call_tool("read_document", {"filename": "notes.md"})
            token = mint_token(
                secret=secret,
                tenant=tenant,
                tool="save_report",
                filename="summary.md",
                sha256=hashlib.sha256(content.encode()).hexdigest(),
                expires=int(time.time()) + 120,
                jti=secrets.token_hex(16),
            )
            args = {"filename": "summary.md", "content": content, "approval_token": token}
            saved = await client.call_tool("save_report", args)
            replay = await client.call_tool("save_report", args)
    return {
        "tools": tools,
        "search": search.structured_content,
        "read": read.structured_content,
        "saved": saved.structured_content,
        "replay": replay.structured_content,
    }


def read_as(path: Path, uid: int, gid: int) -> bytes:
    """Read `path` in a child process that runs as the broker's user (not root)."""
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # child
        try:
            os.close(read_fd)
            os.setgroups([])
            os.setgid(gid)
            os.setuid(uid)
            with open(path, "rb") as f:
                os.write(write_fd, f.read())
            os._exit(0)
        except BaseException:
            os._exit(1)
    os.close(write_fd)
    chunks = []
    while chunk := os.read(read_fd, 65536):
        chunks.append(chunk)
    os.close(read_fd)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, "the broker's user cannot read the report"
    return b"".join(chunks)


def test_mcp_round_trip_and_report_in_dropbox(live: LiveSandbox) -> None:
    content = "# Summary\n\nÜnïcode and all — written by the hardened sandbox.\n"
    tenant = live.tenant
    result = asyncio.run(call_all(tenant.spec.socket_path, tenant.secret, tenant.spec.tenant, content))

    assert result["tools"] == ["read_document", "save_report", "search_documents"]
    assert result["search"]["status"] == "ok"
    assert [h["filename"] for h in result["search"]["data"]["hits"]] == ["notes.md"]
    assert result["read"]["data"]["content"] == "hello docbroker sandbox\n"
    assert result["saved"] == {
        "status": "ok",
        "message": "report saved",
        "data": {"filename": "summary.md", "bytes": len(content.encode())},
    }
    assert result["replay"]["status"] == "rejected"  # same jti: never twice

    dropped = tenant.dropbox / "summary.md"
    info = dropped.stat()
    assert info.st_mode & 0o777 == 0o040  # owner (the sandbox) nothing, group (the broker) read
    uid, gid = live.daemon.owner_uid, live.daemon.owner_gid
    if uid == 0:  # rootful: the broker is root; still prove the bytes
        # ...and that the report's group is the sandbox's own, not the host's root group
        assert info.st_gid == 10001
        assert dropped.read_bytes() == content.encode()
    else:
        assert info.st_gid == gid  # container gid 0 is the broker user's gid
        assert read_as(dropped, uid, gid) == content.encode()
