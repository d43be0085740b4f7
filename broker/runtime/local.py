"""Local-process backend: the real server as a process on a unix socket.

INSECURE: no container, no seccomp, no network isolation; the server runs with the broker's
own uid. It exists because it starts fast and needs no daemon, which makes it the fast path
for broker tests and development. `Settings` refuses it unless explicitly enabled.

The "engine" here is the tenant's run dir: `sandbox.pid` there names the server's pid and the
replica that started it, and `mcp.sock` is its socket. A server runs in a session of its own,
so it outlives the broker that started it (a crash, a restart): another replica on the same
data dir finds it by the pid file, checked the way `docbroker sandbox restart` checks it (a
live session leader whose environment names the tenant), and shares it. Replicas racing to
start one take turns under the tenant's create lock (broker/runtime/host_replicas.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
import time
from pathlib import Path

from broker.runtime.base import SandboxBackend, SandboxStartError
from broker.runtime.host_replicas import Replicas
from broker.types import Endpoint, SandboxInfo, SandboxSpec, SandboxState, TenantId
from server.contracts import TENANT_RE

_STOP_GRACE_SECONDS = 3.0
_CREATE_LOCK_SECONDS = 30.0
PID_FILE = "sandbox.pid"
SOCKET_NAME = "mcp.sock"


class LocalProcessBackend(SandboxBackend):
    name = "local"

    def __init__(
        self,
        command: tuple[str, ...] | None = None,
        *,
        run_dir: Path | None = None,
        replicas: Replicas | None = None,
    ) -> None:
        """`run_dir`: the folder of the tenants' run dirs, where `discover()` looks."""
        self._command = command or (sys.executable, "-m", "server")
        self._run_dir = run_dir
        self.replicas = replicas or Replicas(None, "local")
        self._procs: dict[str, asyncio.subprocess.Process] = {}  # the ones this process reaps

    async def create(self, spec: SandboxSpec) -> SandboxInfo:
        pid_file = os.path.join(spec.run_dir, PID_FILE)
        try:
            async with self.replicas.creating(spec.tenant, _CREATE_LOCK_SECONDS):
                found = _read_pid(pid_file)
                if found is not None and _serves(found[0], spec.tenant):
                    return _info(spec.tenant, found[0], spec.socket_path, adopted=True)
                return await self._spawn(spec, pid_file)
        except TimeoutError as exc:
            raise SandboxStartError("another replica is still starting the tenant's sandbox") from exc

    async def _spawn(self, spec: SandboxSpec, pid_file: str) -> SandboxInfo:
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
            start_new_session=True,  # its own session: it outlives this broker, for the others
        )
        self._procs[str(proc.pid)] = proc
        _write_pid(pid_file, proc.pid, self.replicas.me)
        return _info(spec.tenant, proc.pid, spec.socket_path)

    async def alive(self, info: SandboxInfo) -> bool:
        proc = self._procs.get(info.backend_id)
        if proc is not None and proc.returncode is not None:
            return False
        # Our own child too: another replica may have stopped it, and until this event loop
        # reaps the zombie its `returncode` still says running (seen: a sandbox reaped twice).
        return info.backend_id.isdigit() and _serves(int(info.backend_id), info.tenant)

    async def delete(self, info: SandboxInfo) -> None:
        proc = self._procs.pop(info.backend_id, None)
        if proc is not None:
            await _stop(proc)
        elif info.backend_id.isdigit():
            await _stop_pid(int(info.backend_id), info.tenant)
        if info.endpoint is not None and info.endpoint.uds is not None:
            pid_file = os.path.join(os.path.dirname(info.endpoint.uds), PID_FILE)
            found = _read_pid(pid_file)
            if found is not None and str(found[0]) == info.backend_id:
                # Only the file that names this process: a successor's is another replica's.
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(pid_file)

    async def discover(self) -> list[SandboxInfo]:
        if self._run_dir is None:
            return []
        try:
            names = sorted(os.listdir(self._run_dir))
        except OSError:
            return []
        found = []
        for tenant in names:
            if not TENANT_RE.fullmatch(tenant):
                continue
            folder = os.path.join(self._run_dir, tenant)
            entry = _read_pid(os.path.join(folder, PID_FILE))
            if entry is None:
                continue
            pid, replica = entry
            info = _info(TenantId(tenant), pid, os.path.join(folder, SOCKET_NAME))
            info.details["replica"] = replica
            if _serves(pid, tenant):
                info.state = SandboxState.RUNNING
            else:
                info.state = SandboxState.FAILED
            found.append(info)
        return found

    async def remove_tenant(self, tenant: str, run_dir: str) -> int:
        found = _read_pid(os.path.join(run_dir, PID_FILE))
        if found is None or not _serves(found[0], tenant):
            return 0
        await _stop_pid(found[0], tenant)
        return 1

    async def close(self) -> None:
        # The lifecycle has stopped what is to stop; the rest runs on for the other replicas.
        self._procs = {}


def _info(tenant: TenantId, pid: int, socket_path: str, *, adopted: bool = False) -> SandboxInfo:
    now = time.monotonic()
    return SandboxInfo(
        tenant=tenant,
        state=SandboxState.STARTING,
        endpoint=Endpoint(url="http://localhost/mcp", uds=socket_path),
        backend_id=str(pid),
        started_at=now,
        last_used=now,
        details={"adopted": True} if adopted else {},
    )


def _write_pid(path: str, pid: int, replica: str) -> None:
    tmp = f"{path}.tmp"
    with contextlib.suppress(OSError):  # without it, other replicas start their own
        with open(tmp, "w", encoding="ascii") as f:
            f.write(f"{pid}\n{replica}\n")
        os.replace(tmp, path)  # whole or not at all: a reader never sees half a pid


def _read_pid(path: str) -> tuple[int, str] | None:
    """(pid, replica that started it) from a pid file; None if there is none or it is bad."""
    try:
        with open(path, encoding="ascii") as f:
            lines = f.read().split("\n")
        pid = int(lines[0].strip())
    except (OSError, ValueError, UnicodeDecodeError):
        return None
    return (pid, lines[1].strip() if len(lines) > 1 else "") if pid > 1 else None


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


async def _stop_pid(pid: int, tenant: str) -> None:
    """SIGTERM the process group of a server this process did not start, SIGKILL it after a
    grace period. A pid can be reused: only a session leader serving this tenant is stopped."""
    if not _serves(pid, tenant):
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGTERM)
    deadline = time.monotonic() + _STOP_GRACE_SECONDS
    while _serves(pid, tenant) and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    if _serves(pid, tenant):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGKILL)


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
