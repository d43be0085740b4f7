"""DockerBackend.connect: daemon mode detection and the refusals it applies."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from broker.runtime.base import BackendRefused
from broker.runtime.docker import DaemonUnavailable, DockerBackend, ImageMissing
from broker.settings import DockerSettings, Settings
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
from broker.settings import DockerSettings, Settings
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


# --- a daemon that stops answering --------------------------------------------------------------

HUNG_DAEMON = REPO / "tests" / "docker" / "hung_daemon.py"
API_TIMEOUT = 2.0
DEFAULT_THREADS = 3  # the event loop's default executor in these tests: fewer than the calls
CALLS = 6


class HungDaemon:
    """`hung_daemon.py` in a process of its own: a proxy to a real daemon that can stop answering."""

    def __init__(self, proc: asyncio.subprocess.Process, socket_path: Path) -> None:
        self.proc = proc
        self.url = f"unix://{socket_path}"

    @classmethod
    async def start(cls, folder: Path, upstream: str, *, frozen: bool = False) -> HungDaemon:
        socket_path = folder / "docker.sock"
        proc = await asyncio.create_subprocess_exec(
            sys.executable, str(HUNG_DAEMON), str(socket_path), upstream.removeprefix("unix://"),
            *(["--frozen"] if frozen else []),
            stdout=asyncio.subprocess.PIPE,
        )  # fmt: skip
        hung = cls(proc, socket_path)
        await hung.expect("ready")
        return hung

    async def expect(self, line: str) -> None:
        """Until the proxy says `line` (read on the event loop: no thread is needed for it)."""
        assert self.proc.stdout is not None
        async with asyncio.timeout(60):  # only a bound for a broken test, never a wait
            while (said := await self.proc.stdout.readline()) and said.decode().strip() != line:
                pass
        assert said, f"the proxy ended before saying {line!r}"

    async def freeze(self) -> None:
        self.proc.send_signal(signal.SIGUSR1)
        await self.expect("frozen")

    async def stop(self) -> None:
        if self.proc.returncode is None:
            self.proc.kill()
        await self.proc.wait()


@pytest.mark.parametrize(
    ("env", "expected"),
    [({}, 10.0), ({"DOCKER_API_TIMEOUT": "3"}, 3.0), ({"START_TIMEOUT": "5"}, 5.0),
     ({"DOCKER_API_TIMEOUT": "60", "START_TIMEOUT": "20"}, 20.0)],
)  # fmt: skip
def test_the_api_timeout_is_never_above_the_start_timeout(env: dict[str, str], expected: float) -> None:
    base = {
        "DOCBROKER_AUTH_ISSUER": "https://issuer.example",
        "DOCBROKER_AUTH_AUDIENCE": "docbroker",
        "DOCBROKER_AUTH_JWKS_URL": "https://issuer.example/jwks.json",
    }
    settings = Settings.from_env(base | {f"DOCBROKER_{k}": v for k, v in env.items()})
    assert settings.runtime.docker.api_timeout_seconds == expected


@pytest.fixture
def short_dir() -> Iterator[Path]:
    folder = Path(tempfile.mkdtemp(prefix="docbroker-hung-", dir="/tmp"))  # a socket path is short
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def test_a_daemon_that_hangs_at_connect_is_unavailable_within_the_api_timeout(short_dir: Path) -> None:
    """docker-py's own timeout is 60 s, three times a sandbox's start timeout."""

    async def scenario() -> float:
        hung = await HungDaemon.start(short_dir, "/nonexistent", frozen=True)
        settings = DockerSettings(base_url=hung.url, seccomp_profile=SECCOMP, api_timeout_seconds=API_TIMEOUT)
        try:
            started = time.monotonic()
            with pytest.raises(DaemonUnavailable, match="does not answer"):
                await DockerBackend.connect(settings)
            return time.monotonic() - started
        finally:
            await hung.stop()

    assert asyncio.run(scenario()) < API_TIMEOUT * 3


def test_a_daemon_that_hangs_holds_only_dockers_calls_and_fails_them_in_time(
    daemon: Daemon, short_dir: Path
) -> None:
    """More Docker calls hang than the default executor has threads, and a `to_thread` call of
    anyone else's still runs at once; each Docker call then fails with one clear line."""

    async def scenario() -> float:
        asyncio.get_running_loop().set_default_executor(ThreadPoolExecutor(DEFAULT_THREADS))
        hung = await HungDaemon.start(short_dir, daemon.host)
        settings = daemon.settings(base_url=hung.url, api_timeout_seconds=API_TIMEOUT)
        backend = await DockerBackend.connect(settings, instance=f"hung{uuid.uuid4().hex[:8]}")
        try:
            await hung.freeze()
            started = time.monotonic()
            calls = [
                asyncio.create_task(backend.discover() if i % 2 else backend.remove_tenant("t-none", "/"))
                for i in range(CALLS)
            ]
            await hung.expect(f"held {CALLS}")  # every call is at the daemon, none answered
            elsewhere = threading.Event()
            probe = asyncio.create_task(asyncio.to_thread(elsewhere.set))
            done, _ = await asyncio.wait({probe, *calls}, return_when=asyncio.FIRST_COMPLETED)
            assert done == {probe} and elsewhere.is_set()
            assert not any(call.done() for call in calls)  # they were hanging meanwhile
            failures = await asyncio.gather(*calls, return_exceptions=True)
            elapsed = time.monotonic() - started
            for failure in failures:
                assert isinstance(failure, DaemonUnavailable), repr(failure)
                assert str(failure).startswith("the Docker daemon did not answer within DOCBROKER_DOCKER_API")
            return elapsed
        finally:
            await backend.close()
            await hung.stop()

    assert asyncio.run(scenario()) < API_TIMEOUT * 3
