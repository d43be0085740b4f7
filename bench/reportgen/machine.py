"""The report's header: the machine, the code's revision, the date, the load while it ran."""

from __future__ import annotations

import os
import platform
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Machine:
    cpus: int
    model: str
    memory_gib: float
    kernel: str
    python: str

    @classmethod
    def here(cls) -> Machine:
        return cls(
            cpus=os.cpu_count() or 1,
            model=_cpu_model(),
            memory_gib=_memory_kib() / 2**20,
            kernel=f"{platform.system()} {platform.release()}",
            python=platform.python_version(),
        )


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text(encoding="utf-8").splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _memory_kib() -> int:
    try:
        for line in Path("/proc/meminfo").read_text(encoding="utf-8").splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return 0


def revision(repo: Path) -> str:
    """`git describe --always --dirty`: the commit measured, and whether it had local changes."""
    try:
        done = subprocess.run(
            ["git", "-C", str(repo), "describe", "--always", "--dirty", "--tags"],
            capture_output=True,
            text=True,
            timeout=10,
        )
    except (OSError, subprocess.TimeoutExpired):
        return "unknown (git not available)"
    return done.stdout.strip() if done.returncode == 0 else "unknown (not a git checkout)"


class LoadSampler:
    """The 1-minute load average, sampled every few seconds while the report runs: the benches
    are only as good as the machine was quiet, so the header says how busy it was."""

    def __init__(self, every: float = 5.0) -> None:
        self.samples: list[float] = [os.getloadavg()[0]]
        self._every = every
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self._every):
            self.samples.append(os.getloadavg()[0])

    def stop(self) -> tuple[float, float]:
        self._stop.set()
        self._thread.join(timeout=self._every + 1)
        self.samples.append(os.getloadavg()[0])
        return min(self.samples), max(self.samples)


def header(machine: Machine, rev: str, started: float, wall: float, load: tuple[float, float]) -> list[str]:
    """The header as a markdown table."""
    when = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(started))
    cpus_per = load[1] / machine.cpus if machine.cpus else 0.0
    return [
        "| | |",
        "|---|---|",
        f"| date | {when}, {wall:.0f} s to run |",
        f"| revision | `{rev}` |",
        f"| machine | {machine.cpus} CPUs ({machine.model}), {machine.memory_gib:.1f} GiB memory |",
        f"| kernel, Python | {machine.kernel}, Python {machine.python} |",
        f"| load during the run | 1-min load average {load[0]:.1f} to {load[1]:.1f} "
        f"(at most {cpus_per:.1f} per CPU) |",
    ]
