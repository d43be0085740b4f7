"""The deployment's own folders and key: where its data, policies and master key live."""

from __future__ import annotations

from pathlib import Path

from broker.settings.reader import Reader


def data_dir(r: Reader) -> Path:
    return r.folder("DATA_DIR", "var", doc="tenants' files, approvals database, run sockets (mode 0700)")


def policies_dir(r: Reader) -> Path:
    return r.folder(
        "POLICIES_DIR",
        "policies",
        doc=(
            "`docbroker.cedarschema`, `*.cedar`, `default.toml`, `tenants/<tenant>.toml` and "
            "`seccomp.json` ([docs/policy.md](docs/policy.md))"
        ),
    )


def master_key_file(r: Reader, data_dir: Path) -> Path:
    return r.folder(
        "MASTER_KEY_FILE",
        data_dir / "master.key",
        doc="32-byte hex master key (created on first start, mode 0600)",
    )
