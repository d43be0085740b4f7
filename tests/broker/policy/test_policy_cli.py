"""`docbroker policy validate|test|explain`, run as the operator runs them (a real process),
and every shipped example's table — what CI runs for the examples."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from broker.testing import ROOT

EXAMPLES = sorted((ROOT / "policies" / "examples").glob("*.test.toml"))


def docbroker(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "broker", "policy", *args], cwd=cwd,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT)}, capture_output=True, text=True, timeout=60,
    )  # fmt: skip


def test_every_example_has_a_table() -> None:
    policies = sorted((ROOT / "policies" / "examples").glob("*.cedar"))
    assert policies and [p.stem for p in policies] == [t.name.removesuffix(".test.toml") for t in EXAMPLES]


@pytest.mark.parametrize("table", EXAMPLES, ids=lambda p: p.name)
def test_shipped_examples_decide_as_their_tables_say(table: Path) -> None:
    done = docbroker("test", str(table))
    assert done.returncode == 0, done.stdout + done.stderr
    assert " 0 failed" in done.stdout


def test_a_table_that_expects_otherwise_fails(tmp_path: Path) -> None:
    shutil.copy(ROOT / "policies" / "examples" / "contractors-no-hr.cedar", tmp_path)
    (tmp_path / "t.test.toml").write_text(
        'with = ["contractors-no-hr.cedar"]\n[[case]]\nname = "wrong"\ngroups = ["contractors"]\n'
        'scopes = ["docs:read"]\ntool = "read_document"\ndocument = "hr-a.md"\nexpect = "allow"\n'
        '[[case]]\nname = "wrong ids"\nscopes = ["docs:read"]\ntool = "read_document"\nexpect = "allow"\n'
        'policies = ["someone.else"]\n'
    )
    done = docbroker("test", str(tmp_path / "t.test.toml"))
    assert done.returncode == 1
    assert "FAIL wrong: got deny by ['examples.contractors.no_hr_documents']" in done.stdout
    assert "FAIL wrong ids: got allow by ['toml.tenants.demo']" in done.stdout
    assert "0 passed, 2 failed" in done.stdout


def test_validate_names_the_set_or_the_one_bad_policy(tmp_path: Path) -> None:
    good = docbroker("validate")
    assert good.returncode == 0 and good.stdout.startswith("ok: 5 policies, set ")
    bad = tmp_path / "bad.cedar"
    bad.write_text('@id("late")\nforbid (principal, action, resource) when { context.hour > "x" };\n')
    done = docbroker("validate", str(bad))
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert done.stdout.startswith("invalid: bad.cedar: policy late does not validate")
    assert done.stdout.count("\n") == 1


def test_explain_says_which_policy_decided(tmp_path: Path) -> None:
    example = str(ROOT / "policies" / "examples" / "contractors-no-hr.cedar")
    common = ["explain", "--tenant", "demo", "--scopes", "docs:read", "--tool", "read_document"]
    denied = json.loads(
        docbroker(*common, "--groups", "contractors", "--document", "hr-a.md", "--with", example).stdout
    )
    assert denied["decision"] == "deny"
    assert denied["determined_by"] == [
        {"id": "examples.contractors.no_hr_documents", "file": "contractors-no-hr.cedar"}
    ]
    allowed = json.loads(docbroker(*common, "--document", "hr-a.md", "--with", example).stdout)
    assert allowed["decision"] == "allow" and allowed["determined_by"][0]["id"] == "toml.tenants.demo"
    nobody = json.loads(
        docbroker("explain", "--tenant", "nowhere", "--scopes", "docs:read", "--tool", "read_document").stdout
    )
    assert nobody == {**nobody, "decision": "deny", "determined_by": [], "default_deny": True}
    bad = docbroker(*common, "--groups", "contractors", "--scopes", "docs:everything")
    assert bad.returncode == 1 and bad.stdout.startswith("invalid: request: scopes must be among")
