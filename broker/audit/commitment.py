"""The content commitment an approval's audit lines carry (DESIGN §16).

    content_commitment = sha256(salt ‖ sha256(content))     salt: 32 random bytes per approval

Both halves are raw bytes (the salt's 32, the content digest's 32), the result hex. Without the
salt the commitment tells nothing of the content, not even of a two-byte report whose hash
anyone could guess: the audit stays name-only (DESIGN §6). With the salt, which the approvals
store keeps and a receipt carries, anyone holding the report can check it.
"""

from __future__ import annotations

import hashlib

SALT_BYTES = 32


def content_commitment(salt_hex: str, content_sha256_hex: str) -> str:
    """The commitment for a salt and a content's sha256, both hex. Raises ValueError when
    either is not 32 bytes of hex."""
    salt, digest = bytes.fromhex(salt_hex), bytes.fromhex(content_sha256_hex)
    if len(salt) != SALT_BYTES or len(digest) != 32:
        raise ValueError("a salt and a sha256 are 32 bytes each")
    return hashlib.sha256(salt + digest).hexdigest()


def commitment_field(salt_hex: str, content_sha256_hex: str) -> dict[str, str]:
    """`content_commitment=…` for an audit event; nothing for a record made before salts."""
    if not salt_hex:
        return {}
    return {"content_commitment": content_commitment(salt_hex, content_sha256_hex)}
