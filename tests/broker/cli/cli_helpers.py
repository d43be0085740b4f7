"""Running `docbroker` as an operator does: `python -m broker ...` in a subprocess, with the
broker's own settings (its environment), reading stdout, stderr and the exit code."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from broker.testing import ROOT, Broker


def cli(
    env: dict[str, str], *args: str, stdin: str | None = None, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "broker", *args],
        cwd=ROOT,
        env=env,
        input=stdin,
        stdin=None if stdin is not None else subprocess.DEVNULL,  # no terminal: nothing to ask on
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def json_out(result: subprocess.CompletedProcess[str]) -> Any:
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def one_line_error(result: subprocess.CompletedProcess[str], code: int) -> str:
    """The command failed with `code`, in one line on stderr, without a traceback."""
    assert result.returncode == code, (result.returncode, result.stdout, result.stderr)
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert "Traceback" not in result.stderr and len(lines) == 1, result.stderr
    return lines[0]


def token_file(tmp: Path, token: str, name: str = "approver.token") -> Path:
    path = tmp / name
    path.write_text(token + "\n")
    path.chmod(0o600)
    return path


def broker_env(broker: Broker) -> dict[str, str]:
    return dict(broker.env)
