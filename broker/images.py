"""Build the container images: base (debootstrap), wheelhouse, server and broker images.

    build_images(["server", "broker"], base=None, progress=print)

Offline by design: the base image comes from Debian packages (`deploy/base-image.sh`), every
Python dependency from a wheelhouse that pip fills on the host (`deploy/wheelhouse`), and the
Dockerfiles never reach the network. Both pip steps, on the host and in the image, install only
wheels whose sha256 is the lock's (`requirements/*.txt`, exported from uv.lock by `./dev lock`;
docs/supply-chain.md). Users with a registry pass `base="python:3.11-slim"`.

The build context is a temporary folder holding only what a Dockerfile copies, so a build
sends a few MB to the daemon, never the repository, a data dir or a venv.

Exceptions:

    ImageError
     └── ImageBuildError     the daemon, pip or the base-image script reported a failure
"""

from __future__ import annotations

import hashlib
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]
DEPLOY_DIR = REPO_ROOT / "deploy"
WHEELHOUSE = DEPLOY_DIR / "wheelhouse"
DEFAULT_BASE = "docbroker-base:bookworm"
# What deploy/base-image.sh leaves in the base (its LAYOUT, the image's label): a base made by
# an older script is rebuilt. 2: dpkg's status file is kept, the Debian packages of the SBOM.
BASE_LAYOUT = "2"
BASE_LAYOUT_LABEL = "io.docbroker.base-layout"
IMAGE_TAGS = {"server": "docbroker-server:latest", "broker": "docbroker-broker:latest"}
# What each image installs: hashed exports of uv.lock (`./dev lock`), the only lists of pins.
LOCKED = {name: REPO_ROOT / "requirements" / f"{name}.txt" for name in IMAGE_TAGS}
# The Python of the default base (Debian bookworm). Wheels are fetched for it, not for the
# host's interpreter, so a host with another Python still fills a usable wheelhouse.
TARGET_PYTHON = "3.11"

Progress = Callable[[str], None]


class ImageError(Exception):
    """Images cannot be built or found."""


@dataclass(frozen=True)
class BuiltImage:
    tag: str
    image_id: str  # "sha256:…", as the daemon reported it for this build


class ImageBuildError(ImageError):
    """A build step failed; the message says which step, the progress stream shows why."""


def build_images(
    which: list[str],
    base: str | None,
    progress: Progress,
    *,
    base_url: str | None = None,
    no_cache: bool = False,
    tags: dict[str, str] | None = None,
) -> dict[str, BuiltImage]:
    """Build the named images ("server", "broker") into the daemon at `base_url` (or DOCKER_HOST).

    `no_cache`: every step runs again (a build from a clean state); `tags`: other tags than
    IMAGE_TAGS for some images (tests). Returns each built image: its tag and its id."""
    unknown = sorted(set(which) - set(IMAGE_TAGS))
    if unknown or not which:
        names = ", ".join(unknown) or "(none)"
        raise ImageError(f"unknown image(s): {names}; choose from {', '.join(IMAGE_TAGS)}")
    if not (DEPLOY_DIR / "server.Dockerfile").is_file():
        raise ImageError("deploy/ is not next to this package: build images from a docbroker source checkout")
    client = docker_client(base_url)
    try:
        base_image = base or DEFAULT_BASE
        if base is None:
            ensure_base(client, base_image, progress, base_url=base_url)
        build_wheelhouse(with_broker="broker" in which, progress=progress)
        built = {}
        for name in which:
            tag = (tags or {}).get(name, IMAGE_TAGS[name])
            built[name] = BuiltImage(
                tag, _build_one(client, name, tag, base_image, progress, no_cache=no_cache)
            )
        return built
    finally:
        client.close()


# --- the base image --------------------------------------------------------------------------


def ensure_base(client: Any, image: str, progress: Progress, *, base_url: str | None = None) -> None:
    """Build the debootstrap base unless the daemon already has it (about a minute, needs root)."""
    import docker.errors

    env = dict(os.environ)
    try:
        labels = client.images.get(image).labels or {}
        if labels.get(BASE_LAYOUT_LABEL) == BASE_LAYOUT:
            progress(f"base image {image}: present")
            return
        progress(f"base image {image}: made by an older deploy/base-image.sh (no package list): rebuilding")
        env["FORCE"] = "1"
    except docker.errors.ImageNotFound:
        progress(f"base image {image}: building with debootstrap")
    if base_url:
        env["DOCKER_HOST"] = base_url
    _stream_command(["sh", str(DEPLOY_DIR / "base-image.sh"), image], progress, env=env, step="base image")


# --- the wheelhouse ----------------------------------------------------------------------------


def build_wheelhouse(*, with_broker: bool, progress: Progress, python: str = sys.executable) -> Path:
    """Fill deploy/wheelhouse with binary wheels for the image's Python (offline when it can).

    Every wheel is checked against the lock's hashes (`requirements/*.txt`, exported from
    uv.lock by `./dev lock`): a wheelhouse file that differs from what was locked stops the
    build here, before any image is made from it."""
    WHEELHOUSE.mkdir(parents=True, exist_ok=True)
    requirements = [LOCKED["server"]]
    if with_broker:
        # The docbroker wheel itself changes with the code: rebuild it every time.
        for old in WHEELHOUSE.glob("docbroker-*.whl"):
            old.unlink()
        build_docbroker_wheel(WHEELHOUSE, progress, python=python)
        requirements.append(LOCKED["broker"])
    for req in requirements:
        # Offline first: a wheelhouse that already satisfies the requirements needs no index.
        if _check_wheelhouse(req, python):
            progress(f"wheelhouse: {req.name} satisfied offline")
            continue
        progress(f"wheelhouse: downloading wheels for {req.name}")
        # Into a fresh folder from the index alone, then only the files the wheelhouse lacks are
        # moved in: a file already there is never replaced (pip would silently delete one whose
        # hash is wrong), so the check below still sees it.
        with tempfile.TemporaryDirectory(prefix="docbroker-wheels-") as fresh:
            _stream_command(_pip_download(python, req, Path(fresh)), progress, step="wheelhouse")
            for wheel in Path(fresh).glob("*.whl"):
                if not (WHEELHOUSE / wheel.name).exists():
                    shutil.move(wheel, WHEELHOUSE / wheel.name)
        if not _check_wheelhouse(req, python):
            raise ImageBuildError(f"wheelhouse: {req.name} is still not satisfied after the download")
    return WHEELHOUSE


def _pip_download(python: str, req: Path, dest: Path, *, find_links: bool = False) -> list[str]:
    source = ["--no-index", "--find-links", str(WHEELHOUSE)] if find_links else []
    return [
        python, "-m", "pip", "download", "--disable-pip-version-check", "-q", "--require-hashes",
        "--dest", str(dest), *source, *_target_flags(), "-r", str(req),
    ]  # fmt: skip


def _check_wheelhouse(req: Path, python: str) -> bool:
    """Whether the wheelhouse holds all of `req`, each file with its locked hash (offline).

    False when something is missing; ImageBuildError, naming it, when a file's hash is wrong."""
    with tempfile.TemporaryDirectory(prefix="docbroker-wheels-check-") as scratch:
        # A scratch destination: pip reads the wheelhouse and never deletes from it.
        check = _pip_download(python, req, Path(scratch), find_links=True)
        result = subprocess.run(check, capture_output=True, text=True)
    if result.returncode == 0:
        return True
    mismatch = hash_mismatch(result.stdout.splitlines() + result.stderr.splitlines())
    if mismatch is not None:
        # Someone (or something) put that file there: the operator must look, not a retry.
        raise ImageBuildError(
            f"wheelhouse: {mismatch} in {WHEELHOUSE.relative_to(REPO_ROOT)} does not match the "
            f"lock's hash (requirements/{req.name}); remove the file and build again"
        )
    return False


def hash_mismatch(lines: Iterable[str]) -> str | None:
    """The requirement (`name==version`) pip reported as not matching its locked hash, if any.

    pip's report: a line "THESE PACKAGES DO NOT MATCH THE HASHES ...", then per package
    "    name==version from file:///...whl:" and the expected and actual digests."""
    seen = False
    for line in lines:
        if "DO NOT MATCH THE HASHES" in line:
            seen = True
            continue
        if seen:
            match = _PIP_MISMATCH.match(line)
            if match:
                return match.group(1)
    return "a wheel" if seen else None


_PIP_MISMATCH = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*==[A-Za-z0-9.+!_-]+) from ")


# What the wheel is built from. Not the checkout itself: pip builds in the tree, and setuptools
# packs whatever an earlier build left in build/lib (a package since excluded, such as
# broker/testing, or a module since deleted) into the new wheel.
WHEEL_SOURCES = ("pyproject.toml", "README.md", "broker", "server")


def build_docbroker_wheel(dest: Path, progress: Progress, *, python: str = sys.executable) -> Path:
    """The docbroker wheel, built from a clean copy of the sources, into `dest`.

    Without build isolation: the build backend is the setuptools that `python` has from the lock
    (`./dev setup`), not one pip would fetch, unhashed, for an isolated build."""
    with tempfile.TemporaryDirectory(prefix="docbroker-wheel-") as tmp:
        source = Path(tmp) / "src"
        source.mkdir()
        for name in WHEEL_SOURCES:
            if (REPO_ROOT / name).is_dir():
                ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
                shutil.copytree(REPO_ROOT / name, source / name, ignore=ignore)
            else:
                shutil.copy2(REPO_ROOT / name, source / name)
        progress("wheelhouse: building the docbroker wheel")
        built = Path(tmp) / "wheel"
        _stream_command(
            [python, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
             "--disable-pip-version-check", "-q", "--wheel-dir", str(built), str(source)],
            progress,
            step="docbroker wheel",
        )  # fmt: skip
        (wheel,) = built.glob("docbroker-*.whl")
        dest.mkdir(parents=True, exist_ok=True)
        return Path(shutil.copy2(wheel, dest / wheel.name))


def _target_flags() -> list[str]:
    machine = {"x86_64": "x86_64", "amd64": "x86_64", "aarch64": "aarch64", "arm64": "aarch64"}.get(
        platform.machine().lower(), platform.machine().lower()
    )
    flags = ["--only-binary=:all:", "--python-version", TARGET_PYTHON, "--implementation", "cp"]
    for tag in ("manylinux2014", "manylinux_2_17", "manylinux_2_28", "manylinux_2_34"):
        flags += ["--platform", f"{tag}_{machine}"]
    return [*flags, "--platform", "any"]


# --- the images --------------------------------------------------------------------------------


def _build_one(client: Any, name: str, tag: str, base: str, progress: Progress, *, no_cache: bool) -> str:
    with tempfile.TemporaryDirectory(prefix=f"docbroker-{name}-ctx-") as tmp:
        context = Path(tmp)
        _make_context(context, name)
        size = sum(p.stat().st_size for p in context.rglob("*") if p.is_file())
        progress(f"{tag}: context {size / 1e6:.1f} MB, base {base}")
        stream = client.api.build(
            path=str(context),
            dockerfile="Dockerfile",
            tag=tag,
            buildargs={"BASE": base},
            rm=True,
            forcerm=True,
            nocache=no_cache,
            pull=False,
            decode=True,
            labels={"io.docbroker.image": name},
        )
        built_id = _follow_build(stream, progress, tag)
    # By the id the daemon reported for this build, not by the tag: someone may retag meanwhile,
    # and what is recorded and signed next must be the image that was built.
    image = client.images.get(built_id or tag)
    progress(f"{tag}: built, {image.attrs.get('Size', 0) / 1e6:.1f} MB")
    return str(image.id)


def _make_context(context: Path, name: str) -> None:
    shutil.copy2(DEPLOY_DIR / f"{name}.Dockerfile", context / "Dockerfile")
    shutil.copy2(DEPLOY_DIR / "prune.py", context / "prune.py")
    wheels = context / "wheelhouse"
    wheels.mkdir()
    for wheel in WHEELHOUSE.glob("*.whl"):
        _link_or_copy(wheel, wheels / wheel.name)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    # requirements.txt: the image's locked set, installed with --require-hashes. The broker's
    # own wheel is built here, not locked: its hash is taken now, from the wheel being sent.
    locked = LOCKED[name].read_text()
    if name == "broker":
        (wheel,) = WHEELHOUSE.glob("docbroker-*.whl")
        version = wheel.name.split("-")[1]
        digest = hashlib.sha256(wheel.read_bytes()).hexdigest()
        locked += f"docbroker=={version} --hash=sha256:{digest}\n"
    (context / "requirements.txt").write_text(locked)
    if name == "server":
        shutil.copy2(DEPLOY_DIR / "umask.pth", context / "umask.pth")
        shutil.copy2(DEPLOY_DIR / "bytecode.py", context / "bytecode.py")
        shutil.copytree(REPO_ROOT / "server", context / "server", ignore=ignore)
    else:
        shutil.copytree(REPO_ROOT / "policies", context / "policies", ignore=ignore)


def _link_or_copy(src: Path, dst: Path) -> None:
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


def _follow_build(stream: Iterable[dict[str, Any]], progress: Progress, tag: str) -> str | None:
    """Progress lines from the build's stream; the built image's id, when the daemon says it."""
    lines: list[str] = []
    built_id = None
    for chunk in stream:
        aux = chunk.get("aux")
        if isinstance(aux, dict) and isinstance(aux.get("ID"), str):
            built_id = aux["ID"]
        if "error" in chunk or "errorDetail" in chunk:
            detail = chunk.get("errorDetail", {}).get("message") or chunk.get("error", "")
            progress(f"{tag}: {detail.strip()}")
            mismatch = hash_mismatch(lines)
            if mismatch is not None:
                raise ImageBuildError(
                    f"building {tag} failed: {mismatch} in the build's wheelhouse does not match "
                    "the lock's hash"
                )
            raise ImageBuildError(f"building {tag} failed")
        text = chunk.get("stream", "")
        for line in text.splitlines():
            if line.strip():
                lines.append(line)
                progress(line.rstrip())
    return built_id


def _stream_command(
    argv: list[str], progress: Progress, *, step: str, env: dict[str, str] | None = None
) -> None:
    with subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env) as proc:
        assert proc.stdout is not None
        for line in proc.stdout:
            progress(line.rstrip())
    if proc.returncode != 0:
        raise ImageBuildError(f"{step} failed (exit {proc.returncode})")


def docker_client(base_url: str | None) -> Any:
    import docker
    import docker.errors

    try:
        client = docker.DockerClient(base_url=base_url) if base_url else docker.from_env()
        client.ping()
    except docker.errors.DockerException as exc:
        raise ImageError("the Docker daemon does not answer (is it running? is DOCKER_HOST right?)") from exc
    return client
