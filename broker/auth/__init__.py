"""Identity: bearer JWT → Principal, key sources, and what refused clients are told (DESIGN §5).

errors.py     AuthReason codes, AuthError(status, reason), KeysUnavailable
encoding.py   strict base64url and JSON for untrusted input
keys.py       key sources: JWKS/PEM file, JWKS URL (cached, cooldown), HS256 dev secret
jwt.py        Authenticator.authenticate(authorization) → Principal
challenge.py  WWW-Authenticate values and RFC 9728 protected resource metadata
"""

from broker.auth.challenge import (
    metadata_path,
    protected_resource_metadata,
    resource_metadata_url,
    resource_url,
    www_authenticate,
)
from broker.auth.errors import STATUS, AuthError, AuthReason, KeysUnavailable, insufficient_scope
from broker.auth.jwt import Authenticator, authorization_header, bearer_token, require_scope
from broker.auth.keys import (
    KeySource,
    RemoteJWKS,
    StaticKeySource,
    VerificationKey,
    key_source,
    load_dev_secret,
    load_key_file,
)

__all__ = [
    "STATUS",
    "AuthError",
    "AuthReason",
    "Authenticator",
    "KeySource",
    "KeysUnavailable",
    "RemoteJWKS",
    "StaticKeySource",
    "VerificationKey",
    "authorization_header",
    "bearer_token",
    "insufficient_scope",
    "key_source",
    "load_dev_secret",
    "load_key_file",
    "metadata_path",
    "protected_resource_metadata",
    "require_scope",
    "resource_metadata_url",
    "resource_url",
    "www_authenticate",
]
