"""DockerBackend.connect: daemon mode detection and the refusals it applies."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from broker.runtime.base import BackendRefused
from broker.runtime.docker import DaemonUnavailable, DockerBackend, ImageMissing
from broker.settings import DockerSettings
from broker.types import DaemonMode
from tests.docker.conftest import SECCOMP, Daemon

pytestmark = pytest.mark.docker


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
