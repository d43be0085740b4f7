"""Setting targets up: documents, the server's environment, a broker like the tests'
(broker.testing), mcp-proxy, and the broker of another checkout (--compare)."""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from bench.clients import Target, wait_ready
from bench.processes import Processes
from bench.workload import MCP_PROXY_SPEC, REPO, TENANT, documents

# -- set-up ----------------------------------------------------------------------------------


def write_docs(sources: Path) -> None:
    sources.mkdir(parents=True, exist_ok=True)
    for name, text in documents().items():
        (sources / name).write_text(text)


def docs_root(tmp: Path) -> tuple[Path, Path]:
    """A stand-alone DOCS_ROOT and secret file for the servers outside the broker."""
    root = tmp / "docs"
    write_docs(root / "sources")
    (root / "reports").mkdir()
    secret = tmp / "secret.key"
    secret.write_text(secrets.token_hex(32))
    secret.chmod(0o400)
    return root, secret


def server_env(root: Path, docs: Path, secret: Path) -> dict[str, str]:
    return {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": os.environ.get("HOME", "/root"),
        "PYTHONPATH": str(root),
        "DOCS_ROOT": str(docs),
        "DOCS_SCOPE": TENANT,
        "DOCS_SECRET_FILE": str(secret),
    }


@dataclass
class BrokerSetup:
    env: dict[str, str]
    url: str
    data_dir: Path
    mint: Callable[[], str]


def broker_setup(root: Path, tmp: Path, extra_env: dict[str, str]) -> BrokerSetup:
    """The same broker setup as the tests (identity provider, policies), run from `root`."""
    sys.path.insert(0, str(REPO))
    from broker.testing import make_broker

    broker = make_broker(
        tmp,
        tenants=(TENANT,),
        env={"PYTHONPATH": str(root), **extra_env},
        # Limits high enough never to bite: the limiter still runs on every request.
        limits="[limits]\nrate_per_minute = 1000000\nburst = 1000000\nmax_concurrent = 256\n",
    )
    write_docs(broker.sources(TENANT))  # where the broker provisions them

    def mint() -> str:
        exp = int(time.time()) + 3000
        return broker.token(TENANT, subject="bench-user", scope="docs:read", exp=exp)

    return BrokerSetup(env=broker.env, url=broker.mcp_url, data_dir=broker.data_dir, mint=mint)


def revision(root: Path) -> str:
    """The checkout's commit (and whether it has local changes), for the record."""
    try:
        head = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            timeout=10,
        )
        if head.returncode != 0:
            return f"{root} (not a git checkout)"
        dirty = subprocess.run(
            ["git", "-C", str(root), "status", "--porcelain", "--", "broker", "server"],
            capture_output=True,
            text=True,
            timeout=10,
        )
        return head.stdout.strip() + (
            " + local changes in broker/ or server/" if dirty.stdout.strip() else ""
        )
    except (OSError, subprocess.TimeoutExpired):
        return str(root)


def ensure_mcp_proxy(venv: Path, quiet: bool) -> Path | None:
    exe = venv / "bin" / "mcp-proxy"
    if exe.exists():
        return exe

    def say(message: str) -> None:
        if not quiet:
            print(message, file=sys.stderr, flush=True)

    say(f"creating {venv} and installing {MCP_PROXY_SPEC} (it needs mcp<2: a venv of its own)…")
    base = getattr(sys, "_base_executable", None) or shutil.which("python3") or sys.executable
    try:
        subprocess.run([base, "-m", "venv", str(venv)], check=True, capture_output=True)
        subprocess.run(
            [str(venv / "bin" / "pip"), "install", "-q", "--disable-pip-version-check", MCP_PROXY_SPEC],
            check=True,
            capture_output=True,
            timeout=600,
        )
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired, OSError) as exc:
        detail = getattr(exc, "stderr", b"") or b""
        say(
            f"mcp-proxy could not be installed ({type(exc).__name__}): "
            f"{detail.decode(errors='replace')[-500:]}"
        )
        shutil.rmtree(venv, ignore_errors=True)
        return None
    return exe if exe.exists() else None


def compared_broker(checkout: Path, procs: Processes, tmp: Path, extra: dict[str, str]) -> Target:
    """The broker of another checkout (with its own sandbox, run from that checkout's server/).

    Compare its p50 with the broker row's: both paths include their own sandbox. Its "added"
    column is against this run's direct (unix socket), a server from this checkout."""
    tmp.mkdir()
    setup = broker_setup(checkout, tmp, extra)
    proc = procs.start(
        "broker (compared)",
        [sys.executable, "-m", "broker", "serve"],
        setup.env,
        tmp / "broker.log",
        checkout,
    )
    token = setup.mint()
    target = Target(
        "broker_compared",
        f"broker, compared ({revision(checkout).split()[0]})",
        setup.url,
        token=lambda: token,
        baseline="direct_uds",
        proxy_pids=lambda: [proc.pid],
        server_pids=proc.remember_family,
    )
    wait_ready(target, proc)
    return target
