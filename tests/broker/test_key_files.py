"""Every key file is read one way (broker/files.py), whatever an attacker planted at its path.

A FIFO must not hang start-up, a link to /dev/zero must not fill memory, a symlink must not
stand in for a private key, an open mode must be refused, and no error quotes the content.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from broker.audit.checkpoint import KeyFileError, load_public_key, load_signing_key, public_pem
from broker.auth.keys import load_dev_secret, load_key_file
from broker.files import FileTooLargeError, UnsafeFileError, open_regular, read_bounded
from broker.master_key import MasterKeyError, load_master_key
from broker.settings import ALLOWED_ALGORITHMS, SettingsError

CANARY = "c4n4ry-key-content-never-in-an-error"


def _master(path: Path) -> object:
    return load_master_key(path)


def _signing(path: Path) -> object:
    return load_signing_key(path)


def _dev_secret(path: Path) -> object:
    return load_dev_secret(path)


PRIVATE_LOADERS: list[tuple[str, Callable[[Path], object], type[Exception], bytes]] = [
    ("master key", _master, MasterKeyError, (b"ab" * 32) + b"\n"),
    (
        "audit signing key",
        _signing,
        KeyFileError,
        Ed25519PrivateKey.generate().private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        ),
    ),
    ("dev secret", _dev_secret, SettingsError, b"s" * 40),
]
IDS = [name for name, *_ in PRIVATE_LOADERS]


def _good(tmp_path: Path, content: bytes) -> Path:
    path = tmp_path / "good.key"
    path.write_bytes(content)
    path.chmod(0o600)
    return path


@pytest.mark.parametrize(("name", "load", "error", "content"), PRIVATE_LOADERS, ids=IDS)
def test_a_good_private_key_file_loads(
    tmp_path: Path, name: str, load: Callable[[Path], object], error: type[Exception], content: bytes
) -> None:
    assert load(_good(tmp_path, content))


@pytest.mark.timeout(10)  # the old stat-then-read blocked forever in open() on a FIFO
@pytest.mark.parametrize(("name", "load", "error", "content"), PRIVATE_LOADERS, ids=IDS)
def test_a_fifo_is_refused_at_once(
    tmp_path: Path, name: str, load: Callable[[Path], object], error: type[Exception], content: bytes
) -> None:
    fifo = tmp_path / "planted.key"
    os.mkfifo(fifo, 0o600)
    with pytest.raises(error, match="not a regular file"):
        load(fifo)


@pytest.mark.parametrize(("name", "load", "error", "content"), PRIVATE_LOADERS, ids=IDS)
def test_a_symlink_never_stands_in_for_a_private_key(
    tmp_path: Path, name: str, load: Callable[[Path], object], error: type[Exception], content: bytes
) -> None:
    # Even to a perfectly good key: whoever planted the link chose what the broker signs with.
    link = tmp_path / "link.key"
    link.symlink_to(_good(tmp_path, content))
    with pytest.raises(error, match="symbolic link"):
        load(link)
    zero = tmp_path / "zero.key"
    zero.symlink_to("/dev/zero")
    with pytest.raises(error, match="symbolic link"):
        load(zero)


@pytest.mark.parametrize(("name", "load", "error", "content"), PRIVATE_LOADERS, ids=IDS)
def test_an_open_mode_or_a_folder_is_refused(
    tmp_path: Path, name: str, load: Callable[[Path], object], error: type[Exception], content: bytes
) -> None:
    path = _good(tmp_path, content)
    path.chmod(0o644)
    with pytest.raises(error, match="group or others"):
        load(path)
    folder = tmp_path / "folder.key"
    folder.mkdir()
    with pytest.raises(error, match="not a regular file"):
        load(folder)


@pytest.mark.parametrize(("name", "load", "error", "content"), PRIVATE_LOADERS, ids=IDS)
def test_a_huge_file_is_refused_without_reading_it_whole_and_never_quoted(
    tmp_path: Path, name: str, load: Callable[[Path], object], error: type[Exception], content: bytes
) -> None:
    huge = tmp_path / "huge.key"
    with huge.open("wb") as f:  # sparse: 1 GiB that costs no disk
        f.write(CANARY.encode())
        f.truncate(1 << 30)
    huge.chmod(0o600)
    with pytest.raises(error) as caught:
        load(huge)
    assert CANARY not in str(caught.value)
    assert "huge.key" in str(caught.value) or "at most" in str(caught.value)


@pytest.mark.timeout(10)
def test_public_keys_may_be_links_but_never_fifos_or_devices(tmp_path: Path) -> None:
    public = tmp_path / "audit.pub"
    public.write_text(public_pem(Ed25519PrivateKey.generate().public_key()), encoding="ascii")
    link = tmp_path / "link.pub"
    link.symlink_to(public)
    assert load_public_key(str(link))  # an operator's link to a public key is fine
    fifo = tmp_path / "fifo.pub"
    os.mkfifo(fifo)
    with pytest.raises(KeyFileError, match="not a regular file"):
        load_public_key(str(fifo))
    zero = tmp_path / "zero.pub"
    zero.symlink_to("/dev/zero")
    with pytest.raises(KeyFileError, match="not a regular file"):
        load_public_key(str(zero))
    jwks_fifo = tmp_path / "jwks.json"
    os.mkfifo(jwks_fifo)
    with pytest.raises(SettingsError, match="not a regular file"):
        load_key_file(jwks_fifo, ALLOWED_ALGORITHMS)


def test_read_bounded_returns_at_most_the_limit(tmp_path: Path) -> None:
    path = tmp_path / "f"
    path.write_bytes(b"x" * 100)
    assert read_bounded(path, 100) == b"x" * 100
    with pytest.raises(FileTooLargeError):
        read_bounded(path, 99)
    with pytest.raises(UnsafeFileError, match="cannot be read"):
        read_bounded(tmp_path / "absent", 10)


def test_open_regular_leaves_a_blocking_descriptor(tmp_path: Path) -> None:
    path = tmp_path / "f"
    path.write_bytes(b"data")
    fd = open_regular(path)
    try:
        assert os.get_blocking(fd)
    finally:
        os.close(fd)
