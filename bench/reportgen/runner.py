"""Running one bench as a child process with `--json`, and what a section hands back."""

from __future__ import annotations

import collections
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")


class NotMeasured(Exception):
    """Why a section (or part of one) has no figures this run; rendered as one line."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass
class Part:
    """A rendered section: markdown lines and the plots it drew (paths under the plots folder)."""

    lines: list[str]
    plots: list[Path] = field(default_factory=list)


@dataclass
class Context:
    """What every section gets: where the benches and the output are, the run's mode, and the
    results of the sections already run (the memory section reads the scale section's)."""

    repo: Path
    benches: Path  # the folder holding the bench scripts (bench/ of this checkout)
    plots: Path  # the PNGs go here; REPORT.md links them relative to its own folder
    work: Path  # the benches' JSON and logs, a temporary folder
    quick: bool
    timeout: float  # seconds one bench may take before it is stopped
    env: dict[str, str]  # the environment the benches run with
    options: dict[str, Any] = field(default_factory=dict)  # section-specific flags of make_report
    results: dict[str, Any] = field(default_factory=dict)
    say: Callable[[str], None] = lambda message: print(message, file=sys.stderr, flush=True)

    def plot_path(self, name: str) -> Path:
        self.plots.mkdir(parents=True, exist_ok=True)
        return self.plots / name


def parsed(data: Any, parse: Callable[[Any], T], source: str) -> T:
    """`parse(data)`, or NotMeasured naming the source when the JSON is not of the expected shape
    (a bench of another revision, a half-written file)."""
    try:
        return parse(data)
    except (KeyError, TypeError, ValueError, AttributeError, IndexError) as exc:
        raise NotMeasured(f"{source} is not of the expected shape ({type(exc).__name__}: {exc})") from exc


def read_json(path: Path, source: str) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError as exc:
        raise NotMeasured(f"{source} is absent") from exc
    except (OSError, ValueError) as exc:
        raise NotMeasured(f"{source} could not be read ({type(exc).__name__})") from exc


def run_child(
    ctx: Context, name: str, command: list[str], env: dict[str, str] | None = None
) -> tuple[int, str]:
    """Run a child in its own process group; its stderr is echoed (indented) as progress and its
    stdout kept in the work folder. Returns (exit status, its last stderr line). Stopped with
    SIGTERM (the benches clean up on it), then SIGKILL, after ctx.timeout seconds."""
    log = ctx.work / f"{name}.stdout"
    tail: collections.deque[str] = collections.deque(maxlen=1)
    with log.open("wb") as out:
        child = subprocess.Popen(
            command,
            cwd=ctx.repo,
            env=env or ctx.env,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
        assert child.stderr is not None

        def echo(stream: Any) -> None:
            for raw in stream:
                line = raw.decode(errors="replace").rstrip()
                if line:
                    tail.append(line)
                    ctx.say(f"    {line}")

        reader = threading.Thread(target=echo, args=(child.stderr,), daemon=True)
        reader.start()
        try:
            code = child.wait(timeout=ctx.timeout)
        except subprocess.TimeoutExpired:
            _stop(child)
            reader.join(timeout=5)
            raise NotMeasured(f"{name} did not finish in {ctx.timeout:.0f} s and was stopped") from None
        except KeyboardInterrupt:
            _stop(child)
            raise
        reader.join(timeout=5)
    return code, (tail[0][:200] if tail else "")


def _stop(child: subprocess.Popen[bytes]) -> None:
    # A bench's clean-up (containers, brokers, a PostgreSQL cluster) may take a while on a busy
    # machine; a second SIGTERM reaches a bench whose first one landed where Python ignores an
    # exception (a __del__ running at that moment), before SIGKILL leaves things behind.
    for sig, grace in ((signal.SIGTERM, 60.0), (signal.SIGTERM, 30.0), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(child.pid, sig)
        except ProcessLookupError:
            return
        try:
            child.wait(timeout=grace)
            return
        except subprocess.TimeoutExpired:
            continue


def run_bench(ctx: Context, name: str, script: str, args: list[str]) -> Any:
    """Run bench/<script> with `--json`; its parsed JSON. A bench missing from this tree, one that
    wrote nothing, or one stopped for taking too long raises NotMeasured with the reason."""
    path = ctx.benches / script
    if not path.is_file():
        raise NotMeasured(f"bench/{script} is not in this tree")
    out = ctx.work / f"{name}.json"
    out.unlink(missing_ok=True)
    ctx.say(f"  running bench/{script} {' '.join(args)}")
    started = time.monotonic()
    code, last = run_child(ctx, name, [sys.executable, str(path), *args, "--json", str(out)])
    ctx.say(f"  bench/{script} exited {code} after {time.monotonic() - started:.0f} s")
    if not out.exists():
        why = f": {last}" if last else ""
        raise NotMeasured(f"bench/{script} wrote no results (exit {code}){why}")
    return read_json(out, f"bench/{script}'s JSON")
