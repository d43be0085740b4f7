"""Release keys and signed image records as `docbroker image build` leaves them, for the tests
of the broker's image check (broker/runtime/imagetrust.py): real Ed25519 keys on disk, real
DSSE envelopes made by broker/supply/provenance.py."""

from __future__ import annotations

from pathlib import Path

from broker.supply.provenance import load_signing_key, record_paths, sign_statement, write_keypair


class Release:
    """One release key pair in `folder` (`<name>.key` 0600, `<name>.pub`)."""

    def __init__(self, folder: Path, name: str = "release") -> None:
        folder.mkdir(parents=True, exist_ok=True)
        self.private = folder / f"{name}.key"
        self.public = folder / f"{name}.pub"
        self.key_id = write_keypair(self.private, self.public)
        self._key = load_signing_key(self.private)

    def sign(self, records: Path, digest: str, *, subject: str | None = None) -> Path:
        """Write the provenance of `digest` into `records`, as a build would; `subject`: the
        image the statement names, when it is not `digest` (a statement copied across)."""
        records.mkdir(parents=True, exist_ok=True)
        envelope = sign_statement(
            self._key,
            image_name="docbroker-server:latest",
            image_digest=subject or digest,
            sbom_sha256="11" * 32,
            lock_sha256="22" * 32,
            source_revision="unknown",
            content_digest="sha256:" + "33" * 32,
            builder="tests",
        )
        path = record_paths(records, digest).provenance
        path.write_bytes(envelope)
        return path
