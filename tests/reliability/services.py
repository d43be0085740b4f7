"""The services a reliability run owns, so its faults hurt nobody else (issue 25 item 2).

- `RootlessDaemon`: a rootless dockerd of the run's own, for the daemon's user that the Docker
  tests use (the one `.ci/docker.sh` starts), started the way that script starts the shared one
  but with a private runtime dir, socket and data root. Restarting the shared daemon would kill
  the containers of every other test running beside this one (CI runs two files at once) and
  of other sessions on the machine; this one can be restarted at will. Its data root is kept
  under /var/cache/docbroker, so the server image is loaded into it once (`docker save | docker
  load` from the shared daemon, skipped while the image ids agree).
- `Postgres`: a throw-away cluster of the run's own (`.ci/postgres.sh`), to stop for 10 s
  without failing the approvals tests that share CI's cluster.
- `SmallFs`: a size-limited tmpfs mounted over a folder (as root), and filled to the last byte
  on demand: a "disk full" that can be emptied again.

Everything is stopped by the process group or mount it started, never by name.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from broker.testing.replicas import pids_with

ROOT = Path(__file__).resolve().parents[2]
CACHE = Path("/var/cache/docbroker/reliability-dockerd")
ROOTLESS_SCRIPT = "/usr/share/docker.io/contrib/dockerd-rootless.sh"
PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def docker_cli(host: str, *args: str, timeout: float = 120, input: bytes | None = None) -> bytes:
    run = subprocess.run(
        ["docker", *args],
        env={"PATH": PATH, "DOCKER_HOST": host, "HOME": "/root"},
        input=input,
        capture_output=True,
        timeout=timeout,
        check=False,
    )
    if run.returncode != 0:
        raise RuntimeError(f"docker {args[0]} failed: {run.stderr.decode(errors='replace')[-500:]}")
    return run.stdout


def answers(host: str) -> bool:
    try:
        docker_cli(host, "version", "--format", "{{.Server.Version}}", timeout=10)
    except (RuntimeError, subprocess.TimeoutExpired):
        return False
    return True


@dataclass
class RootlessDaemon:
    user: str
    root: Path = CACHE
    proc: subprocess.Popen[bytes] | None = None
    starts: int = 0

    @property
    def runtime(self) -> Path:
        return self.root / "run"

    @property
    def host(self) -> str:
        return f"unix://{self.runtime}/docker.sock"

    @property
    def log(self) -> Path:
        return self.root / "dockerd.log"

    def start(self, timeout: float = 90) -> None:
        account = pwd.getpwnam(self.user)
        for folder in (self.root, self.root / "data"):
            folder.mkdir(parents=True, exist_ok=True)
            os.chown(folder, account.pw_uid, account.pw_gid)
        # A private XDG_RUNTIME_DIR, 0700 as rootlesskit wants, emptied of a previous run's state.
        shutil.rmtree(self.runtime, ignore_errors=True)
        self.runtime.mkdir(mode=0o700)
        os.chown(self.runtime, account.pw_uid, account.pw_gid)
        log = self.log.open("ab")
        self.proc = subprocess.Popen(
            [
                "runuser", "-u", self.user, "--", "env", "-i", f"HOME={account.pw_dir}",
                f"USER={self.user}", f"XDG_RUNTIME_DIR={self.runtime}", f"PATH={PATH}",
                "sh", ROOTLESS_SCRIPT, "--data-root", str(self.root / "data"),
                "--shutdown-timeout", "2",
            ],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
            start_new_session=True,  # its own process group: stopped by that group, never by name
        )  # fmt: skip
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the run's dockerd exited early (log: {self.log})")
            if answers(self.host):
                self.starts += 1
                return
            time.sleep(0.2)
        raise RuntimeError(f"the run's dockerd did not answer (log: {self.log})")

    def stop(self, timeout: float = 30) -> None:
        """SIGTERM to its process group (dockerd stops its containers), SIGKILL if it lingers."""
        if self.proc is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        # Whatever of the group outlived its leader (containerd) goes with it.
        deadline = time.monotonic() + timeout
        while _group_alive(self.proc.pid) and time.monotonic() < deadline:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            time.sleep(0.1)
        self.proc = None
        self.end_shims()

    def end_shims(self) -> list[int]:
        """SIGKILL the containerd shims this daemon started (each in a session of its own, so
        not in the daemon's group: they outlive it and keep their containers' processes).
        Found by pid in /proc, by this daemon's private runtime dir on their command line."""
        ended = []
        for shim in pids_with(b"containerd-shim", f"-address {self.runtime}/".encode()):
            # Its container's process first: it would outlive its shim, adopted by init.
            for pid in [*_children(shim), shim]:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
                    ended.append(pid)
        return ended

    def load_image(self, image: str, source_host: str) -> None:
        """The image as the source daemon has it, loaded once into this daemon's data root."""
        wanted = docker_cli(source_host, "image", "inspect", "-f", "{{.Id}}", image).strip()
        with contextlib.suppress(RuntimeError):
            if docker_cli(self.host, "image", "inspect", "-f", "{{.Id}}", image).strip() == wanted:
                return
        saved = docker_cli(source_host, "save", image, timeout=300)
        docker_cli(self.host, "load", "-q", input=saved, timeout=300)


def _children(pid: int) -> list[int]:
    found = []
    with contextlib.suppress(OSError):
        for task in os.listdir(f"/proc/{pid}/task"):
            with contextlib.suppress(OSError), open(f"/proc/{pid}/task/{task}/children") as f:
                found += [int(child) for child in f.read().split()]
    return found


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


@dataclass
class Postgres:
    """A throw-away PostgreSQL cluster (`.ci/postgres.sh`), unix socket only."""

    dir: Path
    env: dict[str, str] = field(default_factory=dict)

    @property
    def url(self) -> str:
        return self.env["DOCBROKER_TEST_DATABASE_URL"]

    def start(self) -> None:
        subprocess.run(["bash", str(ROOT / ".ci/postgres.sh"), "start", str(self.dir)], check=True,
                       capture_output=True, timeout=180)  # fmt: skip
        for line in (self.dir / "env").read_text().splitlines():
            key, _, value = line.partition("=")
            self.env[key] = value

    def _ctl(self, *args: str) -> subprocess.CompletedProcess[bytes]:
        bin_dir = self.env["DOCBROKER_TEST_PG_BIN"]
        return subprocess.run(
            [
                "runuser",
                "-u",
                "docbroker",
                "--",
                f"{bin_dir}/pg_ctl",
                "-D",
                self.env["DOCBROKER_TEST_PG_DATA"],
                *args,
            ],
            capture_output=True,
            timeout=120,
            check=False,
        )

    def pause(self) -> None:
        """Stop the server (fast: open connections are cut, as a crash or failover would)."""
        self._ctl("-m", "fast", "-w", "stop")

    def resume(self) -> None:
        sock = self.dir / "socket"
        options = f"-k {sock} -h '' -c fsync=off -c max_connections=200"
        run = self._ctl("-l", str(self.dir / "postgres.log"), "-w", "-t", "60", "-o", options, "start")
        if run.returncode != 0:
            raise RuntimeError("PostgreSQL did not start again")

    @property
    def running(self) -> bool:
        return self._ctl("status").returncode == 0

    def stop(self) -> None:
        subprocess.run(["bash", str(ROOT / ".ci/postgres.sh"), "stop", str(self.dir)], check=False,
                       capture_output=True, timeout=120)  # fmt: skip


@dataclass
class SmallFs:
    """A tmpfs of `size` mounted over `path`, owned by uid/gid; `fill()` takes its last byte."""

    path: Path
    size: str
    uid: int
    gid: int
    mode: int = 0o700
    mounted: bool = False

    @property
    def filler(self) -> Path:
        return self.path / ".filler"

    def mount(self) -> None:
        self.path.mkdir(parents=True, exist_ok=True)
        options = f"size={self.size},mode={self.mode:o},uid={self.uid},gid={self.gid}"
        subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(self.path)], check=True,
                       capture_output=True, timeout=30)  # fmt: skip
        self.mounted = True

    def fill(self) -> None:
        """Write until the file system refuses (ENOSPC): full to the last block."""
        chunk = b"\0" * 65536
        fd = os.open(self.filler, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        try:
            while True:
                try:
                    os.write(fd, chunk)
                except OSError:
                    if len(chunk) == 1:
                        break
                    chunk = chunk[: len(chunk) // 2]
        finally:
            os.close(fd)

    @property
    def free(self) -> int:
        st = os.statvfs(self.path)
        return st.f_bavail * st.f_frsize

    def empty(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            self.filler.unlink()

    def unmount(self) -> None:
        if self.mounted:
            subprocess.run(["umount", "-l", str(self.path)], check=False, capture_output=True, timeout=30)
            self.mounted = False
