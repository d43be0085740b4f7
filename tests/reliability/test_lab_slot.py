"""The lab script shares a machine safely: a lab left by a killed run is cleared by the next
start, and a start or stop that finds a live lab in its slot leaves that lab running.

Found by CI (stop 39): `./dev test` ran while another run's lab was still up in the same slot.
Its start refused (right), but the `stop` of its own folder that followed then removed the
slot's network namespace and killed the processes in the slot's cgroups, those of the lab that
was running. And a lab whose run was killed (processes gone, namespace left) blocked every
later start until someone removed it by hand.

Here in a slot of its own (KUBE_LAB_SLOT, beside the suite's lab), one lab after another:
live → a second start refused in one line naming it → the second folder's stop leaves it Ready
→ its processes killed as a dying run's would be → the next start clears it and comes up.
It starts two clusters, so it runs with the reliability runs, alone.
"""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.broker.support import gone, wait_for
from tests.kubernetes.conftest import LAB_SCRIPT

pytestmark = [pytest.mark.reliability, pytest.mark.timeout(420)]

SLOT = "3"  # the suite's lab is slot 0; slots 1 and 2 are left for people trying a lab by hand
NETNS = Path(f"/run/netns/docbroker-lab{SLOT}")
MARKER = Path(f"/run/docbroker-kube-lab{SLOT}.dir")


def lab(*args: str | Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "KUBE_LAB_SLOT": SLOT}
    return subprocess.run(
        ["bash", str(LAB_SCRIPT), *map(str, args)], env=env, capture_output=True, text=True, timeout=300
    )


def ready(lab_dir: Path) -> bool:
    probe = subprocess.run(
        ["kubectl", "--kubeconfig", str(lab_dir / "admin.kubeconfig"), "get", "--raw", "/readyz"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    return probe.returncode == 0 and probe.stdout.strip() == "ok"


@pytest.fixture
def dirs(tmp_path: Path) -> Iterator[dict[str, Path]]:
    made = {name: tmp_path / name for name in ("first", "second", "third")}
    for d in made.values():
        d.mkdir()
    yield made
    for d in made.values():
        lab("stop", d)
    if NETNS.exists() or MARKER.exists():  # a last resort, for a run that failed half-way
        lab("start", tmp_path / "cleanup")
        lab("stop", tmp_path / "cleanup")


def test_a_live_lab_is_left_running_and_a_dead_one_cleared(dirs: dict[str, Path]) -> None:
    first, second, third = dirs["first"], dirs["second"], dirs["third"]
    assert not NETNS.exists(), f"slot {SLOT} is in use on this machine"

    started = lab("start", first)
    assert started.returncode == 0, started.stderr
    assert ready(first)

    refused = lab("start", second)
    assert refused.returncode == 1
    assert refused.stderr.strip().splitlines() == [
        f"kube-lab.sh: a lab is already running in {first} (netns docbroker-lab{SLOT}): stop it first "
        f"(bash .ci/kube-lab.sh stop {first}), or start this one with KUBE_LAB_SLOT={int(SLOT) + 1}"
    ]
    stopped = lab("stop", second)  # what ./dev does after a start that failed
    assert stopped.returncode == 0, stopped.stderr
    assert NETNS.exists() and ready(first), "stopping a lab that never started broke the running one"
    assert f"the slot is {first}'s, left running" in stopped.stderr
    assert not second.exists()

    # A killed run: every process of the lab gone at once, nothing of it cleaned up.
    pids = [int(p.read_text()) for p in (first / "pids").glob("*.pid")]
    assert len(pids) == 6, pids
    for pid in pids:
        os.kill(pid, signal.SIGKILL)
    assert wait_for(lambda: all(gone(pid) for pid in pids), timeout=30), "outlived SIGKILL"
    assert NETNS.exists() and MARKER.read_text().strip() == str(first)  # the stale state entered

    cleared = lab("start", third)
    assert cleared.returncode == 0, cleared.stderr
    stale = f"a stale lab holds netns docbroker-lab{SLOT} ({first}; no process left): removing it"
    assert stale in cleared.stderr
    assert not first.exists()
    assert ready(third)
    assert MARKER.read_text().strip() == str(third)

    final = lab("stop", third)
    assert final.returncode == 0, final.stderr
    assert not NETNS.exists() and not MARKER.exists() and not third.exists()
