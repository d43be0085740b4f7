"""The audit log: where it lives, how hard each line is pushed to disk, its signed evidence."""

from __future__ import annotations

import re
import socket
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path

from broker.settings.reader import MIB, PREFIX, Reader, SettingsError

REPLICA_ID = re.compile(r"[A-Za-z0-9_.:-]{1,64}")


class AuditFsync(StrEnum):
    """When the audit log's lines are forced to stable storage."""

    ALWAYS = "always"  # fsync before every emit returns: adds ~1-4 ms (measured) to each request
    INTERVAL = "interval"  # write(2) per event, fsync batched every `fsync_interval_seconds`


def default_replica_id() -> str:
    """The host name, reduced to the characters a replica id may hold (containers: unique each)."""
    name = re.sub(r"[^A-Za-z0-9_.:-]", "-", socket.gethostname())[:64]
    return name or "local"


@dataclass(frozen=True)
class AuditSettings:
    """Where the audit log lives and how hard each line is pushed to disk.

    Every line is written to the kernel before `emit` returns (a broker crash loses nothing);
    with `INTERVAL` a power loss or kernel crash may lose the last `fsync_interval_seconds`.
    Per-line fsync costs 1-4 ms (measured), against a 1.5 ms p50 budget for all the broker adds.

    The defaults below are the environment's too (`audit_settings` reads them from here): a
    log built in code behaves as the broker's does. The files have none: they live in the data
    dir, and whether a log is signed is said by whoever builds it.
    """

    path: Path
    # Evidence beyond the chain (DESIGN §6). None: a plain chain, no checkpoints (the broker
    # always has a key: DOCBROKER_AUDIT_KEY_FILE defaults to one in the data dir).
    key_file: Path | None  # the replica's Ed25519 signing key, created 0600 on first start
    witness_file: Path | None  # a copy of every checkpoint and gap record, to ship elsewhere
    fsync: AuditFsync = AuditFsync.INTERVAL
    fsync_interval_seconds: float = 0.2
    replica: str = field(default_factory=default_replica_id)
    checkpoint_every: int = 1000  # lines
    checkpoint_interval_seconds: float = 10.0  # and at least this often while lines are written
    rotate_bytes: int = 256 * MIB  # 0: never rotate
    # Rotated files kept in the data dir, the newest; older ones are removed after a rotation
    # (0: all kept). With rotate_bytes it bounds the log's disk: (keep_files + 1) * rotate_bytes.
    keep_files: int = 0
    stdout: bool = False  # every line also on stdout (JSON Lines for a log collector)

    def __post_init__(self) -> None:
        if not isinstance(self.fsync, AuditFsync):
            raise SettingsError(f"{PREFIX}AUDIT_FSYNC must be one of {', '.join(AuditFsync)}")
        if not 0.01 <= self.fsync_interval_seconds <= 10:
            raise SettingsError(f"{PREFIX}AUDIT_FSYNC_INTERVAL must be between 0.01 and 10")
        if not REPLICA_ID.fullmatch(self.replica):
            raise SettingsError(f"{PREFIX}REPLICA_ID must be 1-64 of A-Z a-z 0-9 _ . : -")
        if not 1 <= self.checkpoint_every <= 1_000_000:
            raise SettingsError(f"{PREFIX}AUDIT_CHECKPOINT_EVERY must be between 1 and 1000000")
        if not 0.1 <= self.checkpoint_interval_seconds <= 86_400:
            raise SettingsError(f"{PREFIX}AUDIT_CHECKPOINT_INTERVAL must be between 0.1 and 86400")
        if self.rotate_bytes and self.rotate_bytes < 1024 * 1024:
            raise SettingsError(f"{PREFIX}AUDIT_ROTATE_MB must be 0 (never) or at least 1")
        if self.keep_files and not self.rotate_bytes:
            raise SettingsError(f"{PREFIX}AUDIT_KEEP_FILES needs {PREFIX}AUDIT_ROTATE_MB above 0")


def audit_settings(r: Reader, data_dir: Path) -> AuditSettings:
    replica = r.optional(
        "REPLICA_ID",
        doc=(
            "this replica's id, in every audit line (`replica`) and checkpoint (A-Z a-z 0-9 `_ . : "
            "-`, up to 64); when set, it also names the replica's audit files"
        ),
    )
    # Replicas sharing a data dir: each its own chain, key and witness, named by its id.
    own = f"-{replica}" if replica else ""
    return AuditSettings(
        path=r.folder(
            "AUDIT_LOG",
            data_dir / f"audit{own}.jsonl",
            doc=(
                "the audit log (one per replica: a second broker on a held log refuses to start); "
                "`audit-<id>.jsonl` when `DOCBROKER_REPLICA_ID` is set"
            ),
        ),
        fsync=AuditFsync(
            r.choice(
                "AUDIT_FSYNC",
                AuditSettings.fsync,
                tuple(AuditFsync),
                doc=(
                    "`interval`: each line is written before the request goes on, forced to disk every "
                    "`DOCBROKER_AUDIT_FSYNC_INTERVAL` (a power loss may lose that much); `always`: forced "
                    "before each request goes on (~1-4 ms more each, measured)"
                ),
            )
        ),
        fsync_interval_seconds=r.number(
            "AUDIT_FSYNC_INTERVAL",
            AuditSettings.fsync_interval_seconds,
            low=0.01,
            high=10,
            doc="seconds between forced writes with `interval` (0.01-10)",
        ),
        key_file=r.folder(
            "AUDIT_KEY_FILE",
            data_dir / f"audit-signing{own}.key",
            doc=(
                "the replica's Ed25519 key for signing checkpoints (not the master key); created, mode "
                "0600, on first start or by `docbroker audit keygen`; `docbroker audit key` prints its "
                "public key (and fails when there is none); `audit-signing-<id>.key` with a replica id"
            ),
        ),
        witness_file=r.folder(
            "AUDIT_WITNESS_FILE",
            data_dir / f"audit-witness{own}.jsonl",
            doc=(
                "a copy of every checkpoint and gap record, to ship off the host; "
                "`audit-witness-<id>.jsonl` with a replica id"
            ),
        ),
        replica=replica or default_replica_id(),
        checkpoint_every=r.integer(
            "AUDIT_CHECKPOINT_EVERY",
            AuditSettings.checkpoint_every,
            low=1,
            high=1_000_000,
            doc="lines between signed checkpoints (1-1,000,000)",
        ),
        checkpoint_interval_seconds=r.number(
            "AUDIT_CHECKPOINT_INTERVAL",
            AuditSettings.checkpoint_interval_seconds,
            low=0.1,
            high=86_400,
            doc=("seconds: a checkpoint at least this often while lines are written (0.1-86,400)"),
        ),
        rotate_bytes=MIB
        * r.integer(
            "AUDIT_ROTATE_MB",
            AuditSettings.rotate_bytes // MIB,
            low=0,
            high=1024 * 1024,
            doc=(
                "rotate the log at this size into `audit.jsonl.000001`, `.000002`, …, the chain going on "
                "(0: never)"
            ),
        ),
        keep_files=r.integer(
            "AUDIT_KEEP_FILES",
            AuditSettings.keep_files,
            low=0,
            high=100_000,
            doc=(
                "rotated files kept, the newest; older ones are removed after each rotation, so the log "
                "takes at most (this + 1) x `AUDIT_ROTATE_MB` of its volume (0: all kept; needs rotation)"
            ),
        ),
        stdout=r.flag(
            "AUDIT_STDOUT",
            AuditSettings.stdout,
            doc=("every audit line also on stdout, as in the file (the broker's own logs are on stderr)"),
        ),
    )
