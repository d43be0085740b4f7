"""Key material: the broker's master key and what is derived from it (DESIGN §3).

One master key (≥ 32 random bytes, hex in a file) on the broker. Each tenant's approval
secret is derived from it, so only that tenant's sandbox can verify tokens minted for it,
and the keys that seal in-band request state, legacy session ids and sign-ins under way are
derived under labels of their own.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
from pathlib import Path

from broker.files import UnsafeFileError, read_bounded

MIN_MASTER_KEY_BYTES = 32
_MAX_MASTER_KEY_FILE_BYTES = 4096  # 64 hex digits and a newline; the cap bounds a planted file
_APPROVAL_LABEL = b"docbroker/approval/v1/"
_SEAL_LABEL = b"docbroker/request-state/v1"
_SESSION_LABEL = b"docbroker/mcp-session/v1"
_SIGNIN_LABEL = b"docbroker/web-signin/v1"
_SANDBOX_LABEL = b"docbroker/sandbox/v1/"
_KEEPER_LABEL = b"docbroker/keeper/v1/"


class MasterKeyError(Exception):
    """The master key is missing, unreadable or weak. Never carries key material."""


def tenant_secret(master_key: bytes, tenant: str) -> str:
    return hmac.new(master_key, _APPROVAL_LABEL + tenant.encode("ascii"), hashlib.sha256).hexdigest()


def sandbox_key(master_key: bytes, tenant: str) -> str:
    """Bearer the broker sends to a tenant's MCP port on the pod network (DESIGN §10)."""
    return hmac.new(master_key, _SANDBOX_LABEL + tenant.encode("ascii"), hashlib.sha256).hexdigest()


def keeper_key(master_key: bytes, tenant: str) -> str:
    """Bearer the broker sends to a tenant's reports keeper; the server container never has it."""
    return hmac.new(master_key, _KEEPER_LABEL + tenant.encode("ascii"), hashlib.sha256).hexdigest()


def sealing_key(master_key: bytes) -> bytes:
    return hmac.new(master_key, _SEAL_LABEL, hashlib.sha256).digest()


def session_key(master_key: bytes) -> bytes:
    """Seals legacy session ids (broker/gateway/legacy_sessions.py): any replica can open them."""
    return hmac.new(master_key, _SESSION_LABEL, hashlib.sha256).digest()


def signin_key(master_key: bytes) -> bytes:
    """Seals a sign-in under way into the browser's cookie (broker/web/signin.py)."""
    return hmac.new(master_key, _SIGNIN_LABEL, hashlib.sha256).digest()


def load_master_key(path: Path) -> bytes:
    # No symlink, no FIFO, mode 0600, bounded: the Deployment copies the Secret into an
    # emptyDir as a regular file, and the Docker layout writes one, so nothing legitimate links.
    try:
        raw = read_bounded(path, _MAX_MASTER_KEY_FILE_BYTES, private=True)
    except UnsafeFileError as exc:
        raise MasterKeyError(f"master key file {exc}") from None
    try:
        key = bytes.fromhex(raw.decode("ascii").strip())
    except (UnicodeDecodeError, ValueError):
        raise MasterKeyError("master key file must hold hex") from None
    if len(key) < MIN_MASTER_KEY_BYTES:
        raise MasterKeyError(f"master key must be at least {MIN_MASTER_KEY_BYTES} bytes")
    return key


def create_master_key(path: Path) -> bool:
    """Create a new random master key unless one exists. Returns True when it created one."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    except FileExistsError:
        return False
    with os.fdopen(fd, "w", encoding="ascii") as f:
        f.write(secrets.token_hex(32) + "\n")
    return True
