"""The operators' bearer: who may read `/metrics` and the details of `/readyz`.

Both tell a caller what an attacker wants to know: approvals pending per state, requests
by tool and outcome, the sandbox engine's version, rootless or rootful, seccomp, limits,
images. They are on the `/mcp` listener, so they need a credential of their own:
`DOCBROKER_OPS_TOKEN_FILE`, one token per line (two during a rotation: the scraper moves to
the new one, then the old line goes), each at least `MIN_TOKEN_CHARS` printable characters.
Without the file nobody reads them; `/readyz` still says ready or not, which is all a load
balancer or a kubelet needs.

Not a tenant JWT: a tenant is not an operator, and the scraper should need no identity
provider. Tokens are kept as SHA-256 digests and compared with `hmac.compare_digest`, every
one of them, so neither the time nor the length of a wrong guess says anything.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Iterable
from pathlib import Path

from broker.files import UnsafeFileError, read_bounded

MIN_TOKEN_CHARS = 32
MAX_FILE_BYTES = 4096
REALM = 'Bearer realm="docbroker-ops"'


class OpsTokenError(ValueError):
    """The ops token file cannot be used. Names the file, never its content."""


class OpsTokens:
    def __init__(self, tokens: Iterable[bytes]) -> None:
        self._digests = tuple(hashlib.sha256(token).digest() for token in tokens)

    @classmethod
    def load(cls, path: Path | None) -> OpsTokens:
        """The tokens of the file (none when `path` is None: nobody is an operator)."""
        if path is None:
            return cls(())
        try:
            raw = read_bounded(path, MAX_FILE_BYTES, private=True)
        except UnsafeFileError as exc:
            raise OpsTokenError(f"ops token file: {exc}") from None
        try:
            lines = [line.strip() for line in raw.decode("ascii").splitlines()]
        except UnicodeDecodeError:
            raise OpsTokenError(f"ops token file {path.name}: must be ASCII") from None
        tokens = [line for line in lines if line]
        if not tokens or any(len(t) < MIN_TOKEN_CHARS or not t.isprintable() or " " in t for t in tokens):
            raise OpsTokenError(
                f"ops token file {path.name}: one token per line, each {MIN_TOKEN_CHARS}+ printable "
                "characters without spaces"
            )
        return cls(token.encode("ascii") for token in tokens)

    def allowed(self, headers: Iterable[tuple[bytes, bytes]]) -> bool:
        """Whether the request's one Authorization header is `Bearer <an ops token>`."""
        values = [value for name, value in headers if name == b"authorization"]
        if len(values) != 1 or not self._digests:
            return False
        scheme, _, token = values[0].partition(b" ")
        if scheme.lower() != b"bearer" or not token:
            return False
        digest = hashlib.sha256(token.strip()).digest()
        found = False
        for known in self._digests:  # every one, not the first match: no timing by position
            found |= hmac.compare_digest(digest, known)
        return found
