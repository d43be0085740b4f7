"""Rotation never replaces a file planted at the rotated name (no-replace rename, one step)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from broker.audit import sink as sink_module
from broker.audit.errors import AuditSinkError
from broker.audit.log import AuditLog
from broker.audit.sink import FileSink, rotated_files
from broker.files import rename_noreplace
from broker.settings import AuditSettings

pytestmark = pytest.mark.anyio


def test_rename_noreplace_refuses_an_existing_target_and_keeps_both(tmp_path: Path) -> None:
    source, target = tmp_path / "audit.jsonl", tmp_path / "audit.jsonl.000001"
    source.write_bytes(b"ours\n")
    target.write_bytes(b"planted\n")
    with pytest.raises(FileExistsError):
        rename_noreplace(source, target)  # os.rename replaced the planted file silently
    assert source.read_bytes() == b"ours\n"
    assert target.read_bytes() == b"planted\n"


def test_rename_noreplace_renames_when_free(tmp_path: Path) -> None:
    source, target = tmp_path / "a", tmp_path / "b"
    source.write_bytes(b"x")
    rename_noreplace(source, target)
    assert not source.exists() and target.read_bytes() == b"x"


def test_a_file_planted_after_the_listing_is_neither_replaced_nor_taken(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = tmp_path / "audit.jsonl"
    sink = FileSink(log)
    sink.open()
    sink.write(b'{"event":"one"}\n')
    planted: list[Path] = []

    def listing_then_planting(path: Path) -> list[Path]:
        # The race: between the listing that picks the next free index and the rename, a
        # file appears at exactly that index.
        found = rotated_files(path)
        victim = path.with_name(f"{path.name}.{len(found) + 1:06d}")
        victim.write_bytes(b"planted\n")
        planted.append(victim)
        return found

    monkeypatch.setattr(sink_module, "rotated_files", listing_then_planting)
    with pytest.raises(FileExistsError):
        sink.rotate()
    assert planted, "the race was not entered"
    assert planted[0].read_bytes() == b"planted\n"
    assert log.read_bytes() == b'{"event":"one"}\n'  # our log kept its name and its lines
    sink.close()


@pytest.mark.timeout(20)  # before: open() of the FIFO blocked start-up for good
async def test_a_fifo_planted_under_a_rotated_name_refuses_start_up_at_once(tmp_path: Path) -> None:
    log = tmp_path / "audit.jsonl"
    log.touch(mode=0o600)  # fresh after a rotation: the chain goes on from the rotated file
    os.mkfifo(tmp_path / "audit.jsonl.000001", 0o600)
    settings = AuditSettings(path=log, key_file=tmp_path / "audit.key", witness_file=None)
    with pytest.raises(AuditSinkError):
        await AuditLog.open(settings)
