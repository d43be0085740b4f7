"""Whether an image digest may run a sandbox: its signed provenance, checked against the
release keys (DESIGN §13, docs/supply-chain.md).

    trust = ImageTrust.from_settings(settings.supply)    # None: no DOCBROKER_IMAGE_TRUST_KEYS
    trust.check("sha256:…")                              # or ImageUntrusted

`docbroker image build` writes each image's provenance (an in-toto statement in a DSSE
envelope, broker/supply/provenance.py) into DOCBROKER_IMAGE_RECORDS, named by the image's
digest. Before any sandbox is made from a digest, its envelope there must be signed by one of
DOCBROKER_IMAGE_TRUST_KEYS and name that very digest as its subject. Nothing is cached: each
start reads and verifies again (a file read and one Ed25519 signature: 1.5 ms measured on a
busy 2-core host, against a sandbox start of a second or more), so removing an image's record
withdraws it from the next start on.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from broker.files import UnsafeFileError, read_bounded
from broker.runtime.base import BackendRefused, ImageUntrusted
from broker.settings import ImageSupplySettings
from broker.supply.provenance import (
    MAX_ENVELOPE_BYTES,
    ProvenanceError,
    TrustKey,
    load_trust_keys,
    record_paths,
    verify_envelope,
)


class ImageTrust:
    """Vouches for an image digest with its signed provenance (an ImageCheck, runtime/base.py)."""

    def __init__(self, keys: Sequence[TrustKey], records_dir: Path) -> None:
        if not keys:
            raise ValueError("ImageTrust needs at least one key; without keys trust is off (NoImageTrust)")
        self._keys = list(keys)
        self._records = records_dir

    @classmethod
    def from_settings(cls, supply: ImageSupplySettings) -> ImageTrust | None:
        """None when no trust key is configured (trust off, reported as such); BackendRefused
        when a configured key cannot be used: a broker told to check must not start unchecked."""
        if not supply.trust_keys:
            return None
        try:
            keys = load_trust_keys(supply.trust_keys)
        except ProvenanceError as exc:
            raise BackendRefused(f"DOCBROKER_IMAGE_TRUST_KEYS: {exc}") from None
        return cls(keys, supply.records_dir)

    def check(self, digest: str) -> None:
        """Return if `digest`'s provenance is signed by a trusted key and names `digest`."""
        try:
            path = record_paths(self._records, digest).provenance
            envelope = read_bounded(path, MAX_ENVELOPE_BYTES)
        except (ProvenanceError, UnsafeFileError):
            # Missing most often: an image nobody built with `docbroker image build` here, or
            # one swapped in under the configured name.
            raise ImageUntrusted(
                f"the sandbox image {digest} has no readable provenance in DOCBROKER_IMAGE_RECORDS "
                "(not built and signed by `docbroker image build`?)"
            ) from None
        try:
            provenance = verify_envelope(envelope, self._keys)
        except ProvenanceError as exc:
            raise ImageUntrusted(f"the sandbox image {digest}: {exc}") from None
        if provenance.image_digest != digest:
            # A valid statement about another image, copied under this one's name.
            raise ImageUntrusted(f"the sandbox image {digest}: its provenance names another image")

    def describe(self) -> dict[str, Any]:
        return {
            "state": "on",
            "keys": [k.key_id[:16] for k in self._keys],
            "detail": f"{len(self._keys)} release key(s)",
        }
