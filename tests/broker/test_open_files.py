"""The broker's open-file limit: a service manager's default soft limit (systemd: 1024) is
about what DOCBROKER_MAX_CONNECTIONS alone allows, so `serve` raises it to the hard limit, and
says so when even that is below what the settings allow (bench/scale.py measures the need)."""

from __future__ import annotations

import resource
import subprocess
import sys
import time
from pathlib import Path

import httpx2

from broker.testing import ROOT, make_broker


def _serve_with_limits(tmp_path: Path, soft: int, hard: int) -> tuple[subprocess.Popen[bytes], Path]:
    broker = make_broker(tmp_path)
    log = tmp_path / "broker.log"

    def limit() -> None:  # in the child only: the test process keeps its own limits
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))

    with log.open("ab") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "broker", "serve"],
            cwd=ROOT,
            env=broker.env,
            stdout=out,
            stderr=out,
            stdin=subprocess.DEVNULL,
            preexec_fn=limit,  # only setrlimit, before exec
        )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        assert proc.poll() is None, log.read_text()
        try:
            if httpx2.get(f"{broker.url}/healthz", timeout=1).status_code == 200:
                return proc, log
        except httpx2.TransportError:
            pass
        time.sleep(0.1)
    proc.kill()
    raise AssertionError(f"broker did not start:\n{log.read_text()[-2000:]}")


def _open_files_limit(pid: int) -> tuple[int, int]:
    for line in Path(f"/proc/{pid}/limits").read_text().splitlines():
        if line.startswith("Max open files"):
            soft, hard = line.split()[3:5]
            return int(soft), int(hard)
    raise AssertionError("no open-file limit in /proc")


def _stop(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=15)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def test_serve_raises_its_soft_open_file_limit_to_the_hard_one(tmp_path: Path) -> None:
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    assert hard == resource.RLIM_INFINITY or hard > 1024, "the test needs a hard limit above 1024"
    hard = min(hard, 65_536)
    proc, log = _serve_with_limits(tmp_path, 1024, hard)
    try:
        assert _open_files_limit(proc.pid) == (hard, hard)
    finally:
        _stop(proc)
    assert "open-file limit is below" not in log.read_text()


def test_serve_says_when_even_the_hard_limit_is_below_what_the_settings_allow(tmp_path: Path) -> None:
    proc, log = _serve_with_limits(tmp_path, 256, 512)
    try:
        assert _open_files_limit(proc.pid) == (512, 512)
    finally:
        _stop(proc)
    text = log.read_text()
    assert text.count("the open-file limit is below what the settings allow") == 1
    assert "Traceback" not in text
