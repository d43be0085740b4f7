"""Pooled servers from the attacker's side: bad bindings, and what Landlock leaves a process.

The happy path (a bound server answering every protocol case) is in test_protocol.py, where
"pooled" is one of the transports. Here:

- a real `python -m server --bind` process is sent malformed or hostile bindings over its real
  socket, and must refuse each with a clear message, exit with status 2, and never serve;
- a real child process confines itself with `server.landlock.restrict` and then tries to get
  out: reads, writes, `..` walks, /proc magic links, TCP. Positive controls run in the same
  process, so a probe that could not do anything at all would fail the test.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx2
import pytest

from server import landlock
from server.binding import BindingError, send_binding
from tests.escape_probe import HELPERS

# `python -m server`, with an audit hook that says on stderr every module imported once the
# binding socket is bound (the warm-up is over: what is imported from then on, a tenant waits for).
LATE_IMPORTS = """
import os, runpy, sys

warm = []

def hook(event, args):
    if event == "socket.bind" and str(args[1]).endswith("bind.sock"):
        warm.append(True)
    elif event == "import" and warm:
        os.write(2, f"late import: {args[0]}\\n".encode())

sys.addaudithook(hook)
sys.argv = ["server", *sys.argv[1:]]
runpy.run_module("server", run_name="__main__", alter_sys=True)
"""


def _start_pooled(
    kit: Any, base: Path, mcp_path: str | None = None, *, program: list[str] | None = None
) -> tuple[subprocess.Popen[bytes], str, str]:
    bind_path, mcp_path = str(base / "bind.sock"), mcp_path or str(base / "mcp.sock")
    proc = subprocess.Popen(
        [sys.executable, *(program or ["-m", "server"]), "--socket", mcp_path, "--bind", bind_path],
        cwd=kit.repo,
        env=kit.env(None, None, None),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    deadline = time.monotonic() + 30
    while not _accepts(bind_path):
        assert proc.poll() is None, proc.stderr.read() if proc.stderr else b""
        assert time.monotonic() < deadline, "the pooled server never listened"
        time.sleep(0.02)
    return proc, bind_path, mcp_path


def _bind(
    kit: Any, bind_path: str, tenant_base: Path, *, secret: str | None = None, timeout: float = 10
) -> None:
    """The broker's side: bind a new tenant made under `tenant_base`."""
    root, secret_file = kit.make_tenant(tenant_base, **({"secret": secret} if secret else {}))
    send_binding(
        bind_path,
        tenant="acme",
        sources_dir=str(root / "sources"),
        dropbox_dir=str(root / "reports"),
        secret_file=str(secret_file),
        timeout=timeout,
    )


def _accepts(path: str) -> bool:
    with socket.socket(socket.AF_UNIX) as sock:
        try:
            sock.connect(path)
        except OSError:
            return False
        return True


def _raw_binding(path: str, message: bytes, fds: list[int]) -> dict[str, Any]:
    with socket.socket(socket.AF_UNIX) as sock:
        sock.settimeout(10)
        sock.connect(path)
        socket.send_fds(sock, [message], fds)
        answer: dict[str, Any] = json.loads(sock.recv(4096))
        return answer


def _ends_refused(proc: subprocess.Popen[bytes], mcp_path: str) -> str:
    assert proc.wait(timeout=10) == 2
    assert not os.path.exists(mcp_path), "a refused server must never open its MCP socket"
    stderr = proc.stderr.read().decode() if proc.stderr else ""
    assert "Traceback" not in stderr
    return stderr


@pytest.fixture
def pooled(kit: Any, tmp_path: Path) -> Any:
    proc, bind_path, mcp_path = _start_pooled(kit, tmp_path)
    yield proc, bind_path, mcp_path
    if proc.poll() is None:
        proc.kill()
        proc.wait()


def _bad_bindings(root: Path, secret_file: Path) -> dict[str, tuple[bytes, list[str], str]]:
    """name → (message, paths to pass as descriptors, what the refusal must say)."""
    good = json.dumps({"v": 1, "scope": "acme"}).encode()
    dirs = [str(root / "sources"), str(root / "reports")]
    return {
        "two-descriptors": (good, dirs, "exactly 3 descriptors"),
        "no-descriptors": (good, [], "exactly 3 descriptors"),
        "file-as-sources": (good, [str(secret_file), dirs[1], str(secret_file)], "sources descriptor"),
        "dir-as-secret": (good, [*dirs, dirs[0]], "not a regular file"),
        "not-json": (b"{scope: acme", [*dirs, str(secret_file)], "not JSON"),
        "wrong-version": (b'{"v": 2, "scope": "acme"}', [*dirs, str(secret_file)], "'v': 1"),
        "extra-field": (b'{"v": 1, "scope": "acme", "root": "/"}', [*dirs, str(secret_file)], "'v': 1"),
        "scope-traversal": (b'{"v": 1, "scope": "../b"}', [*dirs, str(secret_file)], "DNS label"),
        "scope-not-a-string": (b'{"v": 1, "scope": ["acme"]}', [*dirs, str(secret_file)], "DNS label"),
        "oversized": (b" " * 600 + good, [*dirs, str(secret_file)], "too large"),
    }


@pytest.mark.parametrize("case", sorted(_bad_bindings(Path(), Path())))
def test_bad_binding_is_refused_and_the_server_never_serves(
    kit: Any, tmp_path: Path, pooled: Any, case: str
) -> None:
    proc, bind_path, mcp_path = pooled
    root, secret_file = kit.make_tenant(tmp_path / "tenant")
    message, paths, expected = _bad_bindings(root, secret_file)[case]
    fds = [os.open(p, os.O_RDONLY) for p in paths]
    try:
        answer = _raw_binding(bind_path, message, fds)
    finally:
        for fd in fds:
            os.close(fd)
    assert answer["ok"] is False and expected in answer["error"]
    assert expected in _ends_refused(proc, mcp_path)


def test_weak_secret_is_refused(kit: Any, tmp_path: Path, pooled: Any) -> None:
    proc, bind_path, mcp_path = pooled
    with pytest.raises(BindingError, match="weak secret"):
        _bind(kit, bind_path, tmp_path / "tenant", secret="short")
    assert "short" not in _ends_refused(proc, mcp_path)


def test_probes_do_not_bind_and_a_binding_is_taken_once(kit: Any, tmp_path: Path, pooled: Any) -> None:
    proc, bind_path, mcp_path = pooled
    for _ in range(3):  # the broker's readiness checks: connect, close
        assert _accepts(bind_path)
    _bind(kit, bind_path, tmp_path / "tenant")
    deadline = time.monotonic() + 20
    while not _accepts(mcp_path):
        assert proc.poll() is None and time.monotonic() < deadline
        time.sleep(0.02)
    # Bound for good: a second tenant cannot take it over.
    with pytest.raises(BindingError):
        _bind(kit, bind_path, tmp_path / "other", timeout=2)


def test_the_mcp_socket_listens_when_the_binding_is_answered(kit: Any, tmp_path: Path, pooled: Any) -> None:
    """The broker waits for nothing after the answer: no connect polls, no Docker inspects of a
    sandbox that is still building its server (twenty of each at once in a burst)."""
    proc, bind_path, mcp_path = pooled
    _bind(kit, bind_path, tmp_path / "tenant")
    assert _accepts(mcp_path), "the MCP socket must listen before the binding is answered"
    assert oct(os.stat(mcp_path).st_mode & 0o777) == oct(0o666)  # as uvicorn's own: the broker is another uid
    root = tmp_path / "tenant"
    assert _search(mcp_path) == "ok"  # waited in the backlog while the server was built
    assert proc.poll() is None and root.is_dir()


def test_a_bound_server_imports_nothing_after_its_warm_up(kit: Any, tmp_path: Path) -> None:
    """A pooled sandbox imports all it serves with before it waits for a tenant: a module
    imported after the binding is CPU every new tenant's first call pays (anyio's backend and
    uvicorn's loop and websocket lookups were, ~10 ms each call, twenty at once in a burst)."""
    proc, bind_path, mcp_path = _start_pooled(kit, tmp_path, program=["-c", LATE_IMPORTS])
    try:
        _bind(kit, bind_path, tmp_path / "tenant")
        assert _search(mcp_path) == "ok"
    finally:
        proc.kill()  # no shutdown: its imports are not a tenant's wait
        proc.wait()
    stderr = proc.stderr.read().decode() if proc.stderr else ""
    assert "late import" not in stderr, stderr


def _search(mcp_path: str) -> str:
    """One tools/call over the MCP socket, as the broker sends it; the result's status."""
    body = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "tools/call",
        "params": {
            "name": "search_documents",
            "arguments": {"query": "anything"},
            "_meta": {
                "io.modelcontextprotocol/protocolVersion": "2026-07-28",
                "io.modelcontextprotocol/clientCapabilities": {},
            },
        },
    }
    headers = {
        "accept": "application/json, text/event-stream",
        "mcp-protocol-version": "2026-07-28",
        "mcp-method": "tools/call",
        "mcp-name": "search_documents",
    }
    with httpx2.Client(transport=httpx2.HTTPTransport(uds=mcp_path), timeout=30) as http:
        reply = http.post("http://localhost/mcp", json=body, headers=headers)
    assert reply.status_code == 200, reply.status_code
    return str(reply.json()["result"]["structuredContent"]["status"])


def test_a_failed_lock_down_is_answered_as_a_refusal(kit: Any, tmp_path: Path) -> None:
    """Confinement comes before the answer: a sandbox that cannot lock itself down says so, and
    the broker starts the tenant cold, instead of a sandbox that says yes and then dies."""
    # The MCP socket's folder does not exist: Landlock has no run dir to grant.
    mcp_path = str(tmp_path / "gone" / "mcp.sock")
    proc, bind_path, _ = _start_pooled(kit, tmp_path, mcp_path)
    try:
        with pytest.raises(BindingError, match="refused the binding: the run dir cannot be opened"):
            _bind(kit, bind_path, tmp_path / "tenant")
        assert "run dir" in _ends_refused(proc, mcp_path)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_broker_side_refuses_missing_folders(tmp_path: Path) -> None:
    with pytest.raises(BindingError, match="provision the tenant"):
        send_binding(
            str(tmp_path / "bind.sock"),
            tenant="acme",
            sources_dir=str(tmp_path / "nope"),
            dropbox_dir=str(tmp_path / "nope"),
            secret_file=str(tmp_path / "nope"),
            timeout=1,
        )


# --- Landlock ------------------------------------------------------------------------------------

_PROBE = (
    HELPERS
    + r"""
sys.path.insert(0, sys.argv[1])
from server import landlock
sources, reports, outside = sys.argv[2:5]
flags = os.O_DIRECTORY | os.O_CLOEXEC
src = os.open(sources, os.O_RDONLY | flags)
rep = os.open(reports, os.O_PATH | flags)
landlock.restrict([
    landlock.Rule(src, landlock.READ_FILE | landlock.READ_DIR),
    landlock.Rule(rep, landlock.MAKE_REG | landlock.WRITE_FILE),
])

def tcp():
    with socket.socket() as s:
        s.settimeout(1)
        s.connect(("127.0.0.1", 9))

results = {
    # controls: what a bound server must still do
    "read own source": attempt(lambda: read_at(src, "doc.md")),
    "list own sources": attempt(lambda: os.listdir(src)),
    "create a report": attempt(lambda: create_at(rep, "new.md", b"report")),
    # escapes
    "read ../outside": attempt(lambda: read_at(src, "../outside/secret.md")),
    "read outside by path": attempt(lambda: read_at(None, os.path.join(outside, "secret.md"))),
    "list ..": attempt(lambda: os.listdir(os.open("..", os.O_RDONLY | os.O_DIRECTORY, dir_fd=src))),
    "read via /proc/self/fd": attempt(lambda: read_at(None, f"/proc/self/fd/{src}/../outside/secret.md")),
    "write a source": attempt(lambda: os.close(os.open("doc.md", os.O_WRONLY, dir_fd=src))),
    "create in sources": attempt(lambda: create_at(src, "planted.md")),
    "read a report back": attempt(lambda: read_at(rep, "new.md")),
    "list reports": attempt(lambda: os.listdir(os.open(".", os.O_RDONLY | os.O_DIRECTORY, dir_fd=rep))),
    "truncate a report": attempt(lambda: os.truncate(os.path.join(reports, "new.md"), 0)),
    "rename a report": attempt(
        lambda: os.rename("new.md", "../outside/new.md", src_dir_fd=rep, dst_dir_fd=rep)
    ),
    "remove a report": attempt(lambda: os.unlink("new.md", dir_fd=rep)),
    "make a dir": attempt(lambda: os.mkdir("d", dir_fd=rep)),
}
if landlock.abi_version() >= 4:  # TCP rules came with ABI 4
    results["tcp connect"] = attempt(tcp)
print(json.dumps(results))
"""
)


def test_landlock_leaves_only_the_granted_folders(kit: Any, tmp_path: Path) -> None:
    if landlock.abi_version() < landlock.MIN_ABI:
        pytest.fail("this kernel has no usable Landlock: pooled sandboxes would refuse to serve")
    sources, reports, outside = tmp_path / "sources", tmp_path / "reports", tmp_path / "outside"
    for folder in (sources, reports, outside):
        folder.mkdir()
    (sources / "doc.md").write_text("mine")
    (outside / "secret.md").write_text("CANARY-OUTSIDE")
    done = subprocess.run(
        [sys.executable, "-c", _PROBE, str(kit.repo), str(sources), str(reports), str(outside)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    controls = ("read own source", "list own sources", "create a report")
    assert {k: result.pop(k) for k in controls} == dict.fromkeys(controls, "allowed")
    assert (reports / "new.md").read_bytes() == b"report"
    assert not (sources / "planted.md").exists()
    assert (outside / "secret.md").read_text() == "CANARY-OUTSIDE"
    assert all(outcome in ("EACCES", "EPERM") for outcome in result.values()), result


def test_landlock_refuses_a_second_thread(kit: Any) -> None:
    code = (
        "import sys, threading; sys.path.insert(0, sys.argv[1]); from server import landlock\n"
        "threading.Thread(target=threading.Event().wait, daemon=True).start()\n"
        "try:\n    landlock.restrict([])\nexcept landlock.LandlockError as e:\n    print(e)\n"
    )
    command = [sys.executable, "-c", code, str(kit.repo)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=60)
    assert "other threads" in done.stdout, done.stderr
