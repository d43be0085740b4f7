"""Signed provenance (broker/supply/provenance.py), from the forger's side: real Ed25519 keys
on disk, real envelopes; every refusal is checked for its one-line message and for not
echoing what the attacker wrote."""

from __future__ import annotations

import base64
import json
import os
import stat
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ec import SECP256R1, generate_private_key
from securesystemslib.dsse import Envelope

from broker.supply.provenance import (
    PAYLOAD_TYPE,
    PREDICATE_TYPE,
    STATEMENT_TYPE,
    Provenance,
    ProvenanceError,
    SigningKey,
    TrustKey,
    load_signing_key,
    load_trust_keys,
    record_paths,
    sign_statement,
    verify_envelope,
    write_keypair,
)

DIGEST = "sha256:" + "ab" * 32
FIELDS: dict[str, str] = {
    "image_name": "docbroker-server:latest",
    "image_digest": DIGEST,
    "sbom_sha256": "11" * 32,
    "lock_sha256": "22" * 32,
    "source_revision": "33" * 20,
    "content_digest": "sha256:" + "44" * 32,
    "builder": "docbroker image build",
}


Release = tuple[SigningKey, list[TrustKey], Path]


def _pair(tmp_path: Path, name: str) -> Release:
    private, public = tmp_path / f"{name}.key", tmp_path / f"{name}.pub"
    write_keypair(private, public)
    return load_signing_key(private), load_trust_keys([public]), public


@pytest.fixture
def release(tmp_path: Path) -> Release:
    return _pair(tmp_path, "release")


def _resign(envelope: bytes, key: SigningKey, edit: Any) -> bytes:
    """The envelope's statement changed by `edit` and signed again, consistently, with `key`."""
    data = json.loads(envelope)
    statement = json.loads(base64.b64decode(data["payload"]))
    edit(statement)
    fresh = Envelope(json.dumps(statement).encode(), PAYLOAD_TYPE, {})
    fresh.sign(key.signer)
    return json.dumps(fresh.to_dict()).encode()


def test_a_signed_statement_verifies_and_says_what_was_signed(release: Release) -> None:
    key, trust, _ = release
    envelope = sign_statement(key, **FIELDS)
    data = json.loads(envelope)
    assert data["payloadType"] == PAYLOAD_TYPE
    statement = json.loads(base64.b64decode(data["payload"]))
    assert statement["_type"] == STATEMENT_TYPE
    assert statement["predicateType"] == PREDICATE_TYPE
    assert statement["subject"] == [{"name": "docbroker-server:latest", "digest": {"sha256": "ab" * 32}}]
    assert verify_envelope(envelope, trust) == Provenance(
        image_digest=DIGEST,
        sbom_sha256=FIELDS["sbom_sha256"],
        lock_sha256=FIELDS["lock_sha256"],
        source_revision=FIELDS["source_revision"],
        content_digest=FIELDS["content_digest"],
        key_id=key.key_id,
    )


def test_signed_by_another_key_is_refused(tmp_path: Path, release: Release) -> None:
    _, trust, _ = release
    other, _, _ = _pair(tmp_path, "attacker")
    with pytest.raises(ProvenanceError, match=r"^provenance is not signed by a trusted key$"):
        verify_envelope(sign_statement(other, **FIELDS), trust)


def test_an_attacker_naming_the_trusted_key_id_is_refused(tmp_path: Path, release: Release) -> None:
    key, trust, _ = release
    other, _, _ = _pair(tmp_path, "attacker")
    data = json.loads(sign_statement(other, **FIELDS))
    data["signatures"][0]["keyid"] = key.key_id  # claims the release key's id, signs with its own
    with pytest.raises(ProvenanceError, match="not signed by a trusted key"):
        verify_envelope(json.dumps(data).encode(), trust)


def test_two_trusted_keys_during_rotation(tmp_path: Path, release: Release) -> None:
    old, _, old_pub = release
    new, _, new_pub = _pair(tmp_path, "next")
    both = load_trust_keys([old_pub, new_pub])
    assert verify_envelope(sign_statement(old, **FIELDS), both).key_id == old.key_id
    assert verify_envelope(sign_statement(new, **FIELDS), both).key_id == new.key_id
    # after the rotation, the old key's images are no longer accepted
    with pytest.raises(ProvenanceError, match="not signed by a trusted key"):
        verify_envelope(sign_statement(old, **FIELDS), load_trust_keys([new_pub]))


def test_a_tampered_payload_is_refused(release: Release) -> None:
    key, trust, _ = release
    data = json.loads(sign_statement(key, **FIELDS))
    statement = json.loads(base64.b64decode(data["payload"]))
    statement["subject"][0]["digest"]["sha256"] = "cd" * 32  # another image, old signature
    data["payload"] = base64.b64encode(json.dumps(statement).encode()).decode()
    with pytest.raises(ProvenanceError, match="not signed by a trusted key"):
        verify_envelope(json.dumps(data).encode(), trust)


def test_a_changed_payload_type_is_refused(release: Release) -> None:
    key, trust, _ = release
    data = json.loads(sign_statement(key, **FIELDS))
    data["payloadType"] = "application/json"
    with pytest.raises(ProvenanceError, match="payload type is not in-toto"):
        verify_envelope(json.dumps(data).encode(), trust)


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda s: s["subject"].append(dict(s["subject"][0])), "exactly one subject"),
        (lambda s: s.update(subject=[]), "exactly one subject"),
        (lambda s: s["subject"][0].update(digest={"sha512": "00"}), "no sha256 digest"),
        (lambda s: s["subject"][0]["digest"].update(sha256="../../etc/passwd"), "no sha256 digest"),
        (lambda s: s.update(_type="https://in-toto.io/Statement/v0.1"), "not an in-toto v1 statement"),
        (lambda s: s.update(predicateType="https://slsa.dev/provenance/v1"), "not a docbroker image build"),
        (lambda s: s["predicate"].pop("sbom_sha256"), "has no sbom_sha256"),
        (lambda s: s["predicate"].update(content_digest="md5:evil\x1b[31m"), "content_digest is malformed"),
        (lambda s: s["predicate"].update(source_revision="main; rm -rf /"), "source_revision is malformed"),
    ],
)
def test_a_signed_statement_of_the_wrong_shape_is_refused(release: Release, edit: Any, message: str) -> None:
    key, trust, _ = release
    forged = _resign(sign_statement(key, **FIELDS), key, edit)
    with pytest.raises(ProvenanceError, match=message) as caught:
        verify_envelope(forged, trust)
    text = str(caught.value)
    assert "\n" not in text and "evil" not in text and "rm -rf" not in text and "passwd" not in text


@pytest.mark.parametrize(
    ("envelope", "message"),
    [
        (b"", "not JSON"),
        (b"[1, 2]", "not a DSSE envelope"),
        (b'{"payload": "!!", "payloadType": "x", "signatures": [{"keyid": "k", "sig": "!!"}]}',
         "not a DSSE envelope"),
        (b'{"payload": "e30=", "payloadType": "%s", "signatures": [{"sig": "AA=="}]}' % PAYLOAD_TYPE.encode(),
         "not a DSSE envelope"),
        (b'{"payload": "e30=", "payloadType": "%s", "signatures": []}' % PAYLOAD_TYPE.encode(),
         "not signed by a trusted key"),
        (b" " * (2 * 1024 * 1024), "larger than"),
    ],
)  # fmt: skip
def test_garbage_is_one_clear_error(release: Release, envelope: bytes, message: str) -> None:
    _, trust, _ = release
    with pytest.raises(ProvenanceError, match=message):
        verify_envelope(envelope, trust)


def test_no_trust_key_verifies_nothing(release: Release) -> None:
    key, _, _ = release
    with pytest.raises(ProvenanceError, match="no trust key is configured"):
        verify_envelope(sign_statement(key, **FIELDS), [])


def test_keygen_writes_a_private_key_only_its_owner_reads_and_never_overwrites(tmp_path: Path) -> None:
    private, public = tmp_path / "release.key", tmp_path / "release.pub"
    key_id = write_keypair(private, public)
    assert stat.S_IMODE(private.stat().st_mode) == 0o600
    assert load_signing_key(private).key_id == key_id == load_trust_keys([public])[0].key_id
    before = private.read_bytes()
    with pytest.raises(ProvenanceError, match=r"^release.key: exists"):
        write_keypair(private, tmp_path / "other.pub")
    assert private.read_bytes() == before


@pytest.mark.timeout(10)
def test_bad_key_files_are_one_clear_error(tmp_path: Path, release: Release) -> None:
    _, _, public = release
    garbage = tmp_path / "garbage.pub"
    garbage.write_bytes(b"-----BEGIN PUBLIC KEY-----\nnot base64\n-----END PUBLIC KEY-----\n")
    with pytest.raises(ProvenanceError, match=r"^trust key garbage.pub: not a PEM public key$"):
        load_trust_keys([garbage])
    ec = tmp_path / "ec.pub"
    ec.write_bytes(
        generate_private_key(SECP256R1())
        .public_key()
        .public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    )
    with pytest.raises(ProvenanceError, match=r"^trust key ec.pub: not an Ed25519 key$"):
        load_trust_keys([ec])
    with pytest.raises(ProvenanceError, match=r"^trust key missing.pub: cannot be read"):
        load_trust_keys([tmp_path / "missing.pub"])
    link = tmp_path / "link.pub"
    link.symlink_to(public)  # an operator's (or a Kubernetes Secret's) link to a public key is fine
    assert load_trust_keys([link])[0].key_id == load_trust_keys([public])[0].key_id
    fifo = tmp_path / "fifo.pub"
    os.mkfifo(fifo)
    zero = tmp_path / "zero.pub"
    zero.symlink_to("/dev/zero")
    for planted in (fifo, zero):
        with pytest.raises(ProvenanceError, match="not a regular file"):
            load_trust_keys([planted])
    # the same key twice is one trusted key
    assert len(load_trust_keys([public, public])) == 1


def test_a_private_key_others_can_read_is_refused(tmp_path: Path) -> None:
    private = tmp_path / "release.key"
    write_keypair(private, tmp_path / "release.pub")
    os.chmod(private, 0o644)
    with pytest.raises(
        ProvenanceError, match=r"^signing key release.key: must not be readable by group or others"
    ):
        load_signing_key(private)
    os.chmod(tmp_path / "release.pub", 0o600)
    with pytest.raises(
        ProvenanceError, match=r"^signing key release.pub: not an unencrypted PEM private key$"
    ):
        load_signing_key(tmp_path / "release.pub")


def test_record_paths_are_named_by_the_digest_and_nothing_else(tmp_path: Path) -> None:
    paths = record_paths(tmp_path, DIGEST)
    assert paths.provenance == tmp_path / f"{'ab' * 32}.provenance.dsse.json"
    assert paths.sbom == tmp_path / f"{'ab' * 32}.sbom.cdx.json"
    for bad in ("ab" * 32, "sha256:../../x", "sha256:" + "AB" * 32, "sha512:" + "ab" * 32):
        with pytest.raises(ProvenanceError, match="sha256:<64 hex digits>"):
            record_paths(tmp_path, bad)


def test_sign_refuses_malformed_fields(release: Release) -> None:
    key, _, _ = release
    with pytest.raises(ProvenanceError, match="image digest is malformed"):
        sign_statement(key, **{**FIELDS, "image_digest": "docbroker-server:latest"})


def test_a_link_never_stands_in_for_the_signing_key(tmp_path: Path) -> None:
    private = tmp_path / "release.key"
    write_keypair(private, tmp_path / "release.pub")
    link = tmp_path / "link.key"
    link.symlink_to(private)
    with pytest.raises(ProvenanceError, match="symbolic link"):
        load_signing_key(link)
