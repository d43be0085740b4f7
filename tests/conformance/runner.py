"""The official MCP conformance runner (npm `@modelcontextprotocol/conformance`) on its own
Node 22, as `./dev setup` installs them (.ci/conformance.sh, from .ci/conformance's lock) into
/var/cache/docbroker/conformance-<version>. Not installed, a test fails: it never skips.

`run` drives one server scenario against a URL and returns the runner's exit code and its
checks (its own `checks.json`), so a failure names the check and the runner's reason;
`run_all` runs several side by side (each is a Node start-up, about 0.5 s of CPU, and a few
requests: together they take the time of the slowest).
"""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
_PINS = json.loads((ROOT / ".ci/conformance/package.json").read_text())["dependencies"]
VERSION = _PINS["@modelcontextprotocol/conformance"]
NODE_VERSION = _PINS["node"]
MODULES = Path(f"/var/cache/docbroker/conformance-{VERSION}/node_modules")
NODE = MODULES / ".bin/node"
CLI = MODULES / "@modelcontextprotocol/conformance/dist/index.js"
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
TIMEOUT = 60  # seconds for one scenario; the slowest here takes about 4


@dataclass(frozen=True)
class Run:
    returncode: int
    checks: list[dict[str, Any]]
    output: str

    def problems(self) -> list[str]:
        """Every check that is not a success or a plain note, with the runner's reason."""
        return [
            f"{c['id']}: {c['status']}: {c.get('errorMessage')} {json.dumps(c.get('details'))[:600]}"
            for c in self.checks
            if c["status"] not in ("SUCCESS", "INFO")
        ]


def require_installed() -> None:
    assert NODE.exists() and CLI.exists(), "run ./dev setup (.ci/conformance.sh): no conformance runner"
    version = subprocess.run([str(NODE), "--version"], capture_output=True, text=True, check=True).stdout
    assert version.strip() == f"v{NODE_VERSION}", "run ./dev setup (.ci/conformance.sh): wrong Node"


def run(url: str, scenario: str, out: Path) -> Run:
    """One scenario, as CI runs it: `conformance server --url URL --scenario NAME -o OUT`."""
    done = subprocess.run(
        [str(NODE), str(CLI), "server", "--url", url, "--scenario", scenario, "-o", str(out)],
        cwd=out,
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        env={"PATH": f"{NODE.parent}:/usr/bin:/bin", "HOME": str(out)},
    )
    found = sorted(out.glob(f"server-{scenario}-*/checks.json"))
    checks = json.loads(found[-1].read_text()) if found else []
    output = _ANSI.sub("", done.stdout + done.stderr)  # the runner colours its report regardless
    return Run(done.returncode, checks, output[-4000:])


def run_all(url: str, scenarios: Iterable[str], out: Path) -> dict[str, Run]:
    """Each scenario in a runner of its own, all at once, each writing under `out/<scenario>`."""
    names = list(scenarios)
    for name in names:
        (out / name).mkdir()
    with ThreadPoolExecutor(len(names)) as pool:
        runs = pool.map(lambda name: run(url, name, out / name), names)
        return dict(zip(names, runs, strict=True))
