"""The server's configuration, read once from the trusted start-up environment.

Never from a request. Every problem is reported at start-up with a clear message, so a
sandbox that is wrongly provisioned fails fast instead of serving a half-working tenant.
"""

from __future__ import annotations

import ipaddress
import os
import re
import stat
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from server.approval import MIN_SECRET_CHARS
from server.contracts import TENANT_RE

MAX_SECRET_FILE_BYTES = 4096
MAX_ALLOWED_HOSTS = 32
# A Host header value as the SDK compares it: a name or address, optionally `:port` or `:*`.
_ALLOWED_HOST_RE = re.compile(r"(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9.-]+)(:([0-9]{1,5}|\*))?")


class ConfigError(Exception):
    """Start-up configuration is missing or unsafe; the message names the variable, not a value."""


@dataclass(frozen=True)
class ServerConfig:
    docs_root: Path
    tenant: str  # read from DOCS_SCOPE: the variable's name is the contract (DESIGN §2)
    secret: str

    def __repr__(self) -> str:  # the secret must never reach a log through a repr
        return f"ServerConfig(docs_root={str(self.docs_root)!r}, tenant={self.tenant!r}, secret=<hidden>)"

    @classmethod
    def from_env(cls, env: Mapping[str, str] = os.environ) -> ServerConfig:
        root = _required(env, "DOCS_ROOT")
        tenant = _required(env, "DOCS_SCOPE")
        secret_file = _required(env, "DOCS_SECRET_FILE")
        if not TENANT_RE.fullmatch(tenant):
            raise ConfigError("DOCS_SCOPE must be a DNS label (a-z, 0-9, '-', at most 63 characters)")
        docs_root = Path(root)
        for folder in (docs_root, docs_root / "sources", docs_root / "reports"):
            if not _is_real_dir(folder):
                raise ConfigError(
                    f"DOCS_ROOT must hold the folders sources/ and reports/; missing: {folder.name}/"
                )
        return cls(
            docs_root=docs_root, tenant=tenant, secret=_read_secret(Path(secret_file), "DOCS_SECRET_FILE")
        )


@dataclass(frozen=True)
class HttpConfig:
    """How the HTTP transport admits requests (the pod network, DESIGN §10).

    `sandbox_key`: the tenant's sandbox key from DOCS_SANDBOX_KEY_FILE; when set, every request
    needs it as a bearer. `allowed_hosts`: DOCS_ALLOWED_HOSTS for the SDK's DNS-rebinding check
    (None: the transport's defaults).
    """

    sandbox_key: str | None
    allowed_hosts: tuple[str, ...] | None

    def __repr__(self) -> str:
        key = "<hidden>" if self.sandbox_key else None
        return f"HttpConfig(sandbox_key={key}, allowed_hosts={self.allowed_hosts!r})"

    @classmethod
    def from_env(cls, env: Mapping[str, str] = os.environ) -> HttpConfig:
        key_file = env.get("DOCS_SANDBOX_KEY_FILE", "").strip()
        key = _read_secret(Path(key_file), "DOCS_SANDBOX_KEY_FILE") if key_file else None
        return cls(sandbox_key=key, allowed_hosts=_allowed_hosts(env.get("DOCS_ALLOWED_HOSTS", "")))

    def check_listener(self, host: str) -> None:
        """A TCP listener off loopback is reachable by the whole network: only with a key."""
        if self.sandbox_key is None and not is_loopback(host):
            raise ConfigError(
                "--http on a non-loopback address needs DOCS_SANDBOX_KEY_FILE "
                "(the broker's per-tenant bearer): refusing to serve unauthenticated"
            )


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a name other than localhost may resolve anywhere


def _allowed_hosts(raw: str) -> tuple[str, ...] | None:
    if not raw.strip():
        return None
    hosts = tuple(part.strip() for part in raw.split(","))
    if len(hosts) > MAX_ALLOWED_HOSTS or not all(_ALLOWED_HOST_RE.fullmatch(h) for h in hosts):
        raise ConfigError(
            "DOCS_ALLOWED_HOSTS must be a comma-separated list of HOST, HOST:PORT or HOST:* "
            f"(at most {MAX_ALLOWED_HOSTS})"
        )
    return hosts


def _is_real_dir(path: Path) -> bool:
    try:
        return stat.S_ISDIR(os.lstat(path).st_mode)  # lstat: a symlink is not the folder
    except OSError:  # missing, or a parent we may not search (EACCES): not usable either way
        return False


def _required(env: Mapping[str, str], name: str) -> str:
    value = env.get(name, "").strip()
    if not value:
        raise ConfigError(f"{name} is not set")
    return value


def _read_secret(path: Path, what: str) -> str:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError as exc:
        raise ConfigError(f"{what} cannot be opened ({exc.strerror})") from None
    try:
        return secret_from_fd(fd, what)
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
