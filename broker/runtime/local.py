"""Local-process backend: the real server as a child process on a unix socket.

INSECURE: no container, no seccomp, no network isolation; the server runs with the broker's
own uid. It exists because it starts fast and needs no daemon, which makes it the fast path
for broker tests and development. `Settings` refuses it unless explicitly enabled.
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

    async def close(self) -> None:
        procs, self._procs = self._procs, {}
        for proc in procs.values():
            await _stop(proc)


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
