"""The server's configuration, read once from the trusted start-up environment.

Never from a request. Every problem is reported at start-up with a clear message, so a
sandbox that is wrongly provisioned fails fast instead of serving a half-working tenant.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from server.approval import MIN_SECRET_CHARS
from server.contracts import TENANT_RE

MAX_SECRET_FILE_BYTES = 4096


class ConfigError(Exception):
    """Start-up configuration is missing or unsafe; the message names the variable, not a value."""


@dataclass(frozen=True)
class ServerConfig:
    docs_root: Path
    scope: str
    secret: str

    def __repr__(self) -> str:  # the secret must never reach a log through a repr
        return f"ServerConfig(docs_root={str(self.docs_root)!r}, scope={self.scope!r}, secret=<hidden>)"

    @classmethod
    def from_env(cls, env: Mapping[str, str] = os.environ) -> ServerConfig:
        root = _required(env, "DOCS_ROOT")
        scope = _required(env, "DOCS_SCOPE")
        secret_file = _required(env, "DOCS_SECRET_FILE")
        if not TENANT_RE.fullmatch(scope):
            raise ConfigError("DOCS_SCOPE must be a DNS label (a-z, 0-9, '-', at most 63 characters)")
        docs_root = Path(root)
        for folder in (docs_root, docs_root / "sources", docs_root / "reports"):
            if not folder.is_dir() or folder.is_symlink():
                raise ConfigError(
                    f"DOCS_ROOT must hold the folders sources/ and reports/; missing: {folder.name}/"
                )
        return cls(docs_root=docs_root, scope=scope, secret=_read_secret(Path(secret_file)))


def _required(env: Mapping[str, str], name: str) -> str:
    value = env.get(name, "").strip()
    if not value:
        raise ConfigError(f"{name} is not set")
    return value


def _read_secret(path: Path) -> str:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError as exc:
        raise ConfigError(f"DOCS_SECRET_FILE cannot be opened ({exc.strerror})") from None
    try:
        return secret_from_fd(fd, "DOCS_SECRET_FILE")
    finally:
        os.close(fd)


def secret_from_fd(fd: int, what: str) -> str:
    """The approval secret in an open regular file (`what` names it in errors)."""
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        raise ConfigError(f"{what} is not a regular file")
    raw = os.pread(fd, MAX_SECRET_FILE_BYTES + 1, 0)
    if len(raw) > MAX_SECRET_FILE_BYTES:
        raise ConfigError(f"{what} is too large")
    try:
        secret = raw.decode("ascii").strip()
    except UnicodeDecodeError:
        raise ConfigError(f"{what} must hold ASCII text") from None
    if len(secret) < MIN_SECRET_CHARS:
        raise ConfigError(f"{what} holds a weak secret (fewer than {MIN_SECRET_CHARS} characters)")
    return secret
