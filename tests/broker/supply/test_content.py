"""The content digest of a file tree (broker/supply/content.py) on real tar streams, as
`docker export` writes them: what must change it, and what must not (timestamps, order)."""

from __future__ import annotations

import io
import tarfile
from collections.abc import Iterator
from typing import Any

import pytest

from broker.supply.content import ImageScan, ScanError, _ChunkReader, _scan_tree

CONFIG = {"Entrypoint": ["/opt/venv/bin/python"], "User": "10001:10001", "Env": ["PATH=/usr/bin"]}
METADATA = b"Metadata-Version: 2.1\nName: Demo_Pkg\nVersion: 1.2.3\n\nlong description: Version: 9\n"
STATUS = (
    b"Package: libc6\nStatus: install ok installed\nArchitecture: amd64\nVersion: 2.36-9\n"
    b"Description: the C library\n continued: Version: 0\n\n"
    b"Package: gone\nStatus: deinstall ok config-files\nArchitecture: amd64\nVersion: 1\n"
)
Entry = tuple[str, str, bytes | str, dict[str, Any]]


def tree(
    changes: dict[str, Any] | None = None, *, order: list[str] | None = None, mtime: int = 1_700_000_000
) -> list[Entry]:
    """The test image's tree; `changes`: path → new content, or "path:attrs" → tar attributes."""
    changes = changes or {}
    site = "opt/venv/lib/python3.11/site-packages"
    entries: list[Entry] = [
        ("opt", "dir", b"", {}),
        ("opt/venv", "dir", b"", {}),
        (f"{site}/demo/__init__.py", "file", b"print('hi')\n", {}),
        (f"{site}/demo/data.bin", "link", f"{site}/demo/__init__.py", {}),
        (f"{site}/Demo_Pkg-1.2.3.dist-info/METADATA", "file", METADATA, {}),
        (f"{site}/Demo_Pkg-1.2.3.dist-info/RECORD", "file", b"demo/__init__.py,sha256=x,12\n", {}),
        # Debian's own module: a Debian package (dpkg's status), not a pip distribution
        (
            "usr/lib/python3/dist-packages/debmod-1.0.dist-info/METADATA",
            "file",
            b"Name: debmod\nVersion: 1\n",
            {},
        ),
        ("var/lib/dpkg/status", "file", STATUS, {}),
        ("usr/lib/os-release", "file", b'ID=debian\nVERSION_ID="12"\n', {}),
        ("etc/os-release", "symlink", "../usr/lib/os-release", {}),
        ("bin", "symlink", "usr/bin", {}),
        # the engine's own entries: never the image's content
        (".dockerenv", "file", b"", {"mtime": mtime}),
        ("etc/hostname", "file", b"", {}),
        ("dev", "dir", b"", {}),
        ("dev/console", "file", b"", {}),
    ]
    entries = [(p, k, changes.get(p, d), {**o, **changes.get(f"{p}:attrs", {})}) for p, k, d, o in entries]
    if order:
        entries.sort(key=lambda e: order.index(e[0]) if e[0] in order else -1)
    return [(p, k, d, {"mtime": mtime, **o}) for p, k, d, o in entries]


def export(entries: list[Entry]) -> Iterator[bytes]:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.GNU_FORMAT) as archive:
        for path, kind, data, attrs in entries:
            info = tarfile.TarInfo(path)
            info.mode, info.uid, info.gid = attrs.get("mode", 0o755), attrs.get("uid", 0), attrs.get("gid", 0)
            info.mtime = attrs["mtime"]
            info.uname = attrs.get("uname", "root")
            if kind == "dir":
                info.type = tarfile.DIRTYPE
                archive.addfile(info)
            elif kind in ("symlink", "link"):
                info.type = tarfile.SYMTYPE if kind == "symlink" else tarfile.LNKTYPE
                info.linkname = str(data)
                archive.addfile(info)
            else:
                assert isinstance(data, bytes)
                info.size = len(data)
                archive.addfile(info, io.BytesIO(data))
    raw = buffer.getvalue()
    # in uneven chunks, as the daemon's HTTP stream delivers it
    return iter([raw[i : i + 7919] for i in range(0, len(raw), 7919)])


def scan(entries: list[Entry], config: dict[str, Any] = CONFIG) -> ImageScan:
    return _scan_tree("sha256:" + "0" * 64, config, _ChunkReader(export(entries)), lambda _line: None)


def test_the_packages_are_read_from_the_tree() -> None:
    result = scan(tree())
    (dist,) = result.python
    assert (dist.name, dist.version) == ("Demo_Pkg", "1.2.3")  # the header, not the description
    assert dist.dist_info.endswith("Demo_Pkg-1.2.3.dist-info")
    assert [(p.name, p.version, p.architecture) for p in result.debian] == [("libc6", "2.36-9", "amd64")]
    assert (result.os_id, result.os_version) == ("debian", "12")


def test_timestamps_owner_names_and_order_do_not_change_the_digest() -> None:
    reference = scan(tree()).content_digest
    assert scan(tree(mtime=1_800_000_000)).content_digest == reference
    site = "opt/venv/lib/python3.11/site-packages"
    later = tree(order=["bin", "opt/venv", "opt", f"{site}/Demo_Pkg-1.2.3.dist-info/RECORD"])
    assert scan(later).content_digest == reference
    assert scan(tree({"bin:attrs": {"uname": "someone"}})).content_digest == reference
    # the engine's own entries are not the image's
    engine: dict[str, Any] = {".dockerenv": b"x", "dev/console": b"y"}
    assert scan(tree(engine)).content_digest == reference


@pytest.mark.parametrize(
    "change",
    [
        {"opt/venv/lib/python3.11/site-packages/demo/__init__.py": b"print('pwned')\n"},
        {"opt/venv/lib/python3.11/site-packages/demo/__init__.py:attrs": {"mode": 0o4755}},
        {"opt/venv/lib/python3.11/site-packages/demo/__init__.py:attrs": {"uid": 10001}},
        {"opt/venv/lib/python3.11/site-packages/demo/__init__.py:attrs": {"gid": 10001}},
        {"bin": "/tmp/bin"},
        {"opt:attrs": {"mode": 0o777}},
    ],
    ids=["content", "mode", "uid", "gid", "link target", "directory mode"],
)
def test_any_change_of_content_or_metadata_changes_the_digest(change: dict[str, Any]) -> None:
    assert scan(tree(change)).content_digest != scan(tree()).content_digest


def test_the_run_config_is_part_of_the_content() -> None:
    other = {**CONFIG, "User": "0:0"}
    assert scan(tree(), other).content_digest != scan(tree()).content_digest
    assert scan(tree(), {**CONFIG, "Created": "now"}).content_digest == scan(tree()).content_digest


def test_a_hard_link_is_the_file_it_names() -> None:
    # The hard link `data.bin` carries the linked file's content: changing that file changes it.
    site = "opt/venv/lib/python3.11/site-packages"
    changed = scan(tree({f"{site}/demo/__init__.py": b"other"}))
    assert changed.content_digest != scan(tree()).content_digest
    orphan = [e for e in tree() if not e[0].endswith("demo/__init__.py")]
    with pytest.raises(ScanError, match="hard link to a file not seen before it"):
        scan(orphan)


def test_a_distribution_without_a_record_is_refused() -> None:
    entries = [e for e in tree() if not e[0].endswith("RECORD")]
    with pytest.raises(ScanError, match="no name, version or RECORD"):
        scan(entries)


def test_garbage_instead_of_a_tar_stream_is_one_clear_error() -> None:
    with pytest.raises(ScanError, match="not a readable tar stream"):
        _scan_tree("sha256:" + "0" * 64, CONFIG, _ChunkReader(iter([b"\x00garbage" * 100])), lambda _l: None)
