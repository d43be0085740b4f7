"""Signed provenance of an image: an in-toto Statement v1 in a DSSE envelope, Ed25519.

    key = load_signing_key(Path("release.key"))                     # PEM, chmod 600
    envelope = sign_statement(key, image_name="docbroker-server:latest", image_digest="sha256:…",
                              sbom_sha256=…, lock_sha256=…, source_revision=…,
                              content_digest="sha256:…", builder="docbroker image build")
    provenance = verify_envelope(envelope, load_trust_keys([Path("release.pub")]))
    provenance.image_digest == "sha256:…"    # the caller compares it with the image it runs

The statement's one subject is the image, named by the digest of its Docker image id (the
sha256 of its config, which names every layer's content): a retagged image has another id and
so fails the caller's comparison. The predicate binds the SBOM, the lock file, the source
revision and the file-tree content digest to that id.

Built on securesystemslib (DSSE `Envelope`, `CryptoSigner`, `SSlibKey`): the pre-authentication
encoding and the key ids are theirs, so `in-toto`/`securesystemslib` tools read our envelopes.

Errors are `ProvenanceError`, one line, naming a file by its name and never a value of the
statement other than the image digest: an envelope is input an attacker may have written.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from securesystemslib import exceptions as sslib_exceptions
from securesystemslib.dsse import Envelope

# The package re-exports these without an __all__, which strict mypy reads as private.
from securesystemslib.signer import CryptoSigner, SSlibKey  # type: ignore[attr-defined]

from broker.files import UnsafeFileError, printable, read_bounded

STATEMENT_TYPE: Final = "https://in-toto.io/Statement/v1"
PAYLOAD_TYPE: Final = "application/vnd.in-toto+json"
# Ours: the predicate below is docbroker's own record of an image build (a URN, so it names no
# web site that someone else could own).
PREDICATE_TYPE: Final = "urn:docbroker:image-build:v1"

MAX_KEY_BYTES: Final = 16 * 1024
MAX_ENVELOPE_BYTES: Final = 1024 * 1024
_HEX64 = re.compile(r"[0-9a-f]{64}")
_DIGEST = re.compile(r"sha256:[0-9a-f]{64}")
# A git revision (40 or 64 hex), optionally marked dirty; "unknown" outside a checkout.
_REVISION = re.compile(r"(?:[0-9a-f]{40}|[0-9a-f]{64})(?:-dirty)?|unknown")


class ProvenanceError(Exception):
    """The provenance or a key cannot be used. One line; no value from the statement but the digest."""


@dataclass(frozen=True)
class Provenance:
    """What a verified statement says about its one image."""

    image_digest: str  # "sha256:<hex>": the Docker image id of the subject
    sbom_sha256: str  # hex of the SBOM file's bytes
    lock_sha256: str  # hex of the lock file the image's dependencies came from
    source_revision: str  # git commit of the sources ("-dirty" when the tree had changes)
    content_digest: str  # "sha256:<hex>": the image's file tree (broker.supply.content)
    key_id: str  # which trusted key signed it (securesystemslib's key id)


@dataclass(frozen=True)
class TrustKey:
    """A release public key that may sign provenance."""

    key_id: str
    key: SSlibKey = field(compare=False, repr=False)


@dataclass(frozen=True)
class SigningKey:
    """A release private key (Ed25519) and its key id."""

    key_id: str
    signer: CryptoSigner = field(compare=False, repr=False)


@dataclass(frozen=True)
class RecordPaths:
    """Where a build stores the records of one image, by its digest."""

    provenance: Path  # <records>/<hex>.provenance.dsse.json
    sbom: Path  # <records>/<hex>.sbom.cdx.json


# --- keys ------------------------------------------------------------------------------------


def load_trust_keys(paths: Sequence[Path]) -> list[TrustKey]:
    """The Ed25519 public keys (PEM, SubjectPublicKeyInfo) in `paths`, in order, without repeats."""
    keys: list[TrustKey] = []
    for path in paths:
        name = printable(Path(path).name)
        try:
            # A link is fine for a public key (a Kubernetes Secret's files are links); what it
            # names must still be a small regular file, never a FIFO or /dev/zero.
            data = read_bounded(path, MAX_KEY_BYTES, follow_links=True)
        except UnsafeFileError as exc:
            raise ProvenanceError(f"trust key {exc}") from None
        try:
            public = serialization.load_pem_public_key(data)
        except (ValueError, TypeError):
            raise ProvenanceError(f"trust key {name}: not a PEM public key") from None
        if not isinstance(public, Ed25519PublicKey):
            raise ProvenanceError(f"trust key {name}: not an Ed25519 key")
        key = SSlibKey.from_crypto(public)
        if all(k.key_id != key.keyid for k in keys):
            keys.append(TrustKey(key.keyid, key))
    return keys


def load_signing_key(path: Path) -> SigningKey:
    """The Ed25519 private key (PEM, PKCS#8, unencrypted) in `path`, which must be chmod 600."""
    name = printable(Path(path).name)
    try:
        data = read_bounded(path, MAX_KEY_BYTES, private=True)
    except UnsafeFileError as exc:
        raise ProvenanceError(f"signing key {exc}") from None
    try:
        private = serialization.load_pem_private_key(data, password=None)
    except (ValueError, TypeError):
        raise ProvenanceError(f"signing key {name}: not an unencrypted PEM private key") from None
    if not isinstance(private, Ed25519PrivateKey):
        raise ProvenanceError(f"signing key {name}: not an Ed25519 key")
    signer = CryptoSigner(private)
    return SigningKey(signer.public_key.keyid, signer)


def write_keypair(private_path: Path, public_path: Path) -> str:
    """A new Ed25519 release key pair: private PEM (0600, never overwritten), public PEM. Its key id."""
    private = Ed25519PrivateKey.generate()
    private_pem = private.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    public_pem = private.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    # O_EXCL: an existing release key is never replaced by accident (that would orphan every
    # image it signed); 0600 from the start, not chmod after the bytes are on disk.
    for path, data, mode in ((private_path, private_pem, 0o600), (public_path, public_pem, 0o644)):
        name = printable(Path(path).name)
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode)
        except FileExistsError:
            raise ProvenanceError(f"{name}: exists (refused: choose another name)") from None
        except OSError as exc:
            raise ProvenanceError(f"{name}: cannot be written ({exc.strerror})") from None
        with os.fdopen(fd, "wb") as out:
            out.write(data)
    return SSlibKey.from_crypto(private.public_key()).keyid


# --- statements ------------------------------------------------------------------------------


def sign_statement(
    key: SigningKey,
    *,
    image_name: str,
    image_digest: str,
    sbom_sha256: str,
    lock_sha256: str,
    source_revision: str,
    content_digest: str,
    builder: str,
) -> bytes:
    """The DSSE envelope (JSON bytes) of the statement that `image_digest` was built as described."""
    _check_fields(image_digest, sbom_sha256, lock_sha256, source_revision, content_digest)
    statement = {
        "_type": STATEMENT_TYPE,
        "subject": [{"name": image_name, "digest": {"sha256": image_digest.removeprefix("sha256:")}}],
        "predicateType": PREDICATE_TYPE,
        "predicate": {
            "sbom_sha256": sbom_sha256,
            "lock_sha256": lock_sha256,
            "source_revision": source_revision,
            "content_digest": content_digest,
            "builder": builder,
        },
    }
    payload = json.dumps(statement, sort_keys=True, separators=(",", ":")).encode()
    envelope = Envelope(payload, PAYLOAD_TYPE, {})
    envelope.sign(key.signer)
    return json.dumps(envelope.to_dict(), indent=2, sort_keys=True).encode() + b"\n"


def verify_envelope(envelope: bytes, keys: Sequence[TrustKey]) -> Provenance:
    """The statement in `envelope` if one of `keys` signed it and it has the expected shape."""
    if not keys:
        raise ProvenanceError("no trust key is configured: provenance cannot be verified")
    if len(envelope) > MAX_ENVELOPE_BYTES:
        raise ProvenanceError(f"provenance envelope is larger than {MAX_ENVELOPE_BYTES} bytes")
    try:
        data = json.loads(envelope)
    except ValueError:
        raise ProvenanceError("provenance envelope is not JSON") from None
    if not isinstance(data, dict) or not isinstance(data.get("signatures"), list):
        raise ProvenanceError("provenance is not a DSSE envelope")
    try:
        parsed = Envelope.from_dict(data)
    except (KeyError, TypeError, ValueError, AttributeError, sslib_exceptions.Error):
        raise ProvenanceError("provenance is not a DSSE envelope") from None
    if parsed.payload_type != PAYLOAD_TYPE:
        raise ProvenanceError("provenance envelope's payload type is not in-toto")
    try:
        accepted = parsed.verify([k.key for k in keys], 1)
    except (ValueError, sslib_exceptions.Error):
        raise ProvenanceError("provenance is not signed by a trusted key") from None
    key_id = next(iter(accepted))
    return _provenance(parsed.payload, key_id)


def record_paths(records_dir: Path, image_digest: str) -> RecordPaths:
    """Where the records of `image_digest` ("sha256:<hex>") are kept in `records_dir`."""
    if not _DIGEST.fullmatch(image_digest):
        raise ProvenanceError("an image digest is sha256:<64 hex digits>")
    hex_digest = image_digest.removeprefix("sha256:")
    return RecordPaths(
        provenance=records_dir / f"{hex_digest}.provenance.dsse.json",
        sbom=records_dir / f"{hex_digest}.sbom.cdx.json",
    )


def _provenance(payload: bytes, key_id: str) -> Provenance:
    try:
        statement = json.loads(payload)
    except ValueError:
        raise ProvenanceError("provenance statement is not JSON") from None
    if not isinstance(statement, dict) or statement.get("_type") != STATEMENT_TYPE:
        raise ProvenanceError("provenance is not an in-toto v1 statement")
    subjects = statement.get("subject")
    if not isinstance(subjects, list) or len(subjects) != 1:
        raise ProvenanceError("provenance statement must name exactly one subject")
    digest = _get(subjects[0], "digest", "sha256")
    if not isinstance(digest, str) or not _HEX64.fullmatch(digest):
        raise ProvenanceError("provenance subject has no sha256 digest")
    if statement.get("predicateType") != PREDICATE_TYPE:
        raise ProvenanceError("provenance predicate is not a docbroker image build")
    predicate = statement.get("predicate")
    if not isinstance(predicate, dict):
        raise ProvenanceError("provenance statement has no predicate")
    values = {}
    for name in ("sbom_sha256", "lock_sha256", "source_revision", "content_digest"):
        value = predicate.get(name)
        if not isinstance(value, str):
            raise ProvenanceError(f"provenance predicate has no {name}")
        values[name] = value
    image_digest = f"sha256:{digest}"
    _check_fields(image_digest, **values)
    return Provenance(image_digest=image_digest, key_id=key_id, **values)


def _check_fields(
    image_digest: str, sbom_sha256: str, lock_sha256: str, source_revision: str, content_digest: str
) -> None:
    checks = (
        ("image digest", _DIGEST, image_digest),
        ("sbom_sha256", _HEX64, sbom_sha256),
        ("lock_sha256", _HEX64, lock_sha256),
        ("source_revision", _REVISION, source_revision),
        ("content_digest", _DIGEST, content_digest),
    )
    for name, pattern, value in checks:
        if not pattern.fullmatch(value):
            raise ProvenanceError(f"provenance {name} is malformed")


def _get(data: Any, *path: str) -> Any:
    for name in path:
        if not isinstance(data, dict):
            return None
        data = data.get(name)
    return data
