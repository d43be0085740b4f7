"""The reports keeper attacked over HTTP, on real folders (DESIGN §7 in a Pod, DESIGN §10).

The design property that the server container never mounts the reports volume is proven
live, inside a tenant Pod, by the Kubernetes tests; here is everything the keeper itself
decides: who may call it, what it accepts, what it quarantines, what it never overwrites.
"""

from __future__ import annotations

import hashlib
import os
import secrets
import socket
import stat
import time
from pathlib import Path

import pytest

from tests.broker.keeper.keeper_support import KEEPER_KEY, Keeper, derived, start_keeper, wait_serving
from tests.broker.support import wait_for

APPROVED = b"# Q3\nthe approved bytes\n"
SHA = hashlib.sha256(APPROVED).hexdigest()

WRONG_KEYS = {
    "none": None,
    "random": secrets.token_hex(32),
    "other-tenant-keeper-key": derived(b"docbroker/keeper/v1/", "globex"),
    "the-sandbox-key": derived(b"docbroker/sandbox/v1/", "acme"),  # what the server container holds
    "the-approval-secret": derived(b"docbroker/approval/v1/", "acme"),
    "prefix": KEEPER_KEY[:-1],
}


@pytest.mark.parametrize("who", sorted(WRONG_KEYS))
def test_without_the_keeper_key_nothing_happens(keeper: Keeper, who: str) -> None:
    keeper.drop("q3.md", APPROVED)
    (keeper.reports / "old.md").write_bytes(b"earlier")
    key = WRONG_KEYS[who]
    for path, body in (
        ("/v1/accept", {"name": "q3.md", "sha256": SHA}),
        ("/v1/sweep", {"reason": "dropbox_before_save"}),
        ("/v1/exists", {"name": "old.md"}),
    ):
        assert keeper.post(path, body, key=key) == (401, None)
    assert (keeper.dropbox / "q3.md").exists()  # neither accepted nor swept
    assert not (keeper.reports / "q3.md").exists()


def test_lowercase_scheme_is_refused(keeper: Keeper) -> None:
    """The scheme is matched exactly as the broker sends it."""
    body = b'{"reason": "dropbox_before_save"}'
    request = (
        f"POST /v1/sweep HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
        f"authorization: bearer {KEEPER_KEY}\r\ncontent-length: {len(body)}\r\nconnection: close\r\n\r\n"
    ).encode() + body
    keeper.drop("planted.md", b"x")
    with socket.create_connection(("127.0.0.1", keeper.port), timeout=10) as s:
        s.sendall(request)
        assert s.recv(100).startswith(b"HTTP/1.1 401 ")
    assert (keeper.dropbox / "planted.md").exists()


def test_approved_bytes_are_accepted_into_the_store(keeper: Keeper) -> None:
    keeper.drop("q3.md", APPROVED)
    assert keeper.post("/v1/accept", {"name": "q3.md", "sha256": SHA}) == (200, {"accepted": "ok"})
    report = keeper.reports / "q3.md"
    assert report.read_bytes() == APPROVED
    assert stat.S_IMODE(report.stat().st_mode) == 0o600
    assert os.listdir(keeper.dropbox) == []
    assert keeper.post("/v1/exists", {"name": "q3.md"}) == (200, {"exists": True})
    assert keeper.post("/v1/exists", {"name": "q4.md"}) == (200, {"exists": False})


def test_other_bytes_than_approved_are_quarantined(keeper: Keeper) -> None:
    keeper.drop("q3.md", b"# Q3\nwhat the sandbox wrote instead\n")
    assert keeper.post("/v1/accept", {"name": "q3.md", "sha256": SHA}) == (
        200,
        {"accepted": "content_mismatch"},
    )
    assert not (keeper.reports / "q3.md").exists()
    assert os.listdir(keeper.dropbox) == []
    assert len(os.listdir(keeper.quarantine)) == 1


def _symlink(keeper: Keeper) -> None:
    (keeper.base / "outside.md").write_bytes(APPROVED)
    (keeper.dropbox / "q3.md").symlink_to(keeper.base / "outside.md")


def _fifo(keeper: Keeper) -> None:
    os.mkfifo(keeper.dropbox / "q3.md")


def _hardlink(keeper: Keeper) -> None:
    (keeper.base / "elsewhere.md").write_bytes(APPROVED)
    os.link(keeper.base / "elsewhere.md", keeper.dropbox / "q3.md")


def _directory(keeper: Keeper) -> None:
    (keeper.dropbox / "q3.md").mkdir()


@pytest.mark.parametrize("plant", [_symlink, _fifo, _hardlink, _directory], ids=lambda f: f.__name__[1:])
def test_anything_but_a_plain_file_is_not_accepted(keeper: Keeper, plant: object) -> None:
    plant(keeper)  # type: ignore[operator]
    status, answer = keeper.post("/v1/accept", {"name": "q3.md", "sha256": SHA})
    assert status == 200 and answer["accepted"] in ("not_regular", "io_error")
    assert answer["accepted"] != "ok"
    assert not (keeper.reports / "q3.md").exists()
    keeper.post("/v1/sweep", {"reason": "dropbox_after_save"})
    assert os.listdir(keeper.dropbox) == []


@pytest.mark.parametrize(
    "name",
    ["../q3.md", "../reports/q3.md", "a/b.md", ".quarantine", "q3.txt", "", "x" * 70 + ".md", "q3.md\n"],
)
def test_names_outside_the_contract_are_refused(keeper: Keeper, name: str) -> None:
    (keeper.base / "q3.md").write_bytes(APPROVED)  # what "../q3.md" would reach
    assert keeper.post("/v1/accept", {"name": name, "sha256": SHA}) == (400, {"error": "invalid_name"})
    assert keeper.post("/v1/exists", {"name": name}) == (400, {"error": "invalid_name"})
    assert (keeper.base / "q3.md").exists()
    assert os.listdir(keeper.reports) == []


def test_planted_files_are_swept_and_counted(keeper: Keeper) -> None:
    for name in ("planted-1.md", "planted-2.md", "not-a-report.txt"):
        keeper.drop(name, b"planted")
    (keeper.dropbox / "link.md").symlink_to("/etc/passwd")
    status, answer = keeper.post("/v1/sweep", {"reason": "dropbox_before_save"})
    assert (status, answer) == (200, {"quarantined": 4, "stuck": 0})
    assert os.listdir(keeper.dropbox) == []
    assert len(os.listdir(keeper.quarantine)) == 4
    assert keeper.post("/v1/sweep", {"reason": "dropbox_at_startup"}) == (200, {"quarantined": 0, "stuck": 0})


def test_an_existing_report_is_never_overwritten(keeper: Keeper) -> None:
    (keeper.reports / "q3.md").write_bytes(b"written earlier")
    keeper.drop("q3.md", APPROVED)
    assert keeper.post("/v1/accept", {"name": "q3.md", "sha256": SHA}) == (200, {"accepted": "exists"})
    assert (keeper.reports / "q3.md").read_bytes() == b"written earlier"
    assert os.listdir(keeper.dropbox) == []


def test_nothing_dropped_is_missing(keeper: Keeper) -> None:
    assert keeper.post("/v1/accept", {"name": "q3.md", "sha256": SHA}) == (200, {"accepted": "missing"})


BAD_BODIES = {
    "extra-key": (b'{"name": "q3.md", "sha256": "%s", "force": "1"}', 400),
    "missing-key": (b'{"name": "q3.md"}', 400),
    "duplicate-key": (b'{"name": "x.md", "name": "q3.md", "sha256": "%s"}', 400),
    "not-a-string": (b'{"name": ["q3.md"], "sha256": "%s"}', 400),
    "not-json": (b"name=q3.md", 400),
    "array": (b'["q3.md"]', 400),
    "deep": (b"[" * 500 + b"]" * 500, 400),
    "too-large": (b'{"name": "q3.md", "sha256": "%s", "pad": "' + b"x" * 2000 + b'"}', 413),
    "upper-hex": (b'{"name": "q3.md", "sha256": "' + SHA.upper().encode() + b'"}', 400),
}


@pytest.mark.parametrize("case", sorted(BAD_BODIES))
def test_bodies_are_strict(keeper: Keeper, case: str) -> None:
    keeper.drop("q3.md", APPROVED)
    raw, status = BAD_BODIES[case]
    raw = raw.replace(b"%s", SHA.encode())
    got, answer = keeper.post("/v1/accept", None, raw=raw)
    assert got == status
    assert isinstance(answer, dict) and set(answer) == {"error"}
    assert not (keeper.reports / "q3.md").exists()


def test_other_requests_are_refused(keeper: Keeper) -> None:
    assert keeper.post("/v1/accept", {"name": "q3.md", "sha256": SHA}, content_type="text/plain")[0] == 415
    assert keeper.post("/v1/sweep", {"reason": "because"}) == (400, {"error": "invalid_reason"})
    assert keeper.post("/v1/sweep", {"reason": "dropbox_before_save"}, method="PUT")[0] == 405
    assert keeper.post("/v1/list", {})[0] == 404
    assert keeper.post("/v1/list", {}, key=None)[0] == 401  # the key first, before any routing


def test_no_name_hash_or_key_in_the_keepers_log(keeper: Keeper) -> None:
    keeper.drop("secret-name-5d2e.md", b"other bytes")
    keeper.post("/v1/accept", {"name": "secret-name-5d2e.md", "sha256": SHA})
    keeper.post("/v1/accept", {"name": "../secret-path-91bc.md", "sha256": SHA})
    keeper.post("/v1/sweep", {"reason": "dropbox_before_save"}, key="wrong-key-c0de")
    # A quarantine that cannot be opened: the keeper warns, and the drop stays, counted stuck.
    os.rename(keeper.quarantine, keeper.base / "moved-away")
    keeper.quarantine.write_bytes(b"")
    keeper.drop("secret-name-7f3a.md", b"x")
    assert keeper.post("/v1/sweep", {"reason": "dropbox_after_save"}) == (200, {"quarantined": 0, "stuck": 1})
    keeper.stop()
    text = keeper.log.read_text()
    assert "could not open the quarantine" in text  # the log is written to: the check can fail
    for secret in ("secret-name", "secret-path", SHA[:16], KEEPER_KEY[:16], "wrong-key"):
        assert secret not in text


# --- start-up ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({"KEEPER_DROPBOX": ""}, "KEEPER_DROPBOX is not set"),
        ({"KEEPER_REPORTS": "/nonexistent/reports"}, "KEEPER_REPORTS must be a folder"),
        ({"KEEPER_DROPBOX": "/dev/shm"}, "not its mount point"),  # its quarantine could not be beside it
        ({"KEEPER_KEY_FILE": ""}, "KEEPER_KEY_FILE is not set"),
        ({"KEEPER_KEY_FILE": "/nonexistent/key"}, "KEEPER_KEY_FILE cannot be opened"),
    ],
)
def test_bad_configuration_refuses_to_start(tmp_path: Path, env: dict[str, str], expected: str) -> None:
    keeper = start_keeper(tmp_path, env=env)
    try:
        assert keeper.proc.wait(timeout=30) == 2
    finally:
        keeper.stop()
    text = keeper.log.read_text()
    assert expected in text and "Traceback" not in text


@pytest.mark.parametrize("mode", [0o755, 0o1777, 0o733])
def test_a_drop_box_the_server_could_list_or_empty_refuses_to_start(tmp_path: Path, mode: int) -> None:
    (tmp_path / "box").mkdir()
    (tmp_path / "box").chmod(mode)
    keeper = start_keeper(tmp_path, env={"KEEPER_DROPBOX": str(tmp_path / "box")})
    try:
        assert keeper.proc.wait(timeout=30) == 2
    finally:
        keeper.stop()
    text = keeper.log.read_text()
    assert "own folder with mode 1733" in text and "Traceback" not in text


def test_the_keeper_waits_for_its_drop_box_made_by_the_start_hook(tmp_path: Path) -> None:
    """In the Pod the keeper's postStart hook makes the drop-box while the keeper starts."""
    box = tmp_path / "late"
    keeper = start_keeper(tmp_path, env={"KEEPER_DROPBOX": str(box)})
    try:
        # It has looked, found no drop-box, and waits (the race with the hook is entered).
        waiting = "docbroker keeper: waiting for KEEPER_DROPBOX"
        wait_for(lambda: waiting in keeper.log.read_text() or keeper.proc.poll() is not None, timeout=30)
        assert waiting in keeper.log.read_text()
        assert keeper.proc.poll() is None  # still waiting, not refused
        box.mkdir()
        box.chmod(0o1733)
        wait_serving(keeper)
    finally:
        keeper.stop()


def test_a_weak_key_refuses_to_start(tmp_path: Path) -> None:
    keeper = start_keeper(tmp_path, key="short")
    try:
        assert keeper.proc.wait(timeout=30) == 2
    finally:
        keeper.stop()
    assert "weak secret" in keeper.log.read_text()


def test_a_save_holds_the_keepers_turn_and_only_its_own_id_works_within_it(keeper: Keeper) -> None:
    status, begun = keeper.post("/v1/turn", {"reason": "dropbox_before_save", "seconds": "60"})
    assert status == 200 and set(begun) == {"turn", "quarantined", "stuck"}
    turn = begun["turn"]
    keeper.drop("q3.md", APPROVED)
    forged = "0" * 32
    assert keeper.post("/v1/accept", {"name": "q3.md", "sha256": SHA, "turn": forged}) == (
        409, {"error": "turn_over"},
    )  # fmt: skip
    assert keeper.post("/v1/sweep", {"reason": "dropbox_after_save", "turn": forged})[0] == 409
    assert (keeper.dropbox / "q3.md").exists()  # neither took the file in flight
    within = {"name": "q3.md", "sha256": SHA, "turn": turn}
    assert keeper.post("/v1/accept", within) == (200, {"accepted": "ok"})
    assert keeper.post("/v1/sweep", {"reason": "dropbox_after_save", "turn": turn}) == (
        200, {"quarantined": 0, "stuck": 0},
    )  # fmt: skip
    # ended: the id is spent, and the files are free for anyone again
    assert keeper.post("/v1/accept", {"name": "q3.md", "sha256": SHA, "turn": turn})[0] == 409
    assert keeper.post("/v1/sweep", {"reason": "dropbox_at_startup"}) == (200, {"quarantined": 0, "stuck": 0})


@pytest.mark.parametrize("seconds", ["0", "901", "-1", "1.5", "", "٣"])
def test_a_turns_lease_is_bounded(keeper: Keeper, seconds: str) -> None:
    body = {"reason": "dropbox_before_save", "seconds": seconds}
    assert keeper.post("/v1/turn", body) == (400, {"error": "invalid_seconds"})


def test_a_turn_whose_broker_died_is_free_again_after_its_lease(keeper: Keeper) -> None:
    status, begun = keeper.post("/v1/turn", {"reason": "dropbox_before_save", "seconds": "1"})
    assert status == 200
    keeper.drop("left.md", b"a dead broker's save")
    started = time.monotonic()
    status, again = keeper.post("/v1/turn", {"reason": "dropbox_before_save", "seconds": "60"})
    assert status == 200 and 0.8 < time.monotonic() - started < 10
    assert again["quarantined"] == 1  # what the dead save left is swept by the next one
    assert keeper.post("/v1/accept", {"name": "left.md", "sha256": SHA, "turn": begun["turn"]})[0] == 409
    keeper.post("/v1/sweep", {"reason": "dropbox_after_save", "turn": again["turn"]})


def test_a_turn_id_of_other_characters_is_a_turn_over_not_an_error(keeper: Keeper) -> None:
    status, begun = keeper.post("/v1/turn", {"reason": "dropbox_before_save", "seconds": "60"})
    assert status == 200
    keeper.drop("q3.md", APPROVED)
    for forged in ("é" * 32, "\ud800"):  # compare_digest refuses non-ASCII str with a TypeError
        assert keeper.post("/v1/accept", {"name": "q3.md", "sha256": SHA, "turn": forged}) == (
            409, {"error": "turn_over"},
        )  # fmt: skip
        assert keeper.post("/v1/sweep", {"reason": "dropbox_after_save", "turn": forged})[0] == 409
    assert keeper.post("/v1/accept", {"name": "q3.md", "sha256": SHA, "turn": begun["turn"]})[1] == {
        "accepted": "ok"
    }
    keeper.post("/v1/sweep", {"reason": "dropbox_after_save", "turn": begun["turn"]})
