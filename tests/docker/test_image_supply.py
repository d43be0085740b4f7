"""`docbroker image build --sign-key` and `docbroker image verify`, from the attacker's side,
on the real server image in the real daemon (issue 27 items 2-4, 7).

The module builds once: `docbroker image build server --sign-key` with this checkout, which
Docker's cache makes the image `.ci/docker.sh` already built (so no other test sees its image
change), and records it in a folder of its own. Every attack then works on copies of those
records and on one tiny image derived from the real one (a file added), tagged with a name of
its own: retagging `docbroker-server:latest` itself would swap the image under the other
Docker tests running beside these; `verify` resolves whatever name it is given to an id, so a
private name is the same attack.
"""

from __future__ import annotations

import base64
import hashlib
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from broker.images import IMAGE_TAGS, WHEELHOUSE
from broker.supply.content import canonical_name
from broker.supply.provenance import load_signing_key, record_paths, sign_statement, write_keypair
from broker.supply.records import lock_file
from broker.testing import ROOT
from tests.docker.conftest import PYTHON, docker_hosts

# The first build of a session may rebuild the base (an outdated one) and the server image.
pytestmark = [pytest.mark.docker, pytest.mark.timeout(900)]

SERVER = IMAGE_TAGS["server"]
DERIVED = "docbroker-server:supply-test-derived"
SITE = "opt/venv/lib/python3.11/site-packages"
LIST_DISTS = (
    "import importlib.metadata as m, json; "
    "print(json.dumps(sorted([d.metadata['Name'], d.version] for d in m.distributions())))"
)


@dataclass(frozen=True)
class Built:
    host: str
    image_id: str
    records: Path  # what the build wrote: never changed by a test
    key: Path  # the release key (private) and key.pub
    build_stderr: str

    @property
    def pub(self) -> Path:
        return self.key.with_name(self.key.name + ".pub")


def cli(host: str, records: Path, *args: str, **extra: str) -> subprocess.CompletedProcess[str]:
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "PYTHONPATH": str(ROOT),
        "DOCBROKER_DOCKER_HOST": host,
        "DOCBROKER_IMAGE_RECORDS": str(records),
        **extra,
    }
    return subprocess.run([sys.executable, "-m", "broker", *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=880)  # fmt: skip


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Built:
    import docker

    host = docker_hosts()[0]  # the rootful daemon builds the images (.ci/docker.sh)
    folder = tmp_path_factory.mktemp("supply")
    key = folder / "release.key"
    assert cli(host, folder / "records", "image", "keygen", "--out", str(key)).returncode == 0
    done = cli(host, folder / "records", "image", "build", "server", "--sign-key", str(key))
    assert done.returncode == 0, done.stderr[-3000:]
    client = docker.DockerClient(base_url=host)
    try:
        image_id = client.images.get(SERVER).id
    finally:
        client.close()
    return Built(host, image_id, folder / "records", key, done.stderr)


@pytest.fixture(scope="module")
def derived(built: Built) -> Iterator[str]:
    """The real image plus one installed distribution the SBOM does not name, under its own tag."""
    import docker

    files = {
        f"{SITE}/evil-6.6.6.dist-info/METADATA": b"Metadata-Version: 2.1\nName: evil\nVersion: 6.6.6\n",
        f"{SITE}/evil-6.6.6.dist-info/RECORD": b"evil.py,,\n",
        f"{SITE}/evil.py": b"import os\n",
    }
    dockerfile = f"FROM {built.image_id}\n" + "".join(f"COPY {p} /{p}\n" for p in files)
    context = io.BytesIO()
    with tarfile.open(fileobj=context, mode="w") as archive:
        for name, data in {**files, "Dockerfile": dockerfile.encode()}.items():
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), 0o644
            archive.addfile(info, io.BytesIO(data))
    context.seek(0)
    client = docker.DockerClient(base_url=built.host)
    try:
        image, _logs = client.images.build(
            fileobj=context, custom_context=True, tag=DERIVED, rm=True, pull=False
        )
        assert image.id != built.image_id
        yield str(image.id)
        client.images.remove(DERIVED, force=True)
    finally:
        client.close()


def records_copy(built: Built, tmp_path: Path) -> Path:
    copy = tmp_path / "records"
    shutil.copytree(built.records, copy)
    return copy


def statement(envelope_path: Path) -> dict[str, Any]:
    return dict(json.loads(base64.b64decode(json.loads(envelope_path.read_bytes())["payload"])))


def resign(
    built: Built, envelope_path: Path, key: Path, *, image_id: str | None = None, **predicate: str
) -> None:
    """Write a provenance for `image_id` with `predicate` changed, signed by `key`: consistently."""
    old = statement(envelope_path)
    fields = {**old["predicate"], **predicate}
    envelope = sign_statement(
        load_signing_key(key),
        image_name=SERVER,
        image_digest=image_id or built.image_id,
        sbom_sha256=fields["sbom_sha256"],
        lock_sha256=fields["lock_sha256"],
        source_revision=fields["source_revision"],
        content_digest=fields["content_digest"],
        builder=fields["builder"],
    )
    envelope_path.write_bytes(envelope)


def verify(built: Built, records: Path, image: str = SERVER, *keys: Path) -> subprocess.CompletedProcess[str]:
    args = ["image", "verify", image]
    for key in keys or (built.pub,):
        args += ["--key", str(key)]
    return cli(built.host, records, *args)


def refused(done: subprocess.CompletedProcess[str], reason: str) -> None:
    assert done.returncode == 1, done.stdout + done.stderr
    assert done.stdout == ""
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
    assert lines[0].startswith("docbroker image verify: NOT verified: ")
    assert reason in lines[0], lines[0]


# --- what a build records ----------------------------------------------------------------------


def test_the_build_records_a_signed_provenance_that_verifies(built: Built) -> None:
    paths = record_paths(built.records, built.image_id)
    said = statement(paths.provenance)
    assert said["subject"] == [{"name": SERVER, "digest": {"sha256": built.image_id.removeprefix("sha256:")}}]
    predicate = said["predicate"]
    assert predicate["sbom_sha256"] == hashlib.sha256(paths.sbom.read_bytes()).hexdigest()
    assert predicate["lock_sha256"] == hashlib.sha256(lock_file().read_bytes()).hexdigest()
    head = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True
    ).stdout
    assert predicate["source_revision"].removesuffix("-dirty") == head.strip()
    assert predicate["content_digest"].startswith("sha256:")
    assert (
        f"{SERVER}: {built.image_id} content {predicate['content_digest']}, signed by key"
        in built.build_stderr
    )
    # no IMAGE: the broker's own, DOCBROKER_DOCKER_IMAGE (by default docbroker-server:latest)
    done = cli(built.host, built.records, "image", "verify", "--key", str(built.pub))
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"verified: {built.image_id} signed by key ")
    assert len(done.stdout.strip().splitlines()) == 1


def test_the_sbom_names_every_distribution_in_the_image_and_the_debian_packages(built: Built) -> None:
    import docker
    from cyclonedx.schema import SchemaVersion
    from cyclonedx.validation.json import JsonStrictValidator

    sbom = record_paths(built.records, built.image_id).sbom.read_text()
    assert JsonStrictValidator(SchemaVersion.V1_6).validate_str(sbom) is None
    components = json.loads(sbom)["components"]
    pypi = {
        (canonical_name(c["name"]), c["version"]): c
        for c in components
        if c.get("purl", "").startswith("pkg:pypi/")
    }
    # what the image's own Python says is installed, asked with no network
    client = docker.DockerClient(base_url=built.host)
    try:
        run = [PYTHON, "-c", LIST_DISTS]
        out = client.containers.run(built.image_id, entrypoint=run, network_disabled=True, remove=True)
    finally:
        client.close()
    installed = {(canonical_name(n), v) for n, v in json.loads(out.decode().strip().splitlines()[-1])}
    assert set(pypi) == installed and len(installed) > 10
    for (name, version), component in pypi.items():
        (wheel,) = [w for w in WHEELHOUSE.glob("*.whl") if canonical_name(w.name.split("-")[0]) == name
                    and w.name.split("-")[1] == version]  # fmt: skip
        assert component["hashes"] == [
            {"alg": "SHA-256", "content": hashlib.sha256(wheel.read_bytes()).hexdigest()}
        ]
    debian = {c["name"] for c in components if c.get("purl", "").startswith("pkg:deb/debian/")}
    assert {"libc6", "python3.11", "ca-certificates"} <= debian and len(debian) > 30


# --- attacks -----------------------------------------------------------------------------------


def test_a_provenance_signed_by_another_key_fails(built: Built, tmp_path: Path) -> None:
    records = records_copy(built, tmp_path)
    attacker = tmp_path / "attacker.key"
    write_keypair(attacker, tmp_path / "attacker.pub")
    resign(built, record_paths(records, built.image_id).provenance, attacker)  # the same claims
    refused(verify(built, records), "provenance is not signed by a trusted key")
    # and its key is not trusted just because it is the one that signed
    assert verify(built, records, SERVER, tmp_path / "attacker.pub").returncode == 0


def test_a_different_image_under_the_name_fails(built: Built, derived: str, tmp_path: Path) -> None:
    refused(verify(built, built.records, DERIVED), "no provenance is recorded for this image")
    # the genuine records copied to the other image's names: signed, but for another subject
    records = records_copy(built, tmp_path)
    genuine, planted = record_paths(records, built.image_id), record_paths(records, derived)
    shutil.copy(genuine.provenance, planted.provenance)
    shutil.copy(genuine.sbom, planted.sbom)
    refused(verify(built, records, DERIVED), f"the provenance is for another image, not {derived}")


def test_an_sbom_hiding_a_package_of_the_image_fails_even_when_signed(
    built: Built, derived: str, tmp_path: Path
) -> None:
    # The release key signs the derived image with the genuine SBOM (which lacks the added
    # distribution), the SBOM's image id and content digest made to match: only the packages differ.
    import docker

    from broker.supply.content import scan_image

    client = docker.DockerClient(base_url=built.host)
    try:
        scan = scan_image(client, derived, lambda _line: None)
    finally:
        client.close()
    records = records_copy(built, tmp_path)
    genuine, planted = record_paths(records, built.image_id), record_paths(records, derived)
    sbom = json.loads(genuine.sbom.read_bytes())
    for prop in sbom["metadata"]["component"]["properties"]:
        prop["value"] = {"docbroker:image-id": derived, "docbroker:content-digest": scan.content_digest}[
            prop["name"]
        ]
    planted.sbom.write_bytes(json.dumps(sbom).encode())
    shutil.copy(genuine.provenance, planted.provenance)
    sbom_sha256 = hashlib.sha256(planted.sbom.read_bytes()).hexdigest()
    resign(built, planted.provenance, built.key, image_id=derived, sbom_sha256=sbom_sha256,
           content_digest=scan.content_digest)  # fmt: skip
    refused(verify(built, records, DERIVED), "the SBOM disagrees with the image: 1 Python distribution")


def test_an_edited_sbom_fails_signed_again_or_not(built: Built, tmp_path: Path) -> None:
    records = records_copy(built, tmp_path)
    paths = record_paths(records, built.image_id)
    sbom = json.loads(paths.sbom.read_bytes())
    target = next(c for c in sbom["components"] if c.get("purl", "").startswith("pkg:pypi/"))
    target["version"] = "0.0.1"  # claims an older version than the image holds
    paths.sbom.write_bytes(json.dumps(sbom).encode())
    refused(verify(built, records), "the SBOM is not the one the provenance signed")
    resign(
        built, paths.provenance, built.key, sbom_sha256=hashlib.sha256(paths.sbom.read_bytes()).hexdigest()
    )
    refused(verify(built, records), "the SBOM disagrees with the image: 2 Python distribution")


def test_a_tampered_envelope_payload_fails(built: Built, tmp_path: Path) -> None:
    records = records_copy(built, tmp_path)
    path = record_paths(records, built.image_id).provenance
    envelope = json.loads(path.read_bytes())
    said = statement(path)
    said["predicate"]["lock_sha256"] = "0" * 64  # another lock file, the old signature
    envelope["payload"] = base64.b64encode(json.dumps(said).encode()).decode()
    path.write_text(json.dumps(envelope))
    refused(verify(built, records), "provenance is not signed by a trusted key")


def test_a_signed_content_digest_that_is_not_the_image_s_fails(built: Built, tmp_path: Path) -> None:
    records = records_copy(built, tmp_path)
    resign(
        built,
        record_paths(records, built.image_id).provenance,
        built.key,
        content_digest="sha256:" + "0" * 64,
    )
    refused(verify(built, records), "the image's content differs from the signed content digest")


def test_an_unknown_image_or_no_key_is_one_clear_line(built: Built, tmp_path: Path) -> None:
    refused(
        verify(built, built.records, "docbroker-server:no-such-tag"), "the image is not in the daemon's store"
    )
    elsewhere = {"DOCBROKER_DOCKER_IMAGE": "docbroker-server:no-such-tag"}  # what the broker would run
    refused(
        cli(built.host, built.records, "image", "verify", "--key", str(built.pub), **elsewhere), "not in the"
    )
    done = cli(built.host, built.records, "image", "verify", SERVER)
    assert done.returncode == 2 and "no trust key" in done.stderr and "Traceback" not in done.stderr
    (tmp_path / "bad.pub").write_text("not a key")
    done = verify(built, built.records, SERVER, tmp_path / "bad.pub")
    assert done.returncode == 2 and done.stderr.strip().endswith("trust key bad.pub: not a PEM public key")


def test_records_that_cannot_be_written_are_one_clear_error(built: Built, tmp_path: Path) -> None:
    import docker

    from broker.supply.records import RecordError, record_image

    (tmp_path / "file").write_text("a file where the records folder should be")
    client = docker.DockerClient(base_url=built.host)
    try:
        with pytest.raises(RecordError, match=r"^the records folder cannot be written \(Not a directory\)$"):
            record_image(client, built.image_id, None, tmp_path / "file" / "records", lambda _line: None)
    finally:
        client.close()
