"""What an image holds, read from the image itself: its content digest and its packages.

    scan = scan_image(client, "docbroker-server:latest", progress=print)
    scan.image_id         # "sha256:…": the Docker image id (the provenance's subject)
    scan.content_digest   # "sha256:…": the file tree and run config, without timestamps
    scan.python, scan.debian

Why a content digest: Docker 20.10's classic builder stamps every file a `RUN` step writes
with the build's time, and `COPY --from` keeps those times, so two builds of the same inputs
give different layer digests and image ids (measured: docs/supply-chain.md). The content
digest is taken over what a container sees — for every path, sorted: type, mode, uid, gid,
size, sha256 of the content, link target; never mtimes or user names — plus the run config
(entrypoint, env, user, ...). Two builds of the same inputs share it; any changed byte,
mode or owner changes it.

How: the image is created as a container that never starts (`docker create`; no process, no
network) and its merged file tree streamed out with `docker export`: one pass that hashes
every file and keeps the few small files the SBOM is made from (each distribution's
`site-packages/*.dist-info/METADATA` and `RECORD`, `var/lib/dpkg/status`, `os-release`). The entries the
engine itself adds to every container (`.dockerenv`, `/etc/hosts`, `/etc/hostname`,
`/etc/resolv.conf`, `/dev`) are left out: they are the engine's, not the image's.
"""

from __future__ import annotations

import email.parser
import hashlib
import io
import json
import re
import tarfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Final

Progress = Callable[[str], None]

CONTENT_VERSION: Final = b"docbroker-content-v1\n"
# Added by the engine to every container at create time (its "init layer"), not the image's.
ENGINE_ENTRIES: Final = frozenset({".dockerenv", "etc/hostname", "etc/hosts", "etc/resolv.conf", "etc/mtab"})
# The run config fields that change what a container of the image does.
CONFIG_FIELDS: Final = ("Entrypoint", "Cmd", "Env", "User", "WorkingDir", "ExposedPorts", "Volumes",
                        "Labels", "StopSignal")  # fmt: skip
DPKG_STATUS: Final = "var/lib/dpkg/status"
OS_RELEASE: Final = ("usr/lib/os-release", "etc/os-release")
# Installed by pip (site-packages). Debian's own Python modules (dist-packages) are Debian
# packages, named by dpkg's status; their .dist-info often has no RECORD.
_DIST_INFO = re.compile(r"(?:.*/)?site-packages/[^/]+\.dist-info/(METADATA|RECORD)")
_KEPT_LIMIT: Final = 16 * 1024 * 1024  # a METADATA, a RECORD or the dpkg status above it: refused
_KEPT_TOTAL: Final = 256 * 1024 * 1024  # all of them together (an image of a million dist-infos)
_CHUNK: Final = 1024 * 1024


class ScanError(Exception):
    """The image cannot be read: missing, the daemon failed, or its tree is not what Docker writes."""


@dataclass(frozen=True)
class PythonDist:
    """One installed Python distribution, as its `.dist-info` says."""

    name: str
    version: str
    record_sha256: str  # hex of its RECORD: the hash of every file the installer wrote
    dist_info: str  # the .dist-info folder's path in the image


@dataclass(frozen=True)
class DebPackage:
    name: str
    version: str
    architecture: str


@dataclass(frozen=True)
class ImageScan:
    image_id: str
    content_digest: str
    entries: int
    python: tuple[PythonDist, ...]
    debian: tuple[DebPackage, ...]  # empty when the image keeps no dpkg status
    os_id: str  # os-release ID and VERSION_ID ("debian", "12"); "" when absent
    os_version: str
    listing: tuple[bytes, ...] = ()  # with `listing=True`: the digest's lines, sorted (to compare two builds)


def resolve_image(client: Any, image: str) -> tuple[str, dict[str, Any]]:
    """The image's id ("sha256:…") and its attributes, or ScanError."""
    import docker.errors

    try:
        found = client.images.get(image)
    except docker.errors.ImageNotFound:
        raise ScanError("the image is not in the daemon's store") from None
    except docker.errors.DockerException as exc:
        raise ScanError(f"the daemon did not answer about the image ({exc.__class__.__name__})") from None
    return str(found.id), dict(found.attrs)


def scan_image(client: Any, image: str, progress: Progress, *, listing: bool = False) -> ImageScan:
    """Read the image's whole file tree once (see the module's docstring)."""
    import docker.errors

    image_id, attrs = resolve_image(client, image)
    try:
        # By id, not by tag: what is read is the image resolved above even if the tag moves now.
        # Never started: the entrypoint only satisfies `create` for an image that names none.
        container = client.api.create_container(image_id, network_disabled=True, entrypoint=["/"])
    except docker.errors.DockerException as exc:
        raise ScanError(f"cannot create a container of the image ({exc.__class__.__name__})") from None
    try:
        stream = client.api.export(container["Id"], chunk_size=_CHUNK)
        return _scan_tree(
            image_id, attrs.get("Config") or {}, _ChunkReader(stream), progress, listing=listing
        )
    except docker.errors.DockerException as exc:
        raise ScanError(f"exporting the image's file tree failed ({exc.__class__.__name__})") from None
    finally:
        try:
            client.api.remove_container(container["Id"], force=True)
        except docker.errors.DockerException:
            pass  # never started, so nothing runs; a leftover created container is harmless


def content_digest_of_config(config: dict[str, Any]) -> bytes:
    """The line of the run config that the content digest covers."""
    chosen = {name: config.get(name) for name in CONFIG_FIELDS}
    return b"config " + json.dumps(chosen, sort_keys=True, separators=(",", ":")).encode() + b"\n"


def _scan_tree(
    image_id: str, config: dict[str, Any], tree: io.RawIOBase, progress: Progress, *, listing: bool = False
) -> ImageScan:
    lines: dict[str, bytes] = {}
    hashes: dict[str, tuple[str, int]] = {}  # regular files: path → (sha256, size), for hard links
    kept: dict[str, bytes] = {}
    total = kept_bytes = 0
    started = last = time.monotonic()
    progress("image scan: reading the file tree (docker export)")
    try:
        archive = tarfile.open(fileobj=tree, mode="r|", bufsize=_CHUNK)
        for member in archive:
            path = _normal(member.name)
            if path in ENGINE_ENTRIES or path == "dev" or path.startswith("dev/") or path == "":
                continue
            digest, size, link = "", 0, ""
            if member.isreg():
                keep = path == DPKG_STATUS or path in OS_RELEASE or bool(_DIST_INFO.fullmatch(path))
                digest, size, data = _hash_member(archive, member, keep)
                if data is not None:
                    kept[path] = data
                    kept_bytes += len(data)
                    if kept_bytes > _KEPT_TOTAL:
                        raise ScanError("the image's package metadata files are too large together")
                hashes[path] = (digest, size)
                kind = "file"
                total += size
            elif member.islnk():
                # A hard link is the file it links to: recorded as that file, so which of two
                # linked paths the export walks first cannot change the digest.
                target = _normal(member.linkname)
                if target not in hashes:
                    raise ScanError("the image's file tree has a hard link to a file not seen before it")
                digest, size = hashes[target]
                hashes[path] = (digest, size)
                kind = "file"
            elif member.issym():
                kind, link = "symlink", member.linkname
            elif member.isdir():
                kind = "dir"
            elif member.ischr() or member.isblk():
                kind, link = ("char" if member.ischr() else "block"), f"{member.devmajor}:{member.devminor}"
            elif member.isfifo():
                kind = "fifo"
            else:
                raise ScanError("the image's file tree has an entry of an unknown type")
            record = [path, kind, member.mode & 0o7777, member.uid, member.gid, size, digest, link]
            lines[path] = json.dumps(record, separators=(",", ":")).encode() + b"\n"
            now = time.monotonic()
            if now - last >= 2:
                last = now
                progress(f"image scan: {len(lines)} entries, {total / 1e6:.0f} MB hashed")
    except tarfile.TarError:
        raise ScanError("the image's file tree is not a readable tar stream") from None
    content = hashlib.sha256(CONTENT_VERSION)
    ordered = [content_digest_of_config(config), *(lines[path] for path in sorted(lines))]
    for line in ordered:
        content.update(line)
    os_id, os_version = _os_release(kept)
    scan = ImageScan(
        image_id=image_id,
        content_digest=f"sha256:{content.hexdigest()}",
        entries=len(lines),
        python=_python_dists(kept, hashes),
        debian=_debian_packages(kept.get(DPKG_STATUS, b"")),
        os_id=os_id,
        os_version=os_version,
        listing=tuple(ordered) if listing else (),
    )
    progress(
        f"image scan: {scan.entries} entries, {total / 1e6:.0f} MB in {time.monotonic() - started:.1f} s; "
        f"{len(scan.python)} Python distributions, {len(scan.debian)} Debian packages"
    )
    return scan


def _hash_member(
    archive: tarfile.TarFile, member: tarfile.TarInfo, keep: bool
) -> tuple[str, int, bytes | None]:
    source = archive.extractfile(member)
    if source is None:
        raise ScanError("the image's file tree has a file without content")
    digest = hashlib.sha256()
    kept = bytearray() if keep else None
    size = 0
    while chunk := source.read(_CHUNK):
        digest.update(chunk)
        size += len(chunk)
        if kept is not None:
            if len(kept) + len(chunk) > _KEPT_LIMIT:
                raise ScanError("a package metadata file in the image is too large")
            kept += chunk
    return digest.hexdigest(), size, None if kept is None else bytes(kept)


def _normal(name: str) -> str:
    return name.removeprefix("./").strip("/")


def _python_dists(kept: dict[str, bytes], hashes: dict[str, tuple[str, int]]) -> tuple[PythonDist, ...]:
    dists = []
    for path, data in kept.items():
        if not path.endswith(".dist-info/METADATA"):
            continue
        folder = path.removesuffix("/METADATA")
        headers = email.parser.BytesHeaderParser().parsebytes(data)
        name, version = headers.get("Name"), headers.get("Version")
        record = hashes.get(f"{folder}/RECORD")
        if not name or not version or record is None:
            raise ScanError("a Python distribution in the image has no name, version or RECORD")
        dists.append(PythonDist(str(name).strip(), str(version).strip(), record[0], folder))
    return tuple(sorted(dists, key=lambda d: (canonical_name(d.name), d.version, d.dist_info)))


def canonical_name(name: str) -> str:
    """PEP 503: the name pip and the index compare."""
    return re.sub(r"[-_.]+", "-", name).lower()


def _debian_packages(status: bytes) -> tuple[DebPackage, ...]:
    packages = []
    for paragraph in status.decode("utf-8", "replace").split("\n\n"):
        fields: dict[str, str] = {}
        for line in paragraph.splitlines():
            if line[:1] in (" ", "\t") or ":" not in line:
                continue  # a continuation line (descriptions, conffiles)
            key, _, value = line.partition(":")
            fields[key.strip()] = value.strip()
        if fields.get("Package") and fields.get("Status", "").endswith(" installed"):
            packages.append(
                DebPackage(fields["Package"], fields.get("Version", ""), fields.get("Architecture", ""))
            )
    return tuple(sorted(packages, key=lambda p: (p.name, p.architecture)))


def _os_release(kept: dict[str, bytes]) -> tuple[str, str]:
    data = next((kept[p] for p in OS_RELEASE if p in kept), b"")
    values = {}
    for line in data.decode("utf-8", "replace").splitlines():
        key, sep, value = line.partition("=")
        if sep:
            values[key.strip()] = value.strip().strip('"')
    return values.get("ID", ""), values.get("VERSION_ID", "")


class _ChunkReader(io.RawIOBase):
    """The export's chunk generator as a file object that tarfile can stream from."""

    def __init__(self, chunks: Iterator[bytes]) -> None:
        self._chunks = chunks
        self._buffer = memoryview(b"")

    def readable(self) -> bool:
        return True

    def readinto(self, target: Any) -> int:
        while not self._buffer:
            try:
                self._buffer = memoryview(next(self._chunks))
            except StopIteration:
                return 0
        size = min(len(target), len(self._buffer))
        target[:size] = self._buffer[:size]
        self._buffer = self._buffer[size:]
        return size
