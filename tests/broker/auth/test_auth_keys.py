"""Key sources from files and the dev secret: what is loaded, what is dropped, what is refused."""

from __future__ import annotations

import datetime as dt
import json
import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import NameOID

from broker.auth import Authenticator, AuthError, StaticKeySource, VerificationKey, key_source, load_key_file
from broker.auth.keys import PUBLIC_ALGORITHMS, load_dev_secret
from broker.settings import AuthSettings, SettingsError
from tests.broker.auth.jwt_forge import AUDIENCE, DEV_SECRET, DROP, ISSUER, NOW, Forge, public_jwk, public_pem

ALL = PUBLIC_ALGORITHMS


def _write(tmp_path: Path, name: str, data: bytes | str | dict[str, Any]) -> Path:
    path = tmp_path / name
    if isinstance(data, dict):
        data = json.dumps(data)
    path.write_bytes(data.encode() if isinstance(data, str) else data)
    return path


@pytest.mark.anyio
async def test_jwks_file_keeps_only_safe_signature_keys(
    tmp_path: Path, forge: Forge, caplog: pytest.LogCaptureFixture
) -> None:
    weak = rsa.generate_private_key(public_exponent=65537, key_size=1024)  # noqa: S505 -- the weak key under test
    p384 = ec.generate_private_key(ec.SECP384R1())
    private_jwk = public_jwk(forge.rsa_other, "leaked") | {"d": "AQAB"}
    jwks = {
        "keys": [
            public_jwk(forge.rsa, "good-rsa"),
            public_jwk(forge.ec, "good-ec"),
            public_jwk(forge.rsa, "enc", use="enc"),
            public_jwk(forge.rsa, "ops-sign-only", key_ops=["sign"]),
            public_jwk(forge.rsa, "pss", alg="PS256"),
            public_jwk(forge.ec, "ec-says-rs256", alg="RS256"),
            public_jwk(weak, "weak"),
            public_jwk(p384, "p384"),
            {"kty": "oct", "kid": "hmac", "k": "c2VjcmV0c2VjcmV0c2VjcmV0c2VjcmV0c2VjcmV0MTI"},
            private_jwk,
            {"kty": "RSA", "kid": "broken", "n": "!!", "e": "AQAB"},
            {"kty": "RSA", "kid": 7, "n": public_jwk(forge.rsa, None)["n"], "e": "AQAB"},
            "not an object",
            public_jwk(forge.rsa_other, "good-rsa"),  # duplicate (kid, alg): the first one wins
        ]
    }
    with caplog.at_level(logging.DEBUG, logger="docbroker.auth"):
        source = load_key_file(_write(tmp_path, "jwks.json", jwks), ALL)
    usable = {
        kid: await source.get_key(kid, alg)
        for kid, alg in [
            ("good-rsa", "RS256"),
            ("good-ec", "ES256"),
            ("enc", "RS256"),
            ("ops-sign-only", "RS256"),
            ("pss", "RS256"),
            ("ec-says-rs256", "ES256"),
            ("weak", "RS256"),
            ("p384", "ES256"),
            ("hmac", "HS256"),
            ("leaked", "RS256"),
            ("broken", "RS256"),
        ]
    }
    assert {kid for kid, key in usable.items() if key is not None} == {"good-rsa", "good-ec"}
    good = usable["good-rsa"]
    assert good is not None and good.key.public_numbers() == forge.rsa.public_key().public_numbers()  # type: ignore[union-attr]
    assert "private or symmetric material" in caplog.text
    assert "AQAB" not in caplog.text


@pytest.mark.anyio
async def test_single_jwk_file(tmp_path: Path, forge: Forge) -> None:
    source = load_key_file(_write(tmp_path, "jwk.json", public_jwk(forge.ed, "solo")), ALL)
    assert (await source.get_key("solo", "EdDSA")) is not None


@pytest.mark.parametrize(
    ("content", "fragment"),
    [
        ("{not json", "bad_json"),
        ({"keys": "nope"}, "bad_json"),
        ({"keys": []}, "no_usable_keys"),
        ('{"keys": [], "keys": []}', "bad_json"),
        ("[" * 3000, "bad_json"),
    ],
    ids=["not-json", "keys-not-list", "empty", "duplicate-member", "deep"],
)
def test_unusable_jwks_file_is_refused(tmp_path: Path, content: Any, fragment: str) -> None:
    with pytest.raises(SettingsError, match=fragment):
        load_key_file(_write(tmp_path, "jwks.json", content), ALL)


def test_jwks_file_without_allowed_algorithm_is_refused(tmp_path: Path, forge: Forge) -> None:
    path = _write(tmp_path, "jwks.json", {"keys": [public_jwk(forge.rsa, "r")]})
    with pytest.raises(SettingsError, match="no_usable_keys"):
        load_key_file(path, {"ES256"})


def test_oversized_or_missing_key_file_is_refused(tmp_path: Path) -> None:
    with pytest.raises(SettingsError, match="larger than"):
        load_key_file(_write(tmp_path, "big.json", " " * (64 * 1024 + 1)), ALL)
    with pytest.raises(SettingsError, match="cannot be read"):
        load_key_file(tmp_path / "absent.json", ALL)


def _certificate(key: rsa.RSAPrivateKey) -> bytes:
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "idp.example.com")])
    start = dt.datetime(2025, 1, 1, tzinfo=dt.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(1)
        .not_valid_before(start)
        .not_valid_after(start + dt.timedelta(days=3650))
        .sign(key, hashes.SHA256())
    )
    return cert.public_bytes(serialization.Encoding.PEM)


@pytest.mark.anyio
@pytest.mark.parametrize("form", ["public-key", "certificate"])
async def test_pem_file_verifies_rs256_tokens_with_or_without_kid(
    tmp_path: Path, forge: Forge, form: str
) -> None:
    pem = public_pem(forge.rsa) if form == "public-key" else _certificate(forge.rsa)
    settings = AuthSettings(issuer=ISSUER, audience=AUDIENCE, jwks_file=_write(tmp_path, "idp.pem", pem))
    auth = Authenticator(settings, lambda t: True, key_source(settings), clock=lambda: NOW)
    assert (await auth.authenticate(forge.bearer())).tenant == "acme"
    assert (await auth.authenticate(forge.bearer(header={"kid": DROP}))).tenant == "acme"
    some_kid = forge.bearer(header={"kid": "anything-the-idp-chose"})  # a PEM key has no id to compare
    assert (await auth.authenticate(some_kid)).tenant == "acme"
    with pytest.raises(AuthError) as caught:
        await auth.authenticate(forge.bearer("ES256"))  # the PEM holds an RSA key: no ES256 key
    assert caught.value.reason == "unknown_key"


@pytest.mark.parametrize(
    "make_pem",
    [
        lambda f: f.rsa.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        ),
        lambda f: public_pem(rsa.generate_private_key(public_exponent=65537, key_size=1024)),  # noqa: S505 -- under test
        lambda f: public_pem(ec.generate_private_key(ec.SECP384R1())),
        lambda f: b"-----BEGIN PUBLIC KEY-----\nnot base64\n-----END PUBLIC KEY-----\n",
    ],
    ids=["private-key", "rsa-1024", "p384", "garbage"],
)
def test_unusable_pem_is_refused(tmp_path: Path, forge: Forge, make_pem: Callable[[Forge], bytes]) -> None:
    with pytest.raises(SettingsError, match="PEM must hold"):
        load_key_file(_write(tmp_path, "idp.pem", make_pem(forge)), ALL)


def test_pem_of_a_disallowed_algorithm_is_refused(tmp_path: Path, forge: Forge) -> None:
    with pytest.raises(SettingsError, match="not allowed"):
        load_key_file(_write(tmp_path, "idp.pem", public_pem(forge.ec)), {"RS256"})


def test_dev_secret_is_stripped_and_checked(tmp_path: Path) -> None:
    good = _write(tmp_path, "good.key", DEV_SECRET + b"\n")
    os.chmod(good, 0o600)
    assert load_dev_secret(good) == DEV_SECRET
    short = _write(tmp_path, "short.key", b"x" * 31)
    os.chmod(short, 0o600)
    with pytest.raises(SettingsError, match="at least 32 bytes"):
        load_dev_secret(short)
    shared = _write(tmp_path, "shared.key", DEV_SECRET)
    os.chmod(shared, 0o640)
    with pytest.raises(SettingsError, match="group or others"):
        load_dev_secret(shared)
    huge = _write(tmp_path, "huge.key", b"x" * 5000)
    os.chmod(huge, 0o600)
    with pytest.raises(SettingsError, match="at most"):
        load_dev_secret(huge)
    with pytest.raises(SettingsError, match="cannot be read"):
        load_dev_secret(tmp_path / "absent.key")
    fifo = tmp_path / "fifo.key"
    os.mkfifo(fifo, 0o600)
    with pytest.raises(SettingsError, match="not a regular file"):
        load_dev_secret(fifo)


def test_dev_secret_never_shows_in_reprs_or_errors(dev_secret_file: Path) -> None:
    key = VerificationKey(None, "HS256", DEV_SECRET)
    assert DEV_SECRET.decode() not in repr(key)
    source = key_source(AuthSettings(issuer=ISSUER, audience=AUDIENCE, dev_hs256_secret_file=dev_secret_file))
    assert DEV_SECRET.decode() not in repr(source)


@pytest.mark.parametrize(
    "sources",
    [
        {},
        {"jwks_url": "https://idp.example.com/jwks", "jwks_file": "F"},
        {"jwks_file": "F", "dev_hs256_secret_file": "D"},
        {"jwks_url": "https://idp.example.com/jwks", "dev_hs256_secret_file": "D"},
    ],
    ids=["none", "url+file", "file+dev", "url+dev"],
)
def test_exactly_one_key_source(
    tmp_path: Path, dev_secret_file: Path, jwks_file: Path, sources: dict[str, str]
) -> None:
    paths = {"F": jwks_file, "D": dev_secret_file}
    kwargs = {k: paths.get(v, v) for k, v in sources.items()}
    with pytest.raises(SettingsError, match="set exactly one"):
        key_source(AuthSettings(issuer=ISSUER, audience=AUDIENCE, **kwargs))  # type: ignore[arg-type]


@pytest.mark.anyio
async def test_selection_needs_kid_and_algorithm_or_an_unambiguous_key(forge: Forge) -> None:
    r1 = VerificationKey("r1", "RS256", forge.rsa.public_key())
    r2 = VerificationKey("r2", "RS256", forge.rsa_other.public_key())
    e1 = VerificationKey("e1", "ES256", forge.ec.public_key())
    source = StaticKeySource([r1, r2, e1])
    assert await source.get_key("r2", "RS256") is r2
    assert await source.get_key("r2", "ES256") is None  # a kid never crosses algorithms
    assert await source.get_key(None, "RS256") is None  # two RSA keys: refuse to guess
    assert await source.get_key(None, "ES256") is e1
    assert await source.get_key("r3", "RS256") is None


@pytest.mark.parametrize(
    ("alg", "make_key"),
    [
        ("RS256", lambda f: f.ec.public_key()),
        ("ES256", lambda f: f.rsa.public_key()),
        ("EdDSA", lambda f: DEV_SECRET),
        ("HS256", lambda f: f.rsa.public_key()),
        ("HS256", lambda f: b"short"),
        ("RS256", lambda f: public_pem(f.rsa)),  # PEM bytes are not a key object
    ],
    ids=["rs-with-ec", "es-with-rsa", "eddsa-with-bytes", "hs-with-rsa", "hs-short", "rs-with-pem-bytes"],
)
def test_a_key_is_bound_to_its_algorithm(forge: Forge, alg: str, make_key: Callable[[Forge], Any]) -> None:
    with pytest.raises(ValueError):
        VerificationKey("k", alg, make_key(forge))
