"""broker/runtime/imagetrust.py from the attacker's side: real keys and envelopes on disk. The
check vouches for a digest only with a provenance signed by a configured release key that names
that very digest; everything else is ImageUntrusted, in one line, before any sandbox exists."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from broker.runtime.base import BackendRefused, ImageUntrusted, NoImageTrust
from broker.runtime.imagetrust import ImageTrust
from broker.settings import ImageSupplySettings
from broker.supply.provenance import record_paths
from tests.signed_images import Release

DIGEST = "sha256:" + "ab" * 32
OTHER = "sha256:" + "cd" * 32


@pytest.fixture
def release(tmp_path: Path) -> Release:
    return Release(tmp_path / "keys")


def trust(tmp_path: Path, *keys: Path) -> ImageTrust:
    made = ImageTrust.from_settings(ImageSupplySettings(records_dir=tmp_path / "records", trust_keys=keys))
    assert made is not None
    return made


def refusal(check: ImageTrust, digest: str = DIGEST) -> str:
    with pytest.raises(ImageUntrusted) as caught:
        check.check(digest)
    assert caught.value.reason == "image_untrusted"
    return str(caught.value)


def test_an_image_signed_by_the_release_key_passes(tmp_path: Path, release: Release) -> None:
    release.sign(tmp_path / "records", DIGEST)
    check = trust(tmp_path, release.public)
    check.check(DIGEST)
    assert check.describe() == {"state": "on", "keys": [release.key_id[:16]], "detail": "1 release key(s)"}


def test_an_unsigned_image_is_refused(tmp_path: Path, release: Release) -> None:
    release.sign(tmp_path / "records", DIGEST)
    assert "has no readable provenance" in refusal(trust(tmp_path, release.public), OTHER)


def test_a_provenance_signed_by_another_key_is_refused(tmp_path: Path, release: Release) -> None:
    attacker = Release(tmp_path / "attacker", "attacker")
    attacker.sign(tmp_path / "records", DIGEST)
    assert "not signed by a trusted key" in refusal(trust(tmp_path, release.public))


def test_a_genuine_provenance_copied_under_another_image_is_refused(tmp_path: Path, release: Release) -> None:
    """The attacker cannot sign, but can copy: the release's own statement about the real image,
    placed where the swapped image's record would be."""
    release.sign(tmp_path / "records", OTHER, subject=DIGEST)
    assert "its provenance names another image" in refusal(trust(tmp_path, release.public), OTHER)


def test_a_tampered_envelope_is_refused(tmp_path: Path, release: Release) -> None:
    path = release.sign(tmp_path / "records", DIGEST)
    text = path.read_text()
    # One character of the base64 payload changed: the signature no longer holds.
    start = text.index('"payload": "') + len('"payload": "') + 40
    path.write_text(text[:start] + ("A" if text[start] != "A" else "B") + text[start + 1 :])
    assert "not signed by a trusted key" in refusal(trust(tmp_path, release.public))


def test_a_planted_link_is_not_followed(tmp_path: Path, release: Release) -> None:
    genuine = release.sign(tmp_path / "elsewhere", DIGEST)
    records = tmp_path / "records"
    records.mkdir()
    os.symlink(genuine, record_paths(records, DIGEST).provenance)
    assert "no readable provenance" in refusal(trust(tmp_path, release.public))


def test_during_a_rotation_either_key_vouches(tmp_path: Path, release: Release) -> None:
    new = Release(tmp_path / "new", "release-2")
    release.sign(tmp_path / "records", DIGEST)
    new.sign(tmp_path / "records", OTHER)
    check = trust(tmp_path, release.public, new.public)
    check.check(DIGEST)
    check.check(OTHER)
    assert check.describe()["detail"] == "2 release key(s)"


def test_a_removed_record_withdraws_the_image_at_the_next_check(tmp_path: Path, release: Release) -> None:
    path = release.sign(tmp_path / "records", DIGEST)
    check = trust(tmp_path, release.public)
    check.check(DIGEST)
    path.unlink()
    assert "no readable provenance" in refusal(check)


def test_an_unusable_trust_key_stops_the_broker_in_one_line(tmp_path: Path) -> None:
    bad = tmp_path / "release.pub"
    bad.write_text("not a key\n")
    with pytest.raises(BackendRefused) as caught:
        ImageTrust.from_settings(ImageSupplySettings(records_dir=tmp_path, trust_keys=(bad,)))
    assert str(caught.value).startswith("DOCBROKER_IMAGE_TRUST_KEYS: ") and "\n" not in str(caught.value)
    assert "not a key" not in str(caught.value)


def test_without_keys_trust_is_off_and_says_so(tmp_path: Path) -> None:
    assert ImageTrust.from_settings(ImageSupplySettings(records_dir=tmp_path)) is None
    off = NoImageTrust()
    off.check(DIGEST)  # nothing is checked ...
    assert off.describe()["state"] == "off"  # ... and that is said, never implied
    assert "DOCBROKER_IMAGE_TRUST_KEYS" in off.describe()["reason"]
