"""When another broker's claim on an approval is lost (DESIGN §9): its owner is known to have
stopped, or (an owner this host cannot see) its time is up; never while it is known to run.
Real lock files in a real replicas folder, a real second process."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from pathlib import Path

from broker.approvals.claims import Claims
from broker.approvals.store import HeldClaim
from broker.runtime.host_replicas import Replicas

# A second replica in its own process: joins the folder, prints its owner, holds on until killed.
PEER = """
import asyncio, sys, time
from pathlib import Path
from broker.runtime.host_replicas import Replicas
r = Replicas(Path(sys.argv[1]), sys.argv[2])
asyncio.run(r.join())
print(r.owner, flush=True)
time.sleep(600)
"""


def peer(folder: Path, replica: str) -> tuple[subprocess.Popen[str], str]:
    proc = subprocess.Popen(
        [sys.executable, "-c", PEER, str(folder), replica], stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None
    return proc, proc.stdout.readline().strip()


def held(owner: str, until: float) -> HeldClaim:
    return HeldClaim("a" * 32, "acme", owner, until)


def test_a_claim_is_lost_when_its_owner_stops_restarts_or_its_time_is_up(tmp_path: Path) -> None:
    folder = tmp_path / ".replicas"
    me = Replicas(folder, "a")
    asyncio.run(me.join())
    claims = Claims(owner=me.owner, hold_seconds=60, owner_dead=me.owner_dead)
    later = time.time() + 60
    try:
        assert claims.lost(held(me.owner, later)) is False  # my own, in flight
        # mine past its time: still mine while I run (I give it back myself, even if the
        # database was away when I first tried)
        assert claims.lost(held(me.owner, time.time() - 1)) is False

        proc, b_owner = peer(folder, "b")
        assert b_owner.split("/")[1] == "b" and b_owner.split("/")[0] == me.owner.split("/")[0]
        assert claims.lost(held(b_owner, later)) is False  # b runs
        assert claims.lost(held(b_owner, time.time() - 1)) is False  # b runs: its time does not count
        proc.kill()
        proc.wait()
        assert claims.lost(held(b_owner, later)) is True  # b died: its lock is free

        proc, b_again = peer(folder, "b")  # b restarted under the same id
        try:
            assert b_again != b_owner
            assert claims.lost(held(b_owner, later)) is True  # the old incarnation's claim
            assert claims.lost(held(b_again, later)) is False
        finally:
            proc.kill()
            proc.wait()

        # a process of another folder (another host, or another data dir): only its time counts
        elsewhere = Replicas(tmp_path / "other" / ".replicas", "a")
        asyncio.run(elsewhere.join())
        assert claims.lost(held(elsewhere.owner, later)) is False
        elsewhere.leave()
        assert claims.lost(held(elsewhere.owner, later)) is False
        assert claims.lost(held(elsewhere.owner, time.time() - 1)) is True
        # a replica this folder never saw, and owners that are not names at all
        for owner in (f"{me.owner.split('/')[0]}/zz/0", "", "x", "//", f"{me.owner.split('/')[0]}/../x"):
            assert claims.lost(held(owner, later)) is False, owner
    finally:
        me.leave()


def test_the_same_replica_id_on_another_data_dir_is_not_this_process(tmp_path: Path) -> None:
    """Two brokers named alike (the default id is the host name) on two data dirs, one
    database: neither may take the other's claim back while it holds it."""
    one, two = Replicas(tmp_path / "1" / ".replicas", "vm"), Replicas(tmp_path / "2" / ".replicas", "vm")
    asyncio.run(one.join())
    asyncio.run(two.join())
    try:
        assert one.owner_dead(two.owner) is None and two.owner_dead(one.owner) is None
    finally:
        one.leave()
        two.leave()


def test_without_a_replicas_folder_only_this_process_is_known_alive(tmp_path: Path) -> None:
    """Kubernetes replicas share no folder: each keeps its own claims however long it holds
    them (it gives them back itself), and takes another's back only once its time is up."""
    me = Replicas(None, "pod-a")
    claims = Claims(owner=me.owner, hold_seconds=60, owner_dead=me.owner_dead)
    other = Replicas(None, "pod-b").owner
    assert claims.lost(held(me.owner, time.time() - 1)) is False
    assert claims.lost(held(other, time.time() + 60)) is False
    assert claims.lost(held(other, time.time() - 1)) is True
