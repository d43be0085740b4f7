"""The image's records and the keys its provenance must be signed with (DESIGN §13)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from broker.settings.reader import Reader


@dataclass(frozen=True)
class ImageSupplySettings:
    """Where `docbroker image build` keeps an image's SBOM and signed provenance, and the release
    public keys that provenance must be signed with (DESIGN §13, docs/supply-chain.md)."""

    records_dir: Path = Path("var/images")  # DOCBROKER_IMAGE_RECORDS; from the env: <DATA_DIR>/images
    trust_keys: tuple[Path, ...] = ()  # DOCBROKER_IMAGE_TRUST_KEYS: Ed25519 public keys (PEM)


def image_supply(r: Reader, data_dir: Path) -> ImageSupplySettings:
    return ImageSupplySettings(
        records_dir=r.folder(
            "IMAGE_RECORDS",
            data_dir / "images",
            doc=(
                "where `docbroker image build` writes each image's SBOM and signed provenance, named by "
                "the image's digest ([docs/supply-chain.md](docs/supply-chain.md))"
            ),
        ),
        trust_keys=r.paths(
            "IMAGE_TRUST_KEYS",
            doc=(
                "release public keys (Ed25519 PEM files, comma-separated) an image's provenance must be "
                "signed with; two during a key rotation ([docs/supply-chain.md](docs/supply-chain.md)). "
                "Docker only: refused with `DOCBROKER_RUNTIME=kubernetes`, and when set to no file"
            ),
        ),
    )
