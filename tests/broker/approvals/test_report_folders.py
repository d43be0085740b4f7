"""A symlink put in place of the drop-box, the reports store or the quarantine redirects nothing.

The accept, the sweep and the quarantine open every folder the same way (O_NOFOLLOW): whoever
can swap a folder for a link must not get an approved report read from, written to, or swept
into a folder of their choosing (another tenant's, say).
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from broker.approvals.reports import Accepted, ReportFiles

REPORT = b"# Q3\napproved words\n"
SHA = hashlib.sha256(REPORT).hexdigest()


@pytest.fixture
def tenant(tmp_path: Path) -> Path:
    for folder in ("dropbox", "reports", "quarantine", "elsewhere"):
        (tmp_path / folder).mkdir()
    return tmp_path


def _files(
    root: Path, dropbox: str = "dropbox", reports: str = "reports", quarantine: str = "quarantine"
) -> ReportFiles:
    return ReportFiles(root / dropbox, root / reports, root / quarantine)


def test_the_plain_layout_accepts(tenant: Path) -> None:
    (tenant / "dropbox" / "q3.md").write_bytes(REPORT)
    assert _files(tenant).accept("q3.md", SHA) is Accepted.OK
    assert (tenant / "reports" / "q3.md").read_bytes() == REPORT


def test_a_linked_dropbox_is_not_read_through(tenant: Path) -> None:
    # The link points at a folder holding exactly the approved bytes: following it would accept
    # a file that was never dropped by this tenant's sandbox.
    (tenant / "elsewhere" / "q3.md").write_bytes(REPORT)
    (tenant / "dropbox-link").symlink_to(tenant / "elsewhere")
    assert _files(tenant, dropbox="dropbox-link").accept("q3.md", SHA) is Accepted.IO_ERROR
    assert not (tenant / "reports" / "q3.md").exists()
    assert (tenant / "elsewhere" / "q3.md").read_bytes() == REPORT  # not taken either


def test_a_linked_reports_store_is_not_written_through(tenant: Path) -> None:
    (tenant / "dropbox" / "q3.md").write_bytes(REPORT)
    (tenant / "reports-link").symlink_to(tenant / "elsewhere")
    assert _files(tenant, reports="reports-link").accept("q3.md", SHA) is Accepted.IO_ERROR
    assert list((tenant / "elsewhere").iterdir()) == []


def test_a_linked_quarantine_takes_nothing(tenant: Path) -> None:
    (tenant / "dropbox" / "planted.md").write_bytes(b"planted")
    (tenant / "quarantine-link").symlink_to(tenant / "elsewhere")
    swept = _files(tenant, quarantine="quarantine-link").sweep()
    assert (swept.quarantined, swept.stuck) == (0, 1)
    assert list((tenant / "elsewhere").iterdir()) == []
    assert (tenant / "dropbox" / "planted.md").exists()  # reported stuck, never moved to the link


def test_a_linked_dropbox_is_not_swept(tenant: Path) -> None:
    (tenant / "elsewhere" / "other-tenants.md").write_bytes(b"not ours")
    (tenant / "dropbox-link").symlink_to(tenant / "elsewhere")
    swept = _files(tenant, dropbox="dropbox-link").sweep()
    assert swept.stuck == 1
    assert (tenant / "elsewhere" / "other-tenants.md").exists()
    assert list((tenant / "quarantine").iterdir()) == []
