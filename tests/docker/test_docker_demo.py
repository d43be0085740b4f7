"""`./dev demo` shows the day (issue 29 item 5): deploy/demo.sh, run as `./dev demo` runs it
(rootful daemon branch), prints the approvals page's URL, one client configuration line and
the audit query; a call made with the printed token then shows in the printed query's output,
and the approvals URL serves the page."""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx2
import pytest

from broker.testing import ROOT, free_port
from tests.broker.support import call_modern, rpc_reply
from tests.docker.conftest import DEFAULT_HOST, Daemon, docker_hosts, remove_instance

pytestmark = pytest.mark.docker


def _rootful() -> str:
    hosts = [h for h in docker_hosts() if "docbroker" not in h]  # the rootless one is the docbroker user's
    return hosts[0] if hosts else DEFAULT_HOST


@pytest.fixture
def demo(tmp_path: Path) -> Iterator[tuple[dict[str, str], int]]:
    instance = "demo" + uuid.uuid4().hex[:8]
    port = free_port()
    env = {
        "PATH": os.environ["PATH"],
        "HOME": os.environ.get("HOME", "/root"),
        "DOCBROKER_VENV": str(Path(sys.executable).parent.parent),
        "DOCBROKER_DATA_DIR": str(tmp_path / "demo"),
        "DOCBROKER_PORT": str(port),
        "DOCBROKER_DOCKER_HOST": _rootful(),
        "DOCBROKER_INSTANCE": instance,  # its containers apart from the other tests'
        "DOCBROKER_DOCKER_POOL_SIZE": "0",
    }
    proc = subprocess.Popen(
        ["bash", str(ROOT / "deploy" / "demo.sh")],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
    )  # fmt: skip
    printed: dict[str, str] = {}
    try:
        assert proc.stdout is not None
        lines: list[str] = []
        for line in proc.stdout:  # the message comes before the broker starts serving
            lines.append(line.rstrip("\n"))
            if "or point any MCP client" in line:
                break
        text = "\n".join(lines)
        assert "Approvals" in text, text
        # The message is a heredoc: an unescaped backtick in it runs a command instead of printing it.
        assert "command not found" not in text and "docbroker client-config --client NAME" in text, text
        for i, line in enumerate(lines):
            if line.strip().startswith("Dev token"):
                printed["token"] = line.split(":", 1)[1].strip()
            if line.strip().startswith("Approvals"):
                printed["approvals"] = line.split(":", 1)[1].split()[0]
            if line.strip().startswith("claude mcp add"):
                printed["client"] = line.strip()
            if "The calls you make" in line:
                printed["audit"] = lines[i + 1].strip()
        yield env | {f"printed_{k}": v for k, v in printed.items()}, port
    finally:
        os.killpg(proc.pid, signal.SIGTERM)  # the demo's own process group: its broker
        proc.wait(timeout=30)
        remove_instance(Daemon(env["DOCBROKER_DOCKER_HOST"], 0, 0), instance)


def test_the_demo_prints_the_approvals_url_a_client_line_and_the_audit_query(
    demo: tuple[dict[str, str], int],
) -> None:
    env, port = demo
    base = f"http://127.0.0.1:{port}"
    assert env["printed_approvals"] == f"{base}/approvals"
    client = shlex.split(env["printed_client"])
    assert client[:6] == ["claude", "mcp", "add", "--transport", "http", "docbroker-demo"]
    assert client[6:] == [f"{base}/mcp", "--header", "Authorization: Bearer ${DOCBROKER_TOKEN}"]

    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if httpx2.get(f"{base}/healthz", timeout=1).status_code == 200:
                break
        except httpx2.TransportError:
            time.sleep(0.2)
    assert httpx2.get(env["printed_approvals"], timeout=10).status_code == 200

    with httpx2.Client(base_url=base, headers={"authorization": f"Bearer {env['printed_token']}"}) as http:
        reply = rpc_reply(call_modern(http, "search_documents", {"query": "sandbox"}, request_id=7))
    assert "result" in reply, reply

    query = subprocess.run(
        shlex.split(env["printed_audit"]), env=env, capture_output=True, text=True, timeout=60, check=False
    )
    assert query.returncode == 0, query.stderr
    rows = [line for line in query.stdout.splitlines() if "search_documents" in line]
    assert rows and all("demo" in row and "mcp.request" in row for row in rows), query.stdout
