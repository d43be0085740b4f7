"""checkov (`--framework kubernetes --skip-download`) passes on every rendering but for the
checks in checkov-skips.txt, each with its reason; and each of those still fires, so a skip
that became unnecessary is removed rather than kept."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import yaml

from tests.k8s_manifests.render import all_renderings

SKIPS = Path(__file__).with_name("checkov-skips.txt")


def checkov() -> str:
    """checkov lives in a venv of its own (install-checkov.sh says why)."""
    found = os.environ.get("DOCBROKER_TEST_CHECKOV", "")
    assert found and Path(found).is_file(), (
        "set DOCBROKER_TEST_CHECKOV to checkov 3.3.30: "
        "export DOCBROKER_TEST_CHECKOV=$(bash tests/k8s_manifests/install-checkov.sh)"
    )
    return found


def skips() -> dict[str, str]:
    out = {}
    for line in SKIPS.read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            check, _, reason = line.partition(" ")
            assert len(reason.strip()) > 20, f"{check} needs its reason"
            out[check] = reason.strip()
    return out


def failed_checks(folder: Path) -> set[tuple[str, str, str]]:
    done = subprocess.run(
        [
            checkov(),
            "--framework",
            "kubernetes",
            "--skip-download",
            "--quiet",
            "-o",
            "json",
            "-d",
            str(folder),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode in (0, 1), done.stderr
    report = json.loads(done.stdout) if done.stdout.strip() else {}
    reports = report if isinstance(report, list) else [report]
    assert reports and all("results" in r or r.get("passed", 0) == 0 for r in reports), done.stdout[:500]
    return {
        (c["check_id"], c["file_path"], c["resource"])
        for r in reports
        for c in r.get("results", {}).get("failed_checks", [])
    }


def test_checkov_is_clean_but_for_the_justified_skips(tmp_path: Path) -> None:
    out = tmp_path / "rendered"
    out.mkdir()
    for name, docs in all_renderings(tmp_path):
        # checkov reads only files ending in .yaml.
        (out / (name.replace("/", "_") + ".yaml")).write_text(yaml.safe_dump_all(docs))
    failed = failed_checks(out)
    allowed = skips()
    unjustified = sorted(f for f in failed if f[0] not in allowed)
    assert not unjustified, unjustified
    assert {f[0] for f in failed} == set(allowed), "a skip no longer needed: remove it from checkov-skips.txt"


def test_checkov_fails_a_privileged_pod(tmp_path: Path) -> None:
    """The check above can fail: checkov does report a bad Pod."""
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "bad", "namespace": "x"},
        "spec": {"containers": [{"name": "c", "image": "i:1", "securityContext": {"privileged": True}}]},
    }
    (tmp_path / "bad.yaml").write_text(yaml.safe_dump(pod))
    assert "CKV_K8S_16" in {f[0] for f in failed_checks(tmp_path)}  # "Container should not be privileged"
