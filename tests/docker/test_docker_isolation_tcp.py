"""policies/seccomp-tcp.json, the profile of a server on the pod network, in live containers.

The same inside probes as test_docker_isolation.py, collected again here with every sandbox
started under the TCP variant: it must keep every wall of seccomp.json (chmod, unlink, rename,
namespaces, mounts, the create-only drop-box...) and add exactly TCP over IPv4/IPv6. Only the
network probe differs, and is replaced below.

Then the server itself in TCP mode (`--http`, this checkout's server/ mounted over the image's):
under seccomp.json it cannot open an IP socket and must exit at once, non-zero, saying why,
instead of running on zero sockets (what the lab's Pod did: Running, never Ready, empty log);
under seccomp-tcp.json it serves, and only with the tenant's bearer.
"""

from __future__ import annotations

import asyncio
import json
import secrets
import shutil
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from server import contracts as c
from tests.docker.conftest import IMAGE, PYTHON, REPO, Daemon, Layout, LiveSandbox, connect, unique_tenant
from tests.docker.test_docker_isolation import *  # noqa: F403 - the same tests, under the TCP profile
from tests.docker.test_docker_isolation import ATTEMPT

pytestmark = pytest.mark.docker

TCP_PROFILE = REPO / "policies" / "seccomp-tcp.json"
UNIX_PROFILE = REPO / "policies" / "seccomp.json"


@pytest.fixture
def live_factory(live_factory: Callable[..., LiveSandbox]) -> Callable[..., LiveSandbox]:
    def make(name: str | None = None, files: dict[str, str] | None = None, **overrides: Any) -> LiveSandbox:
        return live_factory(name, files, seccomp_profile=TCP_PROFILE, **overrides)

    return make


def test_the_tcp_profile_is_the_one_applied(live: LiveSandbox) -> None:
    options = live.container.attrs["HostConfig"]["SecurityOpt"]
    applied = [json.loads(o.split("=", 1)[1]) for o in options if o.startswith("seccomp=")]
    assert applied == [json.loads(TCP_PROFILE.read_text())]


def test_network_only_loopback(live: LiveSandbox) -> None:  # replaces the imported one
    facts = live.probe(
        ATTEMPT
        + r"""
ifaces = [line.split(":")[0].strip() for line in open("/proc/net/dev").read().splitlines()[2:]]
def sock(*args):
    return lambda: socket.socket(*args).close()
print(json.dumps({
    "ifaces": ifaces,
    "inet": attempt(sock(socket.AF_INET, socket.SOCK_STREAM)),
    "inet_tcp": attempt(sock(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)),
    "inet_nonblock": attempt(sock(socket.AF_INET, socket.SOCK_STREAM | socket.SOCK_NONBLOCK)),
    "inet6": attempt(sock(socket.AF_INET6, socket.SOCK_STREAM)),
    "inet_dgram": attempt(sock(socket.AF_INET, socket.SOCK_DGRAM)),
    "inet6_dgram": attempt(sock(socket.AF_INET6, socket.SOCK_DGRAM)),
    "inet_raw": attempt(sock(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP)),
    "inet_sctp": attempt(sock(socket.AF_INET, socket.SOCK_STREAM, 132)),
    "inet_seqpacket": attempt(sock(socket.AF_INET, socket.SOCK_SEQPACKET)),
    "netlink": attempt(sock(socket.AF_NETLINK, socket.SOCK_RAW, 0)),
    "packet": attempt(sock(socket.AF_PACKET, socket.SOCK_RAW, 0)),
    "vsock": attempt(sock(40, socket.SOCK_STREAM)),
    "unspec": attempt(sock(0, socket.SOCK_STREAM)),
    "unix": attempt(sock(socket.AF_UNIX, socket.SOCK_STREAM)),
}))
"""
    )
    assert facts.pop("ifaces") == ["lo"]
    for name in ("inet", "inet_tcp", "inet_nonblock", "inet6", "unix"):
        assert facts.pop(name) == "ok", name
    for name in ("inet_dgram", "inet6_dgram", "inet_raw", "inet_sctp", "inet_seqpacket"):
        assert facts.pop(name) == "EPERM", name  # the default action: nothing but TCP is new
    for name, result in facts.items():
        assert result == "EAFNOSUPPORT", name  # as seccomp.json answers other families


# --- the server in TCP mode -------------------------------------------------------------------


class TcpServer:
    """A hardened container running `python -m server --http 0.0.0.0:8080` (no network: `lo`)."""

    def __init__(self, daemon: Daemon, layout: Layout, profile: Path) -> None:
        self.key = secrets.token_hex(32)
        tenant = layout.tenant(unique_tenant("tcp"), {"notes.md": "hello\n"})
        code = layout.root / "code"
        if not code.exists():  # this checkout's server/, readable by a rootless daemon's user
            shutil.copytree(REPO / "server", code / "server", ignore=shutil.ignore_patterns("__pycache__"))
            for path in (code, *code.rglob("*")):
                path.chmod(0o755 if path.is_dir() else 0o644)
        key_file = layout.root / "secrets" / f"{tenant.spec.tenant}.sandbox"
        key_file.write_text(self.key, encoding="ascii")
        key_file.chmod(0o444)
        backend = connect(daemon)
        user = backend.sandbox_user  # as DockerBackend runs its sandboxes on this daemon
        asyncio.run(backend.close())
        self.client = daemon.client()
        self.container = self.client.containers.run(
            IMAGE,
            entrypoint=[PYTHON, "-OO", "-m", "server", "--http", "0.0.0.0:8080"],
            user=user,
            environment={
                "PYTHONPATH": "/opt/src",
                "DOCS_SCOPE": tenant.spec.tenant,
                "DOCS_SANDBOX_KEY_FILE": "/run/secrets/sandbox.key",
            },
            volumes={
                str(code): {"bind": "/opt/src", "mode": "ro"},
                tenant.spec.sources_dir: {"bind": "/srv/docs/sources", "mode": "ro"},
                tenant.spec.dropbox_dir: {"bind": "/srv/docs/reports", "mode": "rw"},
                tenant.spec.secret_file: {"bind": "/run/secrets/approval.key", "mode": "ro"},
                str(key_file): {"bind": "/run/secrets/sandbox.key", "mode": "ro"},
            },
            cap_drop=["ALL"],
            security_opt=["no-new-privileges:true", f"seccomp={profile.read_text()}"],
            read_only=True,
            network_mode="none",
            labels={"io.docbroker.test": "seccomp-tcp"},
            detach=True,
        )

    def wait_exit(self, timeout: float) -> int | None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.container.reload()
            if self.container.status == "exited":
                return int(self.container.attrs["State"]["ExitCode"])
            time.sleep(0.2)
        return None

    def logs(self) -> str:
        return str(self.container.logs(stdout=True, stderr=True).decode("utf-8", "replace"))

    def close(self) -> None:
        self.container.remove(force=True)
        self.client.close()


@pytest.fixture
def tcp_server(daemon: Daemon, layout: Layout) -> Iterator[Callable[[Path], TcpServer]]:
    made: list[TcpServer] = []

    def make(profile: Path) -> TcpServer:
        made.append(TcpServer(daemon, layout, profile))
        return made[-1]

    yield make
    for server in made:
        server.close()


def test_tcp_mode_under_the_unix_only_profile_fails_loudly(tcp_server: Callable[[Path], TcpServer]) -> None:
    server = tcp_server(UNIX_PROFILE)
    code = server.wait_exit(timeout=30)
    logs = server.logs()
    assert code == 1, f"still running with zero sockets, or exited {code}: {logs!r}"
    assert "cannot listen on 0.0.0.0:8080: EAFNOSUPPORT" in logs
    assert "seccomp-tcp.json" in logs  # says what to do about it
    assert "Traceback" not in logs
    assert server.key not in logs


# From inside the container (its `lo`): one request without the key, one with it.
CLIENT = r"""
import json, sys, urllib.request, urllib.error
body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {"_meta": {
    "io.modelcontextprotocol/protocolVersion": "2026-07-28",
    "io.modelcontextprotocol/clientCapabilities": {}}}}).encode()
def post(headers):
    request = urllib.request.Request("http://127.0.0.1:8080/mcp", data=body, method="POST", headers={
        "content-type": "application/json", "accept": "application/json, text/event-stream",
        "mcp-protocol-version": "2026-07-28", "mcp-method": "tools/list", **headers})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()
for attempt in range(100):
    try:
        without = post({})
        break
    except OSError:
        import time; time.sleep(0.1)
print(json.dumps({"without": without, "with": post({"authorization": "Bearer " + sys.argv[1]})}))
"""


def test_tcp_mode_under_the_tcp_profile_serves_with_the_key_only(
    tcp_server: Callable[[Path], TcpServer],
) -> None:
    server = tcp_server(TCP_PROFILE)
    result = server.container.exec_run(
        [PYTHON, "-c", CLIENT, server.key], user=server.container.attrs["Config"]["User"]
    )
    assert result.exit_code == 0, result.output
    facts = json.loads(result.output.decode().strip().splitlines()[-1])
    assert facts["without"] == [401, ""]
    status, body = facts["with"]
    assert status == 200, body
    assert all(name in body for name in c.TOOL_NAMES)
    assert server.wait_exit(timeout=0) is None  # still serving
    assert server.key not in server.logs()
