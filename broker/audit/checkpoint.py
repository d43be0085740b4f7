"""Signed checkpoints and gap records: what makes a rewritten or cut audit log detectable.

A checkpoint says "this replica's log `log`, after `size` lines, has the RFC 6962 tree head
`root`", signed with the replica's Ed25519 audit key. Anyone who can write the file can rebuild
its hash chain; nobody without the key can sign a tree head over the rebuilt lines.

    {"key": <key id>, "log": <log id>, "n": <checkpoint number>, "prev": <hash of checkpoint n-1>,
     "replica": <replica id>, "root": <tree head>, "size": <tree size>, "time": <RFC 3339>, "v": 1}

- `log` is random per log lineage (a fresh log, or the first checkpoint of an older one), so a
  checkpoint copied from another replica's or another lineage's log is told apart.
- `n` counts checkpoints of the lineage and `prev` links each one to the one before, so an old
  checkpoint replayed later, or one removed, breaks the sequence.
- The signed bytes are a domain label and the canonical JSON (sorted keys, no spaces): a
  signature over a checkpoint can never be taken for one over a gap record or anything else.

A gap record (`audit.gap`) is signed the same way: between `from` and `to` the log could not be
written, `refused` requests were refused for it and `lost` events could not be written.

Only names, counts, times and hashes: no field of either record can carry a request's value.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from broker.files import UnsafeFileError, read_bounded

FORMAT: Final = 1
CHECKPOINT_LABEL: Final = b"docbroker-audit-checkpoint/v1\n"
GAP_LABEL: Final = b"docbroker-audit-gap/v1\n"
MAX_KEY_FILE_BYTES: Final = 16 * 1024  # a PEM key is a few hundred bytes


class KeyFileError(Exception):
    """An audit key cannot be read or parsed. The message names the file, never its content."""


def canonical_bytes(body: Mapping[str, Any]) -> bytes:
    return json.dumps(dict(body), sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode("ascii")


def record_hash(body: Mapping[str, Any]) -> str:
    """What the next checkpoint's `prev` holds: sha256 of this one's canonical bytes."""
    return hashlib.sha256(canonical_bytes(body)).hexdigest()


def key_id(public: Ed25519PublicKey) -> str:
    """A short public name for a key: the first 16 hex digits of sha256 over its 32 raw bytes."""
    raw = public.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return hashlib.sha256(raw).hexdigest()[:16]


def public_hex(public: Ed25519PublicKey) -> str:
    return public.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw).hex()


def public_pem(public: Ed25519PublicKey) -> str:
    return public.public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    ).decode("ascii")


@dataclass(frozen=True)
class Signer:
    """A replica's audit signing key, with its public id."""

    private: Ed25519PrivateKey
    key_id: str

    @classmethod
    def of(cls, private: Ed25519PrivateKey) -> Signer:
        return cls(private, key_id(private.public_key()))

    def sign(self, label: bytes, body: Mapping[str, Any]) -> str:
        return self.private.sign(label + canonical_bytes(body)).hex()


def create_signing_key(path: Path) -> bool:
    """Create a new Ed25519 audit key (PKCS#8 PEM, mode 0600) unless one exists; True if created."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    pem = Ed25519PrivateKey.generate().private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    except FileExistsError:
        return False
    with os.fdopen(fd, "wb") as f:
        f.write(pem)
    return True


def load_signing_key(path: Path) -> Signer:
    try:
        data = read_bounded(path, MAX_KEY_FILE_BYTES, private=True)
    except UnsafeFileError as exc:
        raise KeyFileError(f"audit key file {exc}") from None
    try:
        private = serialization.load_pem_private_key(data, password=None)
    except (ValueError, TypeError):
        raise KeyFileError(f"audit key file is not an unencrypted PEM private key: {path.name}") from None
    if not isinstance(private, Ed25519PrivateKey):
        raise KeyFileError(f"audit key file does not hold an Ed25519 key: {path.name}")
    return Signer.of(private)


def parse_public_key(text: str) -> Ed25519PublicKey:
    """A public key from PEM (SubjectPublicKeyInfo) or 64 hex digits (the raw 32 bytes)."""
    stripped = text.strip()
    if stripped.startswith("-----BEGIN"):
        try:
            public = serialization.load_pem_public_key(stripped.encode("ascii"))
        except (ValueError, UnicodeEncodeError):
            raise KeyFileError("not a PEM public key") from None
        if not isinstance(public, Ed25519PublicKey):
            raise KeyFileError("not an Ed25519 public key")
        return public
    try:
        raw = bytes.fromhex(stripped)
    except ValueError:
        raise KeyFileError("a public key is PEM or 64 hex digits") from None
    if len(raw) != 32:
        raise KeyFileError("a raw Ed25519 public key is 32 bytes (64 hex digits)")
    return Ed25519PublicKey.from_public_bytes(raw)


def load_public_key(spec: str) -> Ed25519PublicKey:
    """`spec` is a file (PEM or hex) or the hex itself."""
    path = Path(spec)
    if len(spec) != 64 and path.exists():
        # A public key is not secret: an operator's link to it is fine (follow), but a FIFO or
        # a device given as --key must not hang or fill memory.
        try:
            return parse_public_key(read_bounded(path, MAX_KEY_FILE_BYTES, follow_links=True).decode("ascii"))
        except UnsafeFileError as exc:
            raise KeyFileError(f"public key file {exc}") from None
        except UnicodeDecodeError:
            raise KeyFileError(f"public key file cannot be read: {path.name}") from None
    return parse_public_key(spec)


class Keyring:
    """The public keys a verifier trusts, by key id."""

    def __init__(self, keys: list[Ed25519PublicKey]) -> None:
        self._keys = {key_id(k): k for k in keys}

    def __bool__(self) -> bool:
        return bool(self._keys)

    def check(self, label: bytes, body: Mapping[str, Any], signature: str) -> str | None:
        """None when `signature` is a valid signature of `body` by a trusted key, else why not."""
        key = self._keys.get(str(body.get("key")))
        if key is None:
            return "signed by a key that was not given (--key)"
        try:
            key.verify(bytes.fromhex(signature), label + canonical_bytes(body))
        except (InvalidSignature, ValueError):
            return "bad signature (rewritten without the key, or signed by another key)"
        return None
