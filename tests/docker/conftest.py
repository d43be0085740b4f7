"""Fixtures for the Docker tests: real daemons, real hardened containers, nothing mocked.

Daemons: DOCBROKER_TEST_DOCKER_HOSTS (comma-separated DOCKER_HOST values; `.ci/docker.sh`
writes rootful and rootless into .ci/docker.env), else the rootful default socket. A daemon
that does not answer FAILS the tests: a security suite that skips is a suite that lies.

Tenants are laid out as broker/tenants.py does (drop-box 1733, run dir 1777, secret 0444),
owned by the user the daemon runs as: root for a rootful daemon, the daemon's user for a
rootless one (that is who the broker runs as in that setup).
"""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import shutil
import tempfile
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]

from broker.master_key import tenant_secret  # noqa: E402
from broker.runtime.docker import DockerBackend  # noqa: E402
from broker.settings import DockerSettings  # noqa: E402
from broker.types import DROPBOX_MODE, SandboxInfo, SandboxSpec  # noqa: E402

DEFAULT_HOST = "unix:///var/run/docker.sock"
IMAGE = os.environ.get("DOCBROKER_TEST_IMAGE", "docbroker-server:latest")
SECCOMP = REPO / "policies" / "seccomp.json"
PYTHON = "/opt/venv/bin/python"


def docker_hosts() -> list[str]:
    raw = os.environ.get("DOCBROKER_TEST_DOCKER_HOSTS", "").strip()
    return [h.strip() for h in raw.split(",") if h.strip()] or [DEFAULT_HOST]


def _host_id(host: str) -> str:
    return "rootless" if "docbroker" in host or "/run/user/" in host else f"rootful:{Path(host).name}"


@dataclass(frozen=True)
class Daemon:
    host: str
    owner_uid: int  # who the broker runs as against this daemon
    owner_gid: int

    def settings(self, **overrides: Any) -> DockerSettings:
        values: dict[str, Any] = {"base_url": self.host, "image": IMAGE, "seccomp_profile": SECCOMP}
        values.update(overrides)
        return DockerSettings(**values)

    def client(self) -> Any:
        import docker

        return docker.DockerClient(base_url=self.host)


@pytest.fixture(scope="session", params=docker_hosts(), ids=_host_id)
def daemon(request: pytest.FixtureRequest) -> Daemon:
    import docker
    import docker.errors

    host: str = request.param
    try:
        client = docker.DockerClient(base_url=host)
        info = client.info()
        client.images.get(IMAGE)
        client.close()
    except docker.errors.ImageNotFound:
        pytest.fail(f"{IMAGE} is not in the daemon at {host}: run .ci/docker.sh (or `docbroker image build`)")
    except docker.errors.DockerException as exc:
        pytest.fail(f"no Docker daemon answers at {host}: run .ci/docker.sh ({exc.__class__.__name__})")
    rootless = any("name=rootless" in str(o) for o in info.get("SecurityOptions") or [])
    if rootless and host.startswith("unix://"):
        st = os.stat(host.removeprefix("unix://"))
        owner = (st.st_uid, _primary_gid(st.st_uid))
    else:
        owner = (0, 0)
    return Daemon(host=host, owner_uid=owner[0], owner_gid=owner[1])


def _primary_gid(uid: int) -> int:
    import pwd

    return pwd.getpwuid(uid).pw_gid


# --- tenants on the host ----------------------------------------------------------------------


@dataclass(frozen=True)
class HostTenant:
    spec: SandboxSpec
    secret: str
    reports: Path  # the real store: never mounted

    @property
    def sources(self) -> Path:
        return Path(self.spec.sources_dir)

    @property
    def dropbox(self) -> Path:
        return Path(self.spec.dropbox_dir)


class Layout:
    """A data dir like the broker's, owned by the daemon's user."""

    def __init__(self, daemon: Daemon) -> None:
        self.daemon = daemon
        self.master_key = secrets.token_bytes(32)
        # /var/tmp, not pytest's tmp_path: a rootless daemon (another user) must reach it.
        self.root = Path(tempfile.mkdtemp(prefix="docbroker-dtest-", dir="/var/tmp"))
        self._chown(self.root)

    def _chown(self, path: Path) -> None:
        os.chown(path, self.daemon.owner_uid, self.daemon.owner_gid)

    def tenant(self, name: str, files: dict[str, str] | None = None) -> HostTenant:
        base = self.root / "tenants" / name
        dirs = {
            "sources": (base / "docs" / "sources", 0o755),
            "dropbox": (base / "docs" / "reports", DROPBOX_MODE),
            "reports": (base / "reports", 0o700),
            "run": (self.root / "run" / name, 0o1777),
            "secrets": (self.root / "secrets", 0o700),
        }
        for path, mode in dirs.values():
            path.mkdir(parents=True, exist_ok=True)
            path.chmod(mode)
        for closed in (base, base / "docs"):  # as tenants.py: a walk up from a passed fd stops here
            closed.chmod(0o700)
        parents = (self.root / "tenants", base, base / "docs", self.root / "run")
        for folder in (*parents, *[p for p, _ in dirs.values()]):
            self._chown(folder)
        for filename, text in (files or {}).items():
            path = dirs["sources"][0] / filename
            path.write_text(text, encoding="utf-8")
            path.chmod(0o644)
            self._chown(path)
        secret = tenant_secret(self.master_key, name)
        secret_file = self.root / "secrets" / f"{name}.key"
        secret_file.write_text(secret, encoding="ascii")
        secret_file.chmod(0o444)
        self._chown(secret_file)
        spec = SandboxSpec(
            tenant=name,
            docs_root=str(base / "docs"),
            secret_file=str(secret_file),
            run_dir=str(dirs["run"][0]),
        )
        return HostTenant(spec=spec, secret=secret, reports=dirs["reports"][0])

    def cleanup(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)


@pytest.fixture
def layout(daemon: Daemon) -> Iterator[Layout]:
    made = Layout(daemon)
    yield made
    made.cleanup()


def unique_tenant(prefix: str = "t") -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


# --- backends and live sandboxes --------------------------------------------------------------


def connect(daemon: Daemon, *, instance: str | None = None, **overrides: Any) -> DockerBackend:
    instance = instance or f"test{uuid.uuid4().hex[:8]}"
    return asyncio.run(DockerBackend.connect(daemon.settings(**overrides), instance=instance))


def remove_instance(daemon: Daemon, instance: str) -> None:
    client = daemon.client()
    try:
        for c in client.containers.list(
            all=True, filters={"label": f"io.docbroker.instance={instance}"}, ignore_removed=True
        ):
            c.remove(force=True)
    finally:
        client.close()


@dataclass
class LiveSandbox:
    """A running tenant container created by DockerBackend, plus a way to probe inside it."""

    daemon: Daemon
    backend: DockerBackend
    tenant: HostTenant
    info: SandboxInfo
    container: Any

    def run_python(
        self, code: str, *, timeout_note: str = "", flags: tuple[str, ...] = ()
    ) -> tuple[int, str]:
        # As the container's own user and group (they depend on the daemon's mode).
        user = self.container.attrs["Config"]["User"]
        result = self.container.exec_run([PYTHON, *flags, "-c", code], user=user, demux=False)
        return result.exit_code, (result.output or b"").decode("utf-8", "replace")

    def probe(self, code: str, *, flags: tuple[str, ...] = ()) -> dict[str, Any]:
        """Run `code` inside the sandbox; it must print one JSON object as its last line."""
        exit_code, output = self.run_python(code, flags=flags)
        assert exit_code == 0, output
        return json.loads(output.strip().splitlines()[-1])


async def wait_ready(info: SandboxInfo, timeout: float = 30.0) -> None:
    from broker.runtime import readiness

    assert info.endpoint is not None
    assert await readiness.wait_ready(info.endpoint, timeout), "sandbox socket never accepted a connection"


@pytest.fixture
def live_factory(daemon: Daemon, layout: Layout) -> Iterator[Callable[..., LiveSandbox]]:
    made: list[LiveSandbox] = []
    instance = f"test{uuid.uuid4().hex[:8]}"

    def make(name: str | None = None, files: dict[str, str] | None = None, **overrides: Any) -> LiveSandbox:
        backend = connect(daemon, instance=instance, **overrides)
        tenant = layout.tenant(name or unique_tenant(), files)

        async def start() -> SandboxInfo:
            info = await backend.create(tenant.spec)
            await wait_ready(info)
            return info

        info = asyncio.run(start())
        client = daemon.client()
        sandbox = LiveSandbox(daemon, backend, tenant, info, client.containers.get(info.backend_id))
        made.append(sandbox)
        return sandbox

    yield make
    remove_instance(daemon, instance)
    for sandbox in made:
        asyncio.run(sandbox.backend.close())


@pytest.fixture
def live(live_factory: Callable[..., LiveSandbox]) -> LiveSandbox:
    return live_factory(files={"notes.md": "hello docbroker sandbox\n"})
