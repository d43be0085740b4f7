"""Local-process backend: the real server as a child process on a unix socket.

INSECURE: no container, no seccomp, no network isolation; the server runs with the broker's
own uid. It exists because it starts fast and needs no daemon, which makes it the fast path
for broker tests and development. `Settings` refuses it unless explicitly enabled.

Each server's pid is written to `sandbox.pid` in the tenant's run dir: the process's label,
by which an operator's `docbroker sandbox replace` finds it from another process.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
import time

from broker.runtime.base import SandboxBackend
from broker.types import Endpoint, SandboxInfo, SandboxSpec, SandboxState

_STOP_GRACE_SECONDS = 3.0
PID_FILE = "sandbox.pid"


class LocalProcessBackend(SandboxBackend):
    name = "local"

    def __init__(self, command: tuple[str, ...] | None = None) -> None:
        self._command = command or (sys.executable, "-m", "server")
        self._procs: dict[str, asyncio.subprocess.Process] = {}

    async def create(self, spec: SandboxSpec) -> SandboxInfo:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(spec.socket_path)
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "PYTHONPATH": os.pathsep.join(p for p in sys.path if p),
            "DOCS_ROOT": spec.docs_root,
            "DOCS_SCOPE": spec.tenant,
            "DOCS_SECRET_FILE": spec.secret_file,
        }
        proc = await asyncio.create_subprocess_exec(
            *self._command,
            "--socket",
            spec.socket_path,
            env=env,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.DEVNULL,
            stderr=None,  # the server logs names only; its stderr joins the broker's
            start_new_session=True,
        )
        self._procs[str(proc.pid)] = proc
        _write_pid(os.path.join(os.path.dirname(spec.socket_path), PID_FILE), proc.pid)
        now = time.monotonic()
        return SandboxInfo(
            tenant=spec.tenant,
            state=SandboxState.STARTING,
            endpoint=Endpoint(url="http://localhost/mcp", uds=spec.socket_path),
            backend_id=str(proc.pid),
            started_at=now,
            last_used=now,
        )

    async def alive(self, info: SandboxInfo) -> bool:
        proc = self._procs.get(info.backend_id)
        return proc is not None and proc.returncode is None

    async def delete(self, info: SandboxInfo) -> None:
        proc = self._procs.pop(info.backend_id, None)
        if proc is not None:
            await _stop(proc)

    async def discover(self) -> list[SandboxInfo]:
        return []  # child processes die with the broker's session

    async def remove_tenant(self, tenant: str, run_dir: str) -> int:
        try:
            with open(os.path.join(run_dir, PID_FILE), encoding="ascii") as f:
                pid = int(f.read().strip())
        except (OSError, ValueError):
            return 0
        # A pid can be reused: only a session leader serving this very tenant is ours to stop.
        if not _serves(pid, tenant):
            return 0
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGTERM)
        deadline = time.monotonic() + _STOP_GRACE_SECONDS
        while _serves(pid, tenant) and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        if _serves(pid, tenant):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)
        return 1

    async def close(self) -> None:
        procs, self._procs = self._procs, {}
        for proc in procs.values():
            await _stop(proc)


def _write_pid(path: str, pid: int) -> None:
    with contextlib.suppress(OSError):  # only the operator's command reads it
        with open(path, "w", encoding="ascii") as f:
            f.write(f"{pid}\n")


def _serves(pid: int, tenant: str) -> bool:
    """Is `pid` a live (not zombie) session leader whose environment names `tenant`?"""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
        with open(f"/proc/{pid}/environ", "rb") as f:
            environ = f.read().split(b"\0")
    except OSError:
        return False
    state, session = fields[0], int(fields[3])
    return state != b"Z" and session == pid and b"DOCS_SCOPE=" + tenant.encode() in environ


async def _stop(proc: asyncio.subprocess.Process) -> None:
    """SIGTERM the server's process group, SIGKILL it after a grace period."""
    if proc.returncode is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        await asyncio.wait_for(proc.wait(), _STOP_GRACE_SECONDS)
    except TimeoutError:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        await proc.wait()
