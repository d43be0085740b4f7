"""What `docbroker image build` records about an image it built, and what `image verify` checks.

    recorded = record_image(client, "docbroker-server:latest", key, records_dir, progress)
    verdict = verify_image(client, "docbroker-server:latest", trust_keys, records_dir, progress)

Recording: scan the built image (content digest, packages: broker/supply/content.py), write
its SBOM, then the signed provenance over image id, SBOM digest, lock file digest, source
revision and content digest — both named by the image id in the records folder
(`record_paths`). Verifying: resolve the image to its id, find its records, check the
signature with the trusted keys, that the statement's subject is that id, that the SBOM file
is the one signed, that the image's content digest is the one signed, and that the SBOM
agrees with what the image holds. Any failure is a `VerifyError`, one line.
"""

from __future__ import annotations

import errno
import hashlib
import os
import subprocess
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from broker.files import UnsafeFileError, read_bounded
from broker.images import REPO_ROOT, WHEELHOUSE
from broker.supply.content import ScanError, scan_image
from broker.supply.provenance import (
    MAX_ENVELOPE_BYTES,
    ProvenanceError,
    RecordPaths,
    SigningKey,
    TrustKey,
    record_paths,
    sign_statement,
    verify_envelope,
)
from broker.supply.sbom import MAX_SBOM_BYTES, SbomError, check_sbom, make_sbom, wheel_hashes

Progress = Callable[[str], None]

BUILDER: Final = "docbroker image build"


class RecordError(Exception):
    """The built image cannot be recorded (unreadable image or lock file). One line."""


class VerifyError(Exception):
    """The image is not the one its records describe, or it has none. One line."""


@dataclass(frozen=True)
class Recorded:
    image_digest: str
    content_digest: str
    paths: RecordPaths
    key_id: str  # "": not signed


@dataclass(frozen=True)
class Verdict:
    image_digest: str
    content_digest: str
    key_id: str
    python: int  # distributions the SBOM and the image agree on
    debian: int


def lock_file() -> Path:
    """The file the image's Python dependencies are pinned in, whose digest the provenance
    signs: `uv.lock`, the one source of every hashed export (`./dev lock`)."""
    return REPO_ROOT / "uv.lock"


def source_revision(root: Path = REPO_ROOT) -> str:
    """The git commit of the sources, "-dirty" when the tree has changes; "unknown" outside git."""
    try:
        head = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True,
                              timeout=30, check=True).stdout.strip()  # fmt: skip
        status = subprocess.run(["git", "-C", str(root), "status", "--porcelain"], capture_output=True,
                                text=True, timeout=30, check=True).stdout  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return f"{head}-dirty" if status.strip() else head


def record_image(
    client: Any,
    image: str,
    key: SigningKey | None,
    records_dir: Path,
    progress: Progress,
    *,
    name: str | None = None,
    lock: Path | None = None,
    revision: str | None = None,
) -> Recorded:
    """Scan `image` (best: the id the build reported), write its SBOM and, with a key, its signed
    provenance into `records_dir`; `name` (e.g. the tag) names it in both (default `image`)."""
    try:
        scan = scan_image(client, image, progress)
    except ScanError as exc:
        raise RecordError(str(exc)) from None
    sbom = make_sbom(scan, image_name=name or image, wheel_hashes=wheel_hashes(WHEELHOUSE))
    paths = record_paths(records_dir, scan.image_id)
    # The SBOM first: a provenance on disk always has its SBOM beside it.
    _write_atomic(paths.sbom, sbom)
    if key is None:
        return Recorded(scan.image_id, scan.content_digest, paths, "")
    lock = lock or lock_file()
    try:
        lock_sha256 = hashlib.sha256(lock.read_bytes()).hexdigest()
    except OSError as exc:
        raise RecordError(f"the lock file cannot be read ({exc.strerror})") from None
    envelope = sign_statement(
        key,
        image_name=name or image,
        image_digest=scan.image_id,
        sbom_sha256=hashlib.sha256(sbom).hexdigest(),
        lock_sha256=lock_sha256,
        source_revision=revision or source_revision(),
        content_digest=scan.content_digest,
        builder=BUILDER,
    )
    _write_atomic(paths.provenance, envelope)
    return Recorded(scan.image_id, scan.content_digest, paths, key.key_id)


def verify_image(
    client: Any, image: str, keys: Sequence[TrustKey], records_dir: Path, progress: Progress
) -> Verdict:
    """The verdict on `image` (a tag or an id), or VerifyError saying what does not hold."""
    if not keys:
        raise VerifyError("no trust key given (--key PUB or DOCBROKER_IMAGE_TRUST_KEYS)")
    try:
        scan = scan_image(client, image, progress)
    except ScanError as exc:
        raise VerifyError(str(exc)) from None
    try:
        paths = record_paths(records_dir, scan.image_id)
    except ProvenanceError as exc:
        raise VerifyError(str(exc)) from None
    envelope = _read_record(paths.provenance, MAX_ENVELOPE_BYTES, "provenance")
    try:
        provenance = verify_envelope(envelope, keys)
    except ProvenanceError as exc:
        raise VerifyError(str(exc)) from None
    if provenance.image_digest != scan.image_id:
        raise VerifyError(f"the provenance is for another image, not {scan.image_id}")
    sbom = _read_record(paths.sbom, MAX_SBOM_BYTES, "SBOM")
    if hashlib.sha256(sbom).hexdigest() != provenance.sbom_sha256:
        raise VerifyError("the SBOM is not the one the provenance signed (its digest differs)")
    if provenance.content_digest != scan.content_digest:
        raise VerifyError("the image's content differs from the signed content digest")
    try:
        check_sbom(sbom, scan)
    except SbomError as exc:
        raise VerifyError(str(exc)) from None
    return Verdict(scan.image_id, scan.content_digest, provenance.key_id, len(scan.python), len(scan.debian))


def _read_record(path: Path, limit: int, what: str) -> bytes:
    try:
        return read_bounded(path, limit)
    except UnsafeFileError as exc:
        if exc.errno == errno.ENOENT:
            raise VerifyError(
                f"no {what} is recorded for this image (was it built with --sign-key?)"
            ) from None
        raise VerifyError(f"the {what} record {exc.reason}") from None


def _write_atomic(path: Path, data: bytes) -> None:
    try:
        _replace(path, data)
    except OSError as exc:
        raise RecordError(f"the records folder cannot be written ({exc.strerror})") from None


def _replace(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(data)
            out.flush()
            os.fsync(out.fileno())
        os.chmod(tmp, 0o644)  # records are public: anyone may verify
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
