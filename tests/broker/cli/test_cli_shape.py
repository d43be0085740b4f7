"""One structure for every command (issue 29 item 1): `--help` on each, `--json` on each read,
exit codes 0/1/2, errors in one line and never a traceback, and the old entry points
(`docbroker`, `python -m broker`) still working."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from broker.cli import build_parser, commands
from broker.testing import ROOT
from tests.broker.cli.cli_helpers import cli, one_line_error

# The commands that read state: each must offer --json.
READS = {
    "docbroker tenant list",
    "docbroker tenant show",
    "docbroker approvals list",
    "docbroker approvals show",
    "docbroker sandbox list",
    "docbroker sandbox logs",
    "docbroker db status",
    "docbroker doctor",
    "docbroker audit query",
    "docbroker audit verify",
}
GROUPS = ["tenant", "approvals", "sandbox", "client-config", "audit", "db", "doctor", "serve", "image"]


def _leaves() -> dict[str, set[str]]:
    found = {}
    for parser in commands(build_parser()):
        found[parser.prog] = {o for a in parser._actions for o in a.option_strings}
    return found


def test_every_command_group_of_the_issue_is_there() -> None:
    leaves = _leaves()
    for command in [
        "tenant add", "tenant list", "tenant show", "tenant remove",
        "approvals list", "approvals show", "approvals approve", "approvals deny",
        "sandbox list", "sandbox restart", "sandbox logs", "client-config",
    ]:  # fmt: skip
        assert f"docbroker {command}" in leaves, command


def test_every_read_takes_json_and_every_command_help() -> None:
    leaves = _leaves()
    assert READS <= leaves.keys()
    assert [r for r in sorted(READS) if "--json" not in leaves[r]] == []
    assert all("-h" in options for options in leaves.values())


@pytest.mark.parametrize("group", GROUPS)
def test_help_of_each_group_exits_0(group: str) -> None:
    result = cli({"PATH": os.environ["PATH"], "PYTHONPATH": str(ROOT)}, group, "--help")
    assert result.returncode == 0 and "usage: docbroker" in result.stdout, result.stderr


def test_the_entry_point_and_python_m_broker_are_the_same_command(tmp_path: Path) -> None:
    script = Path(sys.executable).parent / "docbroker"
    env = {"PATH": os.environ["PATH"], "PYTHONPATH": str(ROOT)}
    via_module = cli(env, "--help")
    via_script = subprocess.run([script, "--help"], env=env, capture_output=True, text=True, check=False)
    assert via_module.returncode == via_script.returncode == 0
    assert via_module.stdout == via_script.stdout and "exit codes: 0" in via_module.stdout


def test_usage_errors_exit_2_in_one_line(tmp_path: Path) -> None:
    env = {"PATH": os.environ["PATH"], "PYTHONPATH": str(ROOT), "DOCBROKER_DATA_DIR": str(tmp_path)}
    assert cli(env, "tenant", "frobnicate").returncode == 2  # argparse's own usage error
    # A bad tenant id: no traceback, no echo of what was typed.
    line = one_line_error(cli(env, "sandbox", "logs", "Evil\x1b]0;x\x07"), 2)
    assert "\x1b" not in line and "Evil" not in line
    # Configuration the command needs is missing: usage, naming the variable only.
    line = one_line_error(cli(env, "tenant", "list"), 2)
    assert "DOCBROKER_AUTH_ISSUER" in line and line.startswith("docbroker tenant list: configuration error")


def test_a_failure_is_exit_1_in_one_line(tmp_path: Path) -> None:
    env = {
        "PATH": os.environ["PATH"],
        "PYTHONPATH": str(ROOT),
        "DOCBROKER_DATA_DIR": str(tmp_path / "data"),
        "DOCBROKER_POLICIES_DIR": str(tmp_path / "policies"),
        "DOCBROKER_AUTH_ISSUER": "https://issuer.invalid",
        "DOCBROKER_AUTH_AUDIENCE": "x",
        "DOCBROKER_AUTH_JWKS_FILE": str(tmp_path / "jwks.json"),
    }
    line = one_line_error(cli(env, "tenant", "show", "nobody"), 1)
    assert line == "docbroker tenant show: no such tenant"


def test_an_unexpected_failure_is_one_line_naming_its_kind_never_a_traceback(tmp_path: Path) -> None:
    planted = tmp_path / "not-a-folder"
    planted.write_text("secret-ish content\n")
    env = {
        "PATH": os.environ["PATH"],
        "PYTHONPATH": str(ROOT),
        "DOCBROKER_DATA_DIR": str(planted),  # a file where the data dir should be
        "DOCBROKER_POLICIES_DIR": str(tmp_path / "policies"),
        "DOCBROKER_AUTH_ISSUER": "https://issuer.invalid",
        "DOCBROKER_AUTH_AUDIENCE": "x",
        "DOCBROKER_AUTH_JWKS_FILE": str(tmp_path / "jwks.json"),
    }
    line = one_line_error(cli(env, "tenant", "add", "acme"), 1)
    assert line.startswith("docbroker tenant add: failed unexpectedly (") and str(planted) not in line


def test_version_names_the_release_and_the_schema_it_needs() -> None:
    """An upgrade and a rollback are checked against it (docs/kubernetes.md, "Roll back")."""
    import tomllib

    from broker.approvals.migrations import LATEST

    expected = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]

    done = subprocess.run(
        [sys.executable, "-m", "broker", "--version"], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"docbroker {expected} (approvals schema {LATEST})"
