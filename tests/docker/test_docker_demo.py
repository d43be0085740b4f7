"""`./dev demo` shows the day (issue 29 item 5): deploy/demo.sh, run as `./dev demo` runs it
(both branches: the rootful daemon, and the rootless one with the broker as the docbroker user),
prints the approvals page's URL, one client configuration line and the audit query; a call made
with the printed token then shows in the printed query's output, and the approvals URL serves
the page. Then SIGTERM stops it: exit 0, none of its sandboxes left running (issue 25)."""

from __future__ import annotations

import contextlib
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx2
import pytest

from broker.testing import ROOT, free_port
from tests.broker.support import call_modern, rpc_reply
from tests.docker.conftest import DEFAULT_HOST, Daemon, docker_hosts, remove_instance

pytestmark = pytest.mark.docker
Stop = Callable[[], tuple[int | None, list[str], list[str]]]


def _rootful() -> str:
    hosts = [h for h in docker_hosts() if "docbroker" not in h]  # the rootless one is the docbroker user's
    return hosts[0] if hosts else DEFAULT_HOST


def _rootless() -> str | None:
    hosts = [h for h in docker_hosts() if "docbroker" in h]
    return hosts[0] if hosts else None


def _containers(host: str, instance: str) -> list[str]:
    client = Daemon(host, 0, 0).client()
    try:
        found = client.containers.list(
            all=True, filters={"label": f"io.docbroker.instance={instance}"}, ignore_removed=True
        )
        return sorted(c.name for c in found)
    finally:
        client.close()


@pytest.fixture(params=["rootful", "rootless"])
def demo(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[dict[str, str], int, Stop]]:
    """The demo, run as `./dev demo` runs it, on each branch: the rootful daemon (the broker
    runs as root), and the rootless one (the broker runs as the docbroker user, from a regular
    install of setup's wheel). Stopped as an operator would (SIGTERM to the demo's process
    group): it must exit 0 within a bound and leave no sandbox of its own running."""
    instance = "demo" + uuid.uuid4().hex[:8]
    port = free_port()
    data = tmp_path
    if request.param == "rootless":  # the docbroker user must reach the data dir: not under /tmp's 0700
        data = Path(tempfile.mkdtemp(prefix="docbroker-demo-", dir="/var/tmp"))
        data.chmod(0o711)  # demo.sh makes `demo` inside it, the broker's own (mode 700)
    env = {
        "PATH": os.environ["PATH"],
        "HOME": os.environ.get("HOME", "/root"),
        "DOCBROKER_VENV": str(Path(sys.executable).parent.parent),
        "DOCBROKER_DATA_DIR": str(data / "demo"),
        "DOCBROKER_PORT": str(port),
        "DOCBROKER_INSTANCE": instance,  # its containers apart from the other tests'
        "DOCBROKER_DOCKER_POOL_SIZE": "0",
    }
    if request.param == "rootless":
        rootless = _rootless()
        if rootless is None:
            pytest.fail("no rootless daemon in DOCBROKER_TEST_DOCKER_HOSTS", pytrace=False)
        env |= {"DOCKER_HOST_ROOTLESS": rootless, "DOCKER_HOST_ROOTFUL": _rootful()}
        host = rootless
    else:
        env["DOCBROKER_DOCKER_HOST"] = host = _rootful()
    proc = subprocess.Popen(
        ["bash", str(ROOT / "deploy" / "demo.sh")],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
    )  # fmt: skip
    printed: dict[str, str] = {}
    stopped = False
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

        def stop() -> tuple[int | None, list[str], list[str]]:
            """SIGTERM to the demo's own process group (its broker, and anything between):
            (exit status, or None if not within 30 s; its containers before; and after)."""
            nonlocal stopped
            before = _containers(host, instance)
            os.killpg(proc.pid, signal.SIGTERM)
            stopped = True
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=30)
            return proc.poll(), before, _containers(host, instance)

        yield env | {f"printed_{k}": v for k, v in printed.items()}, port, stop
    finally:
        if not stopped:
            os.killpg(proc.pid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=30)
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        remove_instance(Daemon(host, 0, 0), instance)
        if data != tmp_path:
            shutil.rmtree(data, ignore_errors=True)


def test_the_demo_prints_the_approvals_url_a_client_line_and_the_audit_query(
    demo: tuple[dict[str, str], int, Stop],
) -> None:
    env, port, stop = demo
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

    auth = {"authorization": f"Bearer {env['printed_token']}"}
    with httpx2.Client(base_url=base, headers=auth, timeout=60) as http:  # a cold, signed sandbox start
        reply = rpc_reply(call_modern(http, "search_documents", {"query": "sandbox"}, request_id=7))
    assert "result" in reply, reply

    query = subprocess.run(
        shlex.split(env["printed_audit"]), env=env, capture_output=True, text=True, timeout=60, check=False
    )
    assert query.returncode == 0, query.stderr
    rows = [line for line in query.stdout.splitlines() if "search_documents" in line]
    assert rows and all("demo" in row and "mcp.request" in row for row in rows), query.stdout

    # Stopped as an operator stops it: the broker exits 0 and leaves none of its sandboxes
    # (on the rootless branch runuser stayed its parent and SIGKILLed it 2 s after a SIGTERM).
    status, before, after = stop()
    assert before, "the call should have left the tenant's sandbox running"
    assert (status, after) == (0, []), (status, after)
