"""Processes the benchmarks start and measure: CPU time from /proc, noise, clean-up."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

# -- processes -------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _stat(pid: int) -> list[str] | None:
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # comm (field 2) may hold spaces; everything after its closing paren is space-separated.
    return raw[raw.rindex(")") + 2 :].split()


def descendants(pid: int) -> list[int]:
    """Every live descendant of pid (children of children too), from /proc."""
    parent_of: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            fields = _stat(int(entry))
            if fields is not None:
                parent_of[int(entry)] = int(fields[1])
    found: list[int] = []
    frontier = [pid]
    while frontier:
        p = frontier.pop()
        kids = [c for c, pp in parent_of.items() if pp == p]
        found.extend(kids)
        frontier.extend(kids)
    return found


def cpu_seconds(pids: list[int]) -> float:
    """utime + stime of the given processes, in seconds."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0
    for pid in pids:
        fields = _stat(pid)
        if fields is not None:
            total += int(fields[11]) + int(fields[12])
    return total / tick


def machine_cpu() -> tuple[float, float]:
    """(busy, steal) CPU seconds of the whole machine since boot, from /proc/stat."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]
    user, nice, system, _idle, _iowait, irq, softirq, steal = fields
    tick = os.sysconf("SC_CLK_TCK")
    return (user + nice + system + irq + softirq) / tick, steal / tick


class Noise:
    """How much CPU processes outside this benchmark took while it measured (and VM steal)."""

    def __init__(self) -> None:
        self.start = self._sample()

    @staticmethod
    def _sample() -> tuple[float, float, float, float]:
        busy, steal = machine_cpu()
        ours = cpu_seconds([os.getpid(), *descendants(os.getpid())])
        return time.monotonic(), busy, steal, ours

    def foreign(self) -> tuple[float, float]:
        """(share of all CPUs used by other processes, share stolen by the hypervisor)."""
        now = self._sample()
        capacity = (now[0] - self.start[0]) * (os.cpu_count() or 1)
        if capacity <= 0:
            return 0.0, 0.0
        other = (now[1] - self.start[1]) - (now[3] - self.start[3])
        return max(0.0, other / capacity), (now[2] - self.start[2]) / capacity


@dataclass
class Proc:
    name: str
    popen: subprocess.Popen[bytes]
    log: Path
    # (pid, start time) of descendants seen while running: stopped too, even if re-parented.
    family: set[tuple[int, str]] = field(default_factory=set)

    @property
    def pid(self) -> int:
        return self.popen.pid

    def remember_family(self) -> list[int]:
        kids = descendants(self.pid)
        for kid in kids:
            fields = _stat(kid)
            if fields is not None:
                self.family.add((kid, fields[19]))
        return kids

    def tail(self, n: int = 3000) -> str:
        try:
            return self.log.read_text(errors="replace")[-n:]
        except OSError:
            return ""


class Processes:
    """Everything this run starts; `stop_all` ends each one (and what it started) by pid."""

    def __init__(self) -> None:
        self.procs: list[Proc] = []

    def start(self, name: str, argv: list[str], env: dict[str, str], log: Path, cwd: Path) -> Proc:
        out = log.open("ab")
        try:
            popen = subprocess.Popen(
                argv,
                env=env,
                cwd=cwd,
                stdout=out,
                stderr=out,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        finally:
            out.close()
        proc = Proc(name, popen, log)
        self.procs.append(proc)
        return proc

    def stop_all(self) -> None:
        for proc in reversed(self.procs):
            proc.remember_family()
            if proc.popen.poll() is None:
                proc.popen.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 12
        for proc in reversed(self.procs):
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.popen.wait(timeout=max(0.1, deadline - time.monotonic()))
            if proc.popen.poll() is None:
                proc.popen.kill()
                proc.popen.wait()
        # Children that outlived their parent (mcp-proxy leaves its stdio server behind on
        # SIGTERM; a killed broker would leave its sandbox): by pid, checked against start time.
        time.sleep(0.2)
        for proc in self.procs:
            for pid, started in proc.family:
                fields = _stat(pid)
                if fields is not None and fields[19] == started and fields[0] != "Z":
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)
        self.procs.clear()
        reap_orphans()


def become_subreaper() -> None:
    """Orphaned grandchildren (mcp-proxy's stdio child) become ours to reap, not init's."""
    with contextlib.suppress(Exception):
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER


def reap_orphans() -> None:
    deadline = time.monotonic() + 3
    while time.monotonic() < deadline:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            time.sleep(0.05)
