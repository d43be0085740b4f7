"""DockerBackend.connect: daemon mode detection and the refusals it applies."""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from broker.runtime.base import BackendRefused
from broker.runtime.docker import DaemonUnavailable, DockerBackend, ImageMissing
from broker.settings import DockerSettings
from broker.types import DaemonMode
from tests.docker.conftest import IMAGE, REPO, SECCOMP, Daemon

pytestmark = pytest.mark.docker
NOBODY = 65534


def rootless(daemon: Daemon) -> bool:
    client = daemon.client()
    try:
        return any("name=rootless" in str(o) for o in client.info().get("SecurityOptions") or [])
    finally:
        client.close()


def test_mode_is_detected(daemon: Daemon) -> None:
    backend = asyncio.run(DockerBackend.connect(daemon.settings()))
    try:
        expected = DaemonMode.ROOTLESS if rootless(daemon) else DaemonMode.ROOTFUL
        assert backend.mode() is expected
        described = backend.describe()
        assert described["mode"] == expected.value and described["seccomp"] is True
        assert set(described["limits_enforced"]) == {"memory", "cpu", "pids"}
    finally:
        asyncio.run(backend.close())


def test_require_rootless_refuses_a_rootful_daemon(daemon: Daemon) -> None:
    settings = daemon.settings(require_rootless=True)
    if rootless(daemon):
        asyncio.run(asyncio.run(DockerBackend.connect(settings)).close())
        return
    with pytest.raises(BackendRefused, match="rootful"):
        asyncio.run(DockerBackend.connect(settings))


def test_missing_image_says_how_to_build_it(daemon: Daemon) -> None:
    with pytest.raises(ImageMissing, match="docbroker image build"):
        asyncio.run(DockerBackend.connect(daemon.settings(image="docbroker-server:no-such-tag")))


def test_allow_by_default_seccomp_profile_is_refused(daemon: Daemon, tmp_path: Path) -> None:
    weak = tmp_path / "weak.json"
    weak.write_text('{"defaultAction": "SCMP_ACT_ALLOW", "syscalls": []}')
    with pytest.raises(BackendRefused, match="deny by default"):
        asyncio.run(DockerBackend.connect(daemon.settings(seccomp_profile=weak)))


def test_no_daemon_is_a_clear_refusal(tmp_path: Path) -> None:
    settings = DockerSettings(base_url=f"unix://{tmp_path}/none.sock", seccomp_profile=SECCOMP)
    with pytest.raises(DaemonUnavailable, match="does not answer"):
        asyncio.run(DockerBackend.connect(settings))


CONNECT = """
import asyncio, sys
from pathlib import Path
from broker.runtime.base import BackendRefused
from broker.runtime.docker import DockerBackend
from broker.settings import DockerSettings
settings = DockerSettings(base_url=sys.argv[1], image=sys.argv[2], seccomp_profile=Path(sys.argv[3]))
try:
    asyncio.run(asyncio.run(DockerBackend.connect(settings)).close())
    print("connected")
except BackendRefused as exc:
    print("refused:", exc)
"""


@pytest.fixture(scope="module")
def world_readable() -> Iterator[Path]:
    """The environment and the code, where a user other than root can reach them: the checkout
    (and its venv) may lie in a folder only root may enter, as a CI clone in a `mktemp -d` does.
    Hard links where the file system allows (no data is copied), else copies."""
    top = Path(tempfile.mkdtemp(prefix="docbroker-as-user-", dir="/tmp"))
    top.chmod(0o755)

    def link(src: str, dst: str) -> None:
        try:
            os.link(src, dst)
        except OSError:
            shutil.copy2(src, dst)

    shutil.copytree(sys.prefix, top / "venv", symlinks=True, copy_function=link)
    for part in ("broker", "server"):
        shutil.copytree(REPO / part, top / "code" / part, copy_function=link,
                        ignore=shutil.ignore_patterns("__pycache__"))  # fmt: skip
    shutil.copy2(SECCOMP, top / "seccomp.json")
    for folder in (top, *top.rglob("*")):
        if folder.is_dir() and not folder.is_symlink():
            folder.chmod(0o755)
    try:
        yield top
    finally:
        shutil.rmtree(top)


def connect_as(daemon: Daemon, top: Path, uid: int, gid: int, groups: list[int]) -> str:
    """DockerBackend.connect in a broker process of that uid, gid and supplementary groups."""
    env = {"PYTHONPATH": str(top / "code"), "PYTHONDONTWRITEBYTECODE": "1", "HOME": "/"}
    python = top / "venv" / "bin" / "python"
    done = subprocess.run(
        [str(python), "-c", CONNECT, daemon.host, IMAGE, str(top / "seccomp.json")],
        user=uid,
        group=gid,
        extra_groups=groups,
        cwd="/",
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_a_broker_not_in_the_sandbox_group_is_refused_by_a_rootful_daemon(
    daemon: Daemon, world_readable: Path
) -> None:
    """The sandbox's group is 10001 there, not root's: a broker that is neither root nor in it
    could read no report and reach no socket, so it is refused at once, saying why."""
    if rootless(daemon):  # gid 0 in the sandbox is the daemon user's own: no group needed
        assert connect_as(daemon, world_readable, daemon.owner_uid, daemon.owner_gid, []) == "connected"
        return
    socket_group = os.stat(daemon.host.removeprefix("unix://")).st_gid  # may use the daemon
    refused = connect_as(daemon, world_readable, NOBODY, NOBODY, [socket_group])
    assert refused.startswith("refused:") and "group 10001" in refused, refused
    assert connect_as(daemon, world_readable, NOBODY, NOBODY, [socket_group, 10001]) == "connected"
