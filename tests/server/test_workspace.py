"""server/workspace.py: the only file-system code, checked against real files of every kind."""

from __future__ import annotations

import errno
import os
import socket
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from server import workspace as ws
from server.workspace import ReadFailure, ReadOk, Workspace, WorkspaceError, WriteOutcome

LIMIT = 24_000


@pytest.fixture
def workspace(docs_root: Path) -> Iterator[Workspace]:
    opened = Workspace(docs_root)
    yield opened
    opened.close()


# --- reading sources ----------------------------------------------------------------------


def test_reads_a_regular_utf8_file(workspace: Workspace, sources: Path) -> None:
    (sources / "notes.md").write_text("Grüße \u2013 ok\n", encoding="utf-8")
    assert workspace.read_source("notes.md", LIMIT) == ReadOk("Grüße \u2013 ok\n")


def test_missing_file_is_not_found(workspace: Workspace) -> None:
    assert workspace.read_source("absent.md", LIMIT) is ReadFailure.NOT_FOUND


def test_size_limit_is_inclusive(workspace: Workspace, sources: Path) -> None:
    (sources / "fits.md").write_bytes(b"a" * 24_000)
    (sources / "over.md").write_bytes(b"a" * 24_001)
    assert workspace.read_source("fits.md", LIMIT) == ReadOk("a" * 24_000)
    assert workspace.read_source("over.md", LIMIT) is ReadFailure.TOO_LARGE


def test_non_utf8_content_is_refused(workspace: Workspace, sources: Path) -> None:
    (sources / "latin1.md").write_bytes("caf\u00e9".encode("latin-1"))
    (sources / "cut.md").write_bytes("\u20ac".encode()[:2])  # a multi-byte sequence cut short
    assert workspace.read_source("latin1.md", LIMIT) is ReadFailure.NOT_UTF8
    assert workspace.read_source("cut.md", LIMIT) is ReadFailure.NOT_UTF8


@pytest.mark.parametrize(
    "name",
    ["../outside.md", "..", "/etc/passwd", "/abs.md", "sub/inner.md", "a\x00.md", "a" * 65 + ".md", "x.txt"],
)
def test_names_outside_the_pattern_are_never_opened(
    workspace: Workspace, docs_root: Path, sources: Path, name: str
) -> None:
    (docs_root / "outside.md").write_text("secret")
    (sources / "sub").mkdir()
    (sources / "sub" / "inner.md").write_text("secret")
    (sources / "x.txt").write_text("secret")
    assert workspace.read_source(name, LIMIT) is ReadFailure.NOT_FOUND


def test_final_symlink_is_refused_even_to_a_file_inside(
    workspace: Workspace, sources: Path, outside: Path
) -> None:
    (outside / "secret.md").write_text("secret")
    (sources / "real.md").write_text("inside")
    (sources / "escape.md").symlink_to(outside / "secret.md")
    (sources / "alias.md").symlink_to("real.md")
    (sources / "dangling.md").symlink_to(outside / "nothing.md")
    assert workspace.read_source("escape.md", LIMIT) is ReadFailure.NOT_REGULAR
    assert workspace.read_source("alias.md", LIMIT) is ReadFailure.NOT_REGULAR
    assert workspace.read_source("dangling.md", LIMIT) is ReadFailure.NOT_REGULAR


def test_file_swapped_for_a_symlink_between_two_calls(
    workspace: Workspace, sources: Path, outside: Path
) -> None:
    (outside / "secret.md").write_text("secret")
    (sources / "doc.md").write_text("first")
    assert workspace.read_source("doc.md", LIMIT) == ReadOk("first")
    (sources / "tmp-link").symlink_to(outside / "secret.md")
    os.replace(sources / "tmp-link", sources / "doc.md")
    assert workspace.read_source("doc.md", LIMIT) is ReadFailure.NOT_REGULAR


def test_hard_link_to_an_outside_file_is_refused(workspace: Workspace, sources: Path, outside: Path) -> None:
    (outside / "secret.md").write_text("secret")
    os.link(outside / "secret.md", sources / "linked.md")
    assert os.stat(sources / "linked.md").st_nlink == 2
    assert workspace.read_source("linked.md", LIMIT) is ReadFailure.NOT_REGULAR


@pytest.mark.timeout(10)
def test_fifo_is_refused_without_blocking(workspace: Workspace, sources: Path) -> None:
    # No writer ever opens this FIFO: a blocking open or read would hang here.
    os.mkfifo(sources / "pipe.md")
    assert workspace.read_source("pipe.md", LIMIT) is ReadFailure.NOT_REGULAR


def test_directory_and_socket_are_refused(workspace: Workspace, sources: Path) -> None:
    (sources / "folder.md").mkdir()
    with socket.socket(socket.AF_UNIX) as sock:
        sock.bind(str(sources / "sock.md"))
        assert workspace.read_source("folder.md", LIMIT) is ReadFailure.NOT_REGULAR
        assert workspace.read_source("sock.md", LIMIT) in (ReadFailure.NOT_REGULAR, ReadFailure.IO_ERROR)


# Creating a device node needs CAP_MKNOD: the case is only collected where it can be built.
DEVICE_CASES = ["char"] if os.geteuid() == 0 else []


@pytest.mark.timeout(10)
@pytest.mark.parametrize("kind", DEVICE_CASES)
def test_device_is_refused(workspace: Workspace, sources: Path, kind: str) -> None:
    null = os.stat("/dev/null")  # a harmless char device: same major/minor under another name
    os.mknod(sources / "dev.md", stat.S_IFCHR | 0o600, null.st_rdev)
    assert workspace.read_source("dev.md", LIMIT) is ReadFailure.NOT_REGULAR


def test_sources_are_held_open_not_looked_up_again(
    workspace: Workspace, docs_root: Path, sources: Path, outside: Path
) -> None:
    """Replacing the folder after start-up (e.g. by a symlink) changes nothing the server sees."""
    (sources / "mine.md").write_text("mine")
    (outside / "theirs.md").write_text("theirs")
    os.rename(sources, docs_root / "moved")
    (docs_root / "sources").symlink_to(outside)
    assert workspace.read_source("theirs.md", LIMIT) is ReadFailure.NOT_FOUND
    assert workspace.read_source("mine.md", LIMIT) == ReadOk("mine")


# --- opening the workspace -------------------------------------------------------------------


def test_symlinked_sources_folder_fails_at_start(tmp_path: Path, outside: Path) -> None:
    root = tmp_path / "root"
    root.mkdir()
    (root / "sources").symlink_to(outside)
    (root / "reports").mkdir()
    with pytest.raises(WorkspaceError):
        Workspace(root)


def test_symlinked_reports_folder_fails_at_start(tmp_path: Path, outside: Path) -> None:
    root = tmp_path / "root"
    root.mkdir()
    (root / "sources").mkdir()
    (root / "reports").symlink_to(outside)
    with pytest.raises(WorkspaceError):
        Workspace(root)


@pytest.mark.parametrize("missing", ["sources", "reports"])
def test_missing_folder_fails_at_start(docs_root: Path, missing: str) -> None:
    (docs_root / missing).rmdir()
    with pytest.raises(WorkspaceError):
        Workspace(docs_root)


def test_open_beneath_refuses_escapes_in_the_kernel(sources: Path, docs_root: Path) -> None:
    """Defence in depth under the filename check: openat2(RESOLVE_BENEATH|RESOLVE_NO_SYMLINKS)."""
    (docs_root / "outside.md").write_text("secret")
    (sources / "link.md").symlink_to(docs_root / "outside.md")
    fd = os.open(sources, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for name in ("../outside.md", str(docs_root / "outside.md"), "link.md"):
            with pytest.raises(OSError):
                os.close(ws.open_beneath(fd, name, os.O_RDONLY | os.O_NOFOLLOW))
    finally:
        os.close(fd)


def test_open_beneath_refuses_an_embedded_nul(sources: Path) -> None:
    # Passed to C as is, "a\0.md" would be cut short and open "a".
    (sources / "a").write_text("other file")
    fd = os.open(sources, os.O_RDONLY | os.O_DIRECTORY)
    try:
        with pytest.raises(ValueError):
            os.close(ws.open_beneath(fd, "a\x00.md", os.O_RDONLY | os.O_NOFOLLOW))
    finally:
        os.close(fd)


# --- listing sources ---------------------------------------------------------------------------


def test_source_names_lists_every_entry_up_to_the_limit(workspace: Workspace, sources: Path) -> None:
    for i in range(10):
        (sources / f"f{i}.md").write_text("x")
    (sources / "not valid.txt").write_text("x")
    (sources / "sub").mkdir()
    assert set(workspace.source_names(100)) == {f"f{i}.md" for i in range(10)} | {"not valid.txt", "sub"}
    assert len(list(workspace.source_names(4))) == 4


def test_source_names_is_not_recursive(workspace: Workspace, sources: Path) -> None:
    (sources / "sub").mkdir()
    (sources / "sub" / "deep.md").write_text("x")
    assert list(workspace.source_names(100)) == ["sub"]


# --- creating reports ------------------------------------------------------------------------


def test_create_writes_exact_bytes_with_no_owner_read_bit(workspace: Workspace, reports: Path) -> None:
    data = "line 1\r\nGrüße \U0001f600\n\x00tail".encode()
    assert workspace.create_report("r.md", data) is WriteOutcome.CREATED
    assert (reports / "r.md").read_bytes() == data  # the test runs as root, or reads through DAC
    # The owner (the sandbox's uid) can never read it back, and nobody else has any access.
    # Group bits are left to the deployment (a drop-box may grant the broker's group read).
    mode = stat.S_IMODE(os.stat(reports / "r.md").st_mode)
    assert mode & stat.S_IRUSR == 0
    assert mode & stat.S_IRWXO == 0


def test_create_never_overwrites(workspace: Workspace, reports: Path) -> None:
    (reports / "r.md").write_bytes(b"original")
    assert workspace.create_report("r.md", b"replacement") is WriteOutcome.EXISTS
    assert (reports / "r.md").read_bytes() == b"original"


def test_create_does_not_follow_a_planted_symlink(workspace: Workspace, reports: Path, outside: Path) -> None:
    (outside / "victim.md").write_bytes(b"victim")
    (reports / "r.md").symlink_to(outside / "victim.md")
    (reports / "d.md").symlink_to(outside / "absent.md")  # dangling: O_CREAT would follow it
    assert workspace.create_report("r.md", b"evil") is WriteOutcome.EXISTS
    assert workspace.create_report("d.md", b"evil") is WriteOutcome.EXISTS
    assert (outside / "victim.md").read_bytes() == b"victim"
    assert not (outside / "absent.md").exists()


@pytest.mark.parametrize("name", ["../escape.md", "/tmp/escape.md", "sub/x.md", "x.txt", "a\x00.md", ""])
def test_create_refuses_names_outside_the_pattern(workspace: Workspace, docs_root: Path, name: str) -> None:
    assert workspace.create_report(name, b"x") is WriteOutcome.NOT_CREATED
    assert not (docs_root / "escape.md").exists()


def test_reports_are_held_open_not_looked_up_again(
    workspace: Workspace, docs_root: Path, reports: Path, outside: Path
) -> None:
    os.rename(reports, docs_root / "moved")
    (docs_root / "reports").symlink_to(outside)
    assert workspace.create_report("r.md", b"data") is WriteOutcome.CREATED
    assert (docs_root / "moved" / "r.md").read_bytes() == b"data"
    assert list(outside.iterdir()) == []


def test_create_failure_before_the_file_exists_is_not_created(workspace: Workspace, docs_root: Path) -> None:
    # The held folder is gone: the create itself fails, so nothing can exist.
    (docs_root / "reports").rmdir()
    assert workspace.create_report("r.md", b"data") is WriteOutcome.NOT_CREATED


def test_failure_after_the_create_is_unknown(
    workspace: Workspace, reports: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Narrow fault injection: fsync fails once the file has been created and written."""

    def failing_fsync(fd: int) -> None:
        raise OSError(errno.EIO, "injected")

    monkeypatch.setattr(ws.os, "fsync", failing_fsync)
    assert workspace.create_report("r.md", b"data") is WriteOutcome.UNKNOWN
    assert (reports / "r.md").exists()  # which is exactly why the outcome is unknown, not failed
