"""A tampered wheel in the wheelhouse never reaches an image (issue 27, item 7).

The attacker (or a corrupted cache, or a mirror) swaps a file in the wheelhouse for one with the
same name: a valid wheel whose code was changed (the real threat: pip installs it without a
word when nothing checks hashes), or a file with flipped bytes. Both builds check each wheel
against the lock's sha256 (docs/supply-chain.md, "Locked dependencies"):

- `docbroker image build` fills the wheelhouse on the host first: the tampered file stops it
  there, with one line naming the package, no traceback, the file left for the operator to see.
- The image's own `pip install --require-hashes` (a wheelhouse altered after the host's check):
  a real Docker build of the server image from a real context with the poisoned wheel fails on
  its hash, and no image is tagged.

Real pip, real wheelhouse copies in tmp, the rootful daemon (it is the one that builds images).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import uuid
import zipfile
from collections.abc import Callable
from pathlib import Path

import pytest

from broker import images
from tests.docker.conftest import docker_hosts

pytestmark = pytest.mark.docker

ROOT = Path(__file__).resolve().parents[2]
VICTIM = "starlette"  # in the server image: every sandbox imports it


def _victim_wheel(wheelhouse: Path) -> Path:
    wheels = sorted(wheelhouse.glob(f"{VICTIM}-*.whl"))
    assert len(wheels) == 1, (
        f"the wheelhouse ({wheelhouse}) must hold one {VICTIM} wheel: build the images first"
    )
    return wheels[0]


def _poison(wheel: Path) -> None:
    """Same name, still a valid wheel that pip installs, one line of code added to the package."""
    original = wheel.read_bytes()
    wheel.unlink()  # never write through a hard link into the real wheelhouse
    source = wheel.with_suffix(".orig")
    source.write_bytes(original)
    with zipfile.ZipFile(source) as zin, zipfile.ZipFile(wheel, "w", zipfile.ZIP_DEFLATED) as zout:
        for item in zin.infolist():
            data = zin.read(item)
            if item.filename == f"{VICTIM}/__init__.py":
                data += b"\nimport os as _os  # tampered\n"
            zout.writestr(item, data)
    source.unlink()


def _flip_bytes(wheel: Path) -> None:
    data = bytearray(wheel.read_bytes())
    wheel.unlink()
    middle = len(data) // 2
    data[middle : middle + 16] = bytes(b ^ 0xFF for b in data[middle : middle + 16])
    wheel.write_bytes(bytes(data))


def _scratch_checkout(tmp_path: Path) -> Path:
    """What `docbroker image build` reads of a checkout, with a copy of the filled wheelhouse."""
    scratch = tmp_path / "checkout"
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "wheelhouse", "rootfs")
    for name in ("broker", "server", "deploy", "policies", "requirements"):
        shutil.copytree(ROOT / name, scratch / name, ignore=ignore)
    for name in ("pyproject.toml", "README.md", "uv.lock"):
        shutil.copy2(ROOT / name, scratch / name)
    (scratch / "deploy" / "wheelhouse").mkdir()
    for wheel in images.WHEELHOUSE.glob("*.whl"):
        shutil.copy2(wheel, scratch / "deploy" / "wheelhouse" / wheel.name)
    return scratch


@pytest.mark.parametrize("tamper", [_poison, _flip_bytes], ids=["poisoned", "flipped-bytes"])
def test_image_build_stops_on_a_tampered_wheel_with_one_line(
    tmp_path: Path, tamper: Callable[[Path], None]
) -> None:
    scratch = _scratch_checkout(tmp_path)
    wheel = _victim_wheel(scratch / "deploy" / "wheelhouse")
    tamper(wheel)
    tampered = wheel.read_bytes()
    version = wheel.name.split("-")[1]
    env = {**os.environ, "DOCKER_HOST": docker_hosts()[0], "PYTHONPATH": str(scratch)}
    result = subprocess.run(
        [sys.executable, "-m", "broker", "image", "build", "server"],
        cwd=scratch,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 1, result.stderr[-2000:]
    assert "Traceback" not in result.stderr
    last = result.stderr.strip().splitlines()[-1]
    assert last == (
        f"docbroker image build: wheelhouse: {VICTIM}=={version} in deploy/wheelhouse does not match "
        "the lock's hash (requirements/server.txt); remove the file and build again"
    )
    assert "docbroker-server:latest: built" not in result.stderr
    assert wheel.read_bytes() == tampered, "the tampered wheel must be left for the operator, not replaced"


def test_the_images_pip_install_refuses_a_tampered_wheel(tmp_path: Path) -> None:
    """The Dockerfile's own check, on a wheelhouse altered after the host's: a real build fails."""
    import docker

    context = tmp_path / "context"
    context.mkdir()
    images._make_context(context, "server")  # the real context, wheels hard-linked from deploy/
    wheel = _victim_wheel(context / "wheelhouse")
    _poison(wheel)
    tag = f"docbroker-tamper-test:{uuid.uuid4().hex[:12]}"
    lines: list[str] = []
    client = docker.DockerClient(base_url=docker_hosts()[0])
    try:
        stream = client.api.build(
            path=str(context),
            dockerfile="Dockerfile",
            tag=tag,
            buildargs={"BASE": images.DEFAULT_BASE},
            rm=True,
            forcerm=True,
            pull=False,
            decode=True,
        )
        with pytest.raises(images.ImageBuildError) as failed:
            images._follow_build(stream, lines.append, tag)
        version = wheel.name.split("-")[1]
        assert str(failed.value) == (
            f"building {tag} failed: {VICTIM}=={version} in the build's wheelhouse does not match "
            "the lock's hash"
        )
        assert any("DO NOT MATCH THE HASHES" in line for line in lines)  # pip's own report
        with pytest.raises(docker.errors.ImageNotFound):
            client.images.get(tag)
    finally:
        try:
            client.images.remove(tag, force=True)
        except docker.errors.ImageNotFound:
            pass
        client.close()
