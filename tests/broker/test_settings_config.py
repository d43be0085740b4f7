"""The settings as an operator meets them (issue 24, item 26): nothing but `broker/settings/`
reads a variable, and a command reads only what it uses (`docbroker db` ran only with the
identity provider's settings set, which it never touches). That every variable is documented
is tests/broker/cli/test_reference.py's (docs/operations.md, generated from the settings).
"""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
from pathlib import Path

from broker.testing import ROOT

SETTINGS = ROOT / "broker" / "settings"


def test_nothing_but_the_settings_module_reads_a_docbroker_variable() -> None:
    readers = []
    for path in sorted((ROOT / "broker").rglob("*.py")):
        if path.is_relative_to(SETTINGS) or "testing" in path.relative_to(ROOT).parts:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            text = ast.unparse(node) if isinstance(node, ast.Call | ast.Subscript) else ""
            if ("environ" in text or "getenv" in text) and re.search(r"""['"]DOCBROKER_""", text):
                readers.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert readers == []


def run(command: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    base = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [sys.executable, "-m", "broker", *command],
        cwd=ROOT,
        env=base | env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_db_upgrade_and_status_need_no_auth_settings(tmp_path: Path) -> None:
    env = {"DOCBROKER_DATA_DIR": str(tmp_path / "data")}  # no DOCBROKER_AUTH_* at all
    status = run(["db", "status", "--json"], env)
    assert status.returncode == 1, status.stderr  # nothing there yet: needs an upgrade
    assert json.loads(status.stdout)["schema_version"] == 0
    upgraded = run(["db", "upgrade", "--json"], env)
    assert upgraded.returncode == 0, upgraded.stderr
    report = json.loads(upgraded.stdout)
    assert (report["backend"], report["state"]) == ("sqlite", "current") and report["applied"]
    assert (tmp_path / "data" / "approvals.sqlite3").is_file()
    assert run(["db", "status", "--json"], env).returncode == 0
    # What it does read is still checked, in one line naming the variable.
    bad = run(["db", "status"], env | {"DOCBROKER_DATABASE_URL": "postgresql://u:s3cret@db.example.com/x"})
    assert bad.returncode != 0 and "DOCBROKER_DATABASE_URL" in bad.stderr and "s3cret" not in bad.stderr
    assert "Traceback" not in bad.stderr and len(bad.stderr.strip().splitlines()) == 1
