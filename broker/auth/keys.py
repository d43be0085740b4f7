"""Where the keys that verify bearer tokens come from (DESIGN §5).

    KeySource            what `Authenticator` asks: the key for (kid, alg), or None
    StaticKeySource      keys loaded once at start-up: a JWKS or PEM file, or the HS256 dev secret
    RemoteJWKS           a JWKS URL, cached; refetched on an unknown kid at most once per cooldown
    key_source(settings) the one source the settings describe

Every key is bound to exactly one algorithm when it is loaded (RSA → RS256, P-256 → ES256,
Ed25519/Ed448 → EdDSA, dev secret → HS256), and lookups match kid *and* algorithm, so a
token can never make a key verify under an algorithm it was not published for (the
HS256-with-the-RSA-public-key confusion). Keys the broker cannot use safely — encryption
keys, private keys, short RSA moduli, other curves — are dropped when the set is loaded.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import urlsplit

import anyio
import httpx2
import jwt
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric.ec import SECP256R1, EllipticCurvePublicKey
from cryptography.hazmat.primitives.asymmetric.ed448 import Ed448PublicKey
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from cryptography.hazmat.primitives.asymmetric.rsa import RSAPublicKey
from cryptography.hazmat.primitives.serialization import load_pem_public_key

from broker.auth.encoding import json_object
from broker.auth.errors import KeysUnavailable
from broker.files import FileTooLargeError, UnsafeFileError, read_bounded
from broker.settings import ALLOWED_ALGORITHMS, PREFIX, AuthSettings, SettingsError

log = logging.getLogger("docbroker.auth")

PUBLIC_ALGORITHMS = frozenset(ALLOWED_ALGORITHMS)  # RS256, ES256, EdDSA
DEV_ALGORITHM = "HS256"
MAX_JWKS_BYTES = 64 * 1024  # real sets are a few KiB; the cap bounds memory and parse time
MIN_RSA_BITS = 2048
MIN_DEV_SECRET_BYTES = 32
_MAX_DEV_SECRET_BYTES = 4096
# JWK members that only a private or symmetric key has: a set that publishes them is broken.
_PRIVATE_MEMBERS = frozenset({"d", "p", "q", "dp", "dq", "qi", "oth", "k"})
_LOOPBACK_HOSTS = frozenset({"127.0.0.1", "::1", "localhost"})

PublicKey = RSAPublicKey | EllipticCurvePublicKey | Ed25519PublicKey | Ed448PublicKey


def _algorithm_of(key: PublicKey) -> str:
    if isinstance(key, RSAPublicKey):
        if key.key_size < MIN_RSA_BITS:
            raise ValueError(f"RSA keys must have at least {MIN_RSA_BITS} bits")
        return "RS256"
    if isinstance(key, EllipticCurvePublicKey):
        if not isinstance(key.curve, SECP256R1):
            raise ValueError("EC keys must be on P-256 (ES256)")
        return "ES256"
    if isinstance(key, Ed25519PublicKey | Ed448PublicKey):
        return "EdDSA"
    raise ValueError("unsupported key type")


@dataclass(frozen=True)
class VerificationKey:
    """One key bound to one algorithm. Built only through the checks in `__post_init__`."""

    kid: str | None  # None: the key has no id (a PEM file, the dev secret) and matches any kid
    algorithm: str
    key: PublicKey | bytes = field(repr=False)  # repr=False: the dev secret is a secret

    def __post_init__(self) -> None:
        if self.algorithm == DEV_ALGORITHM:
            if not isinstance(self.key, bytes) or len(self.key) < MIN_DEV_SECRET_BYTES:
                raise ValueError(f"HS256 needs a secret of at least {MIN_DEV_SECRET_BYTES} bytes")
        elif isinstance(self.key, bytes) or _algorithm_of(self.key) != self.algorithm:
            raise ValueError("key type does not match its algorithm")


class KeySource(Protocol):
    async def get_key(self, kid: str | None, algorithm: str) -> VerificationKey | None:
        """The key for this kid and algorithm, or None. Raises KeysUnavailable if it holds none."""
        ...

    async def ready(self) -> bool:
        """True when the source holds usable keys (for /readyz)."""
        ...


def select(keys: Sequence[VerificationKey], kid: str | None, algorithm: str) -> VerificationKey | None:
    """The key a token names. kid is only ever compared, never used as a path or a query."""
    candidates = [k for k in keys if k.algorithm == algorithm]
    if kid is not None:
        for k in candidates:
            if k.kid == kid:
                return k
        candidates = [k for k in candidates if k.kid is None]
    # Without a matching id, only an unambiguous key will do: never try keys one by one.
    return candidates[0] if len(candidates) == 1 else None


class StaticKeySource:
    def __init__(self, keys: Iterable[VerificationKey]) -> None:
        self._keys = tuple(keys)
        if not self._keys:
            raise ValueError("a key source needs at least one key")

    async def get_key(self, kid: str | None, algorithm: str) -> VerificationKey | None:
        return select(self._keys, kid, algorithm)

    async def ready(self) -> bool:
        return True


class JWKSError(ValueError):
    """A JWKS document could not be used. `code` is fixed text, safe to log."""

    def __init__(self, code: str) -> None:
        super().__init__(code)
        self.code = code


def parse_jwks(data: bytes, algorithms: Collection[str]) -> tuple[VerificationKey, ...]:
    """The usable signature keys of a JWKS (or of a single JWK) for `algorithms`."""
    if len(data) > MAX_JWKS_BYTES:
        raise JWKSError("too_large")
    doc = json_object(data)
    if doc is None:
        raise JWKSError("bad_json")
    entries: Any = doc.get("keys") if "keys" in doc else [doc]
    if not isinstance(entries, list):
        raise JWKSError("bad_json")
    keys: list[VerificationKey] = []
    seen: set[tuple[str | None, str]] = set()
    skipped = 0
    for entry in entries:
        key = _jwk_to_key(entry, algorithms)
        if key is None or (key.kid, key.algorithm) in seen:
            skipped += 1  # encryption keys, other algorithms, duplicates: normal in real sets
            continue
        seen.add((key.kid, key.algorithm))
        keys.append(key)
    if skipped:
        log.debug("jwks: %d key(s) not usable for signature verification were ignored", skipped)
    if not keys:
        raise JWKSError("no_usable_keys")
    return tuple(keys)


def _jwk_to_key(entry: Any, algorithms: Collection[str]) -> VerificationKey | None:
    if not isinstance(entry, dict):
        return None
    kid = entry.get("kid")
    if kid is not None and not isinstance(kid, str):
        return None
    if _PRIVATE_MEMBERS & entry.keys():
        log.warning("jwks: a key with private or symmetric material was ignored")
        return None
    if entry.get("use", "sig") != "sig":
        return None
    ops = entry.get("key_ops")
    if ops is not None and (not isinstance(ops, list) or "verify" not in ops):
        return None
    kty, crv = entry.get("kty"), entry.get("crv")
    if kty == "RSA":
        algorithm = "RS256"
    elif kty == "EC" and crv == "P-256":
        algorithm = "ES256"
    elif kty == "OKP" and crv in ("Ed25519", "Ed448"):
        algorithm = "EdDSA"
    else:
        return None
    if entry.get("alg", algorithm) != algorithm or algorithm not in algorithms:
        return None
    try:
        material = jwt.PyJWK(entry, algorithm=algorithm).key
        return VerificationKey(kid, algorithm, material)
    # PyJWK's messages quote the whole JWK, so they are not logged; a bad key is just not used.
    except (jwt.PyJWTError, ValueError, TypeError):
        return None


def _read_capped(path: Path, variable: str) -> bytes:
    # Public keys: a link is fine (follow), a FIFO or a device is not (regular file, bounded).
    try:
        return read_bounded(path, MAX_JWKS_BYTES, follow_links=True)
    except UnsafeFileError as exc:
        raise SettingsError(f"{PREFIX}{variable}: the file {exc}") from None


def load_key_file(path: Path, algorithms: Collection[str]) -> StaticKeySource:
    """A JWKS document, a single JWK, a PEM public key or a PEM certificate."""
    data = _read_capped(path, "AUTH_JWKS_FILE")
    if data.lstrip().startswith(b"-----BEGIN"):
        try:
            if b"-----BEGIN CERTIFICATE-----" in data:
                public: Any = x509.load_pem_x509_certificate(data).public_key()
            else:
                public = load_pem_public_key(data)
            algorithm = _algorithm_of(public)
        except ValueError:
            raise SettingsError(
                f"{PREFIX}AUTH_JWKS_FILE: the PEM must hold an RSA (≥ {MIN_RSA_BITS} bits), P-256 or "
                "Ed25519/Ed448 public key or certificate"
            ) from None  # the parser's message may quote the file
        if algorithm not in algorithms:
            raise SettingsError(f"{PREFIX}AUTH_JWKS_FILE: the key's algorithm {algorithm} is not allowed")
        return StaticKeySource([VerificationKey(None, algorithm, public)])
    try:
        return StaticKeySource(parse_jwks(data, algorithms))
    except JWKSError as exc:
        raise SettingsError(f"{PREFIX}AUTH_JWKS_FILE: unusable JWKS ({exc.code})") from None


def load_dev_secret(path: Path) -> bytes:
    """The HS256 dev-mode secret: the file's bytes without surrounding whitespace."""
    variable = f"{PREFIX}AUTH_DEV_HS256_SECRET_FILE"
    try:
        # Read past the cap so surrounding whitespace does not count against it.
        secret = read_bounded(path, 2 * _MAX_DEV_SECRET_BYTES, private=True).strip()
    except FileTooLargeError:
        raise SettingsError(f"{variable}: the secret must be at most {_MAX_DEV_SECRET_BYTES} bytes") from None
    except UnsafeFileError as exc:
        raise SettingsError(f"{variable}: the file {exc}") from None
    if len(secret) > _MAX_DEV_SECRET_BYTES:  # never silently use a truncated secret
        raise SettingsError(f"{variable}: the secret must be at most {_MAX_DEV_SECRET_BYTES} bytes")
    if len(secret) < MIN_DEV_SECRET_BYTES:
        raise SettingsError(f"{variable}: the secret must be at least {MIN_DEV_SECRET_BYTES} bytes")
    return secret


class RemoteJWKS:
    """A JWKS URL, fetched lazily, cached, and refetched when a token names an unknown kid.

    Every fetch — first, expired cache, unknown kid, retry after a failure — is spaced at
    least `cooldown_seconds` from the previous attempt and only one runs at a time, so a flood
    of tokens with random kids costs the IdP at most one request per cooldown. When a refetch
    fails the last good set stays in use (an IdP outage must not log everyone out); with no
    good set yet, lookups raise KeysUnavailable.
    """

    def __init__(
        self,
        url: str,
        algorithms: Collection[str],
        *,
        cache_seconds: float = 300,
        cooldown_seconds: float = 30,
        timeout_seconds: float = 3.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        parts = urlsplit(url)
        # Plain http would let anyone on the path swap in their own keys; loopback is for tests.
        if not (parts.scheme == "https" or (parts.scheme == "http" and parts.hostname in _LOOPBACK_HOSTS)):
            raise SettingsError(f"{PREFIX}AUTH_JWKS_URL must be an https URL")
        if not parts.hostname:
            raise SettingsError(f"{PREFIX}AUTH_JWKS_URL has no host")
        self._url = url
        self._algorithms = frozenset(algorithms)
        self._cache_seconds = cache_seconds
        self._cooldown_seconds = cooldown_seconds
        self._timeout_seconds = timeout_seconds
        self._clock = clock
        self._keys: tuple[VerificationKey, ...] | None = None
        self._fetched_at = 0.0
        self._attempted_at: float | None = None
        self._lock = anyio.Lock()

    async def get_key(self, kid: str | None, algorithm: str) -> VerificationKey | None:
        if self._keys is None or self._clock() - self._fetched_at >= self._cache_seconds:
            await self._refresh()
        key = select(self._keys or (), kid, algorithm)
        if key is None:
            await self._refresh()  # rotation: the IdP may have published a new key since
            key = select(self._keys or (), kid, algorithm)
        if self._keys is None:
            raise KeysUnavailable
        return key

    async def ready(self) -> bool:
        if self._keys is None:
            await self._refresh()
        return self._keys is not None

    def _may_fetch(self) -> bool:
        return self._attempted_at is None or self._clock() - self._attempted_at >= self._cooldown_seconds

    async def _refresh(self) -> None:
        if not self._may_fetch():
            return
        async with self._lock:
            if not self._may_fetch():  # another task fetched while this one waited
                return
            self._attempted_at = self._clock()
            try:
                keys = parse_jwks(await self._fetch(), self._algorithms)
            except JWKSError as exc:
                # Only the fixed code is logged: the URL may carry a credential, the body is foreign.
                log.warning("jwks fetch failed: %s; %s", exc.code, self._fallback())
                return
            self._keys = keys
            self._fetched_at = self._clock()

    def _fallback(self) -> str:
        return "keeping the previous key set" if self._keys else "no keys yet"

    async def _fetch(self) -> bytes:
        body = bytearray()
        try:
            # fail_after bounds the whole exchange: httpx timeouts are per read, so a server
            # dripping one byte at a time would otherwise hold a fetch open indefinitely.
            with anyio.fail_after(self._timeout_seconds):
                async with (
                    httpx2.AsyncClient(timeout=self._timeout_seconds, follow_redirects=False) as client,
                    client.stream(
                        "GET",
                        self._url,
                        # identity: a compressed body could expand far past the size cap.
                        headers={"Accept": "application/json", "Accept-Encoding": "identity"},
                    ) as response,
                ):
                    if response.status_code != 200:
                        raise JWKSError(f"http_{response.status_code}")
                    if response.headers.get("content-encoding", "identity").lower() != "identity":
                        raise JWKSError("encoded_body")
                    length = response.headers.get("content-length", "0")
                    if not (length.isascii() and length.isdigit()) or int(length) > MAX_JWKS_BYTES:
                        raise JWKSError("too_large")
                    async for chunk in response.aiter_raw():
                        body += chunk
                        if len(body) > MAX_JWKS_BYTES:
                            raise JWKSError("too_large")
        except TimeoutError:
            raise JWKSError("timeout") from None
        except httpx2.TimeoutException:
            raise JWKSError("timeout") from None
        except httpx2.HTTPError:
            # The message names the URL; the fixed code is enough to diagnose with the IdP.
            raise JWKSError("http_error") from None
        return bytes(body)


def allowed_algorithms(settings: AuthSettings) -> frozenset[str]:
    """HS256 alone in dev mode; otherwise the configured subset of RS256/ES256/EdDSA."""
    if settings.dev_mode:
        return frozenset({DEV_ALGORITHM})
    algorithms = frozenset(settings.algorithms)
    if not algorithms or not algorithms <= PUBLIC_ALGORITHMS:
        raise SettingsError(f"{PREFIX}AUTH_ALGORITHMS may list only {', '.join(ALLOWED_ALGORITHMS)}")
    return algorithms


def key_source(settings: AuthSettings) -> KeySource:
    """The key source the settings name; exactly one of URL, file and dev secret may be set."""
    configured = [s for s in (settings.jwks_url, settings.jwks_file, settings.dev_hs256_secret_file) if s]
    if len(configured) != 1:
        raise SettingsError(
            f"{PREFIX}AUTH_JWKS_URL, {PREFIX}AUTH_JWKS_FILE and {PREFIX}AUTH_DEV_HS256_SECRET_FILE: "
            "set exactly one (HS256 dev mode is never mixed with public keys)"
        )
    algorithms = allowed_algorithms(settings)
    if settings.dev_hs256_secret_file is not None:
        secret = load_dev_secret(settings.dev_hs256_secret_file)
        return StaticKeySource([VerificationKey(None, DEV_ALGORITHM, secret)])
    if settings.jwks_file is not None:
        return load_key_file(settings.jwks_file, algorithms)
    assert settings.jwks_url is not None
    return RemoteJWKS(
        settings.jwks_url,
        algorithms,
        cache_seconds=settings.jwks_cache_seconds,
        cooldown_seconds=settings.jwks_refresh_cooldown_seconds,
        timeout_seconds=settings.jwks_fetch_timeout_seconds,
    )
