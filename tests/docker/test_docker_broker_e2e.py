"""End to end on Docker: a real MCP client with a bearer JWT, the real broker, a real container.

The client searches, reads, and saves a report that a human approves over REST; the report
must then be on the host, in the tenant's reports store, with exactly the approved bytes. Run
against every daemon: with a rootless daemon the broker runs as that daemon's user, which is
the production shape (nothing on the sandbox path runs as root). And run both ways a sandbox
comes to be: bound from the warm pool (the default) and started cold (pool size 0).
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import time
from collections.abc import Iterator, Mapping
from pathlib import Path

import httpx2
import pytest

from broker.testing import Broker, make_broker, structured
from tests.docker.conftest import IMAGE, SECCOMP, Daemon

pytestmark = [pytest.mark.docker, pytest.mark.anyio]

DOC = "# Quarterly notes\n\nThe sandbox keeps every tenant apart.\n"
REPORT = "# Summary\n\nSandboxes keep tenants apart — approved by a human.\n"


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def _chown_tree(root: Path, uid: int, gid: int) -> None:
    for path in [root, *root.rglob("*")]:
        os.chown(path, uid, gid, follow_symlinks=False)


def _link_tree(src: Path, dst: Path) -> None:
    """Hard-link a tree (copy across file systems): instant, and nothing changes the originals."""

    def link(a: str, b: str) -> object:
        try:
            os.link(a, b)
        except OSError:
            shutil.copy2(a, b)
        return b

    shutil.copytree(src, dst, copy_function=link, ignore=shutil.ignore_patterns("__editable__*"))


def _readable_runtime(base: Path) -> tuple[str, str]:
    """(interpreter, PYTHONPATH) that the daemon's user can read.

    The checkout may sit in a folder only root can enter (CI clones into `mktemp -d`, mode
    0700), so the broker run as another user gets its code and dependencies from a linked
    copy in `base`. The copy is root-owned and world-readable; it is never chown'ed, since
    chown through a hard link would change the originals.
    """
    runtime = base / "runtime"
    repo = Path(__file__).resolve().parents[2]
    for package in ("broker", "server"):
        _link_tree(repo / package, runtime / "src" / package)
    _link_tree(Path(sysconfig.get_paths()["purelib"]), runtime / "site")
    for folder in [runtime, *(p for p in runtime.rglob("*") if p.is_dir())]:
        folder.chmod(0o755)
    return os.path.realpath(sys.executable), f"{runtime / 'src'}:{runtime / 'site'}"


def start_for_daemon(broker: Broker, daemon: Daemon, base: Path, notes: Mapping[str, str]) -> None:
    """Each tenant's `notes.md` in its sources, the whole tree the daemon's user's (its
    sandboxes bind-mount it), then the broker started as that user."""
    for tenant, text in notes.items():
        broker.sources(tenant).mkdir(parents=True)
        (broker.sources(tenant) / "notes.md").write_text(text, encoding="utf-8")
    _chown_tree(base, daemon.owner_uid, daemon.owner_gid)
    base.chmod(0o711)
    _start_as(broker, daemon.owner_uid, daemon.owner_gid, base)


def _start_as(broker: Broker, uid: int, gid: int, base: Path) -> None:
    """Broker.start, as the daemon's user (root for a rootful daemon)."""
    python, pythonpath = (sys.executable, broker.env["PYTHONPATH"]) if uid == 0 else _readable_runtime(base)
    log = broker.log_file.open("ab")
    broker.proc = subprocess.Popen(
        [python, "-m", "broker", "serve"],
        cwd=base,
        env={**broker.env, "PYTHONPATH": pythonpath, "HOME": pwd.getpwuid(uid).pw_dir},
        stdout=log,
        stderr=log,
        stdin=subprocess.DEVNULL,
        user=uid,
        group=gid,
    )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if broker.proc.poll() is not None:
            pytest.fail(f"broker exited early:\n{broker.logs()[-3000:]}")
        with contextlib.suppress(httpx2.TransportError):
            if httpx2.get(f"{broker.url}/healthz", timeout=1).status_code == 200:
                return
        time.sleep(0.2)
    pytest.fail(f"broker did not start:\n{broker.logs()[-3000:]}")


@pytest.fixture(params=[1, 0], ids=["pooled", "cold"])
def docker_broker(daemon: Daemon, request: pytest.FixtureRequest) -> Iterator[Broker]:
    # /var/tmp: a rootless daemon (another user) must reach the bind-mount sources.
    base = Path(tempfile.mkdtemp(prefix="docbroker-e2e-", dir="/var/tmp"))
    env = {
        "DOCBROKER_DOCKER_HOST": daemon.host,
        "DOCBROKER_DOCKER_IMAGE": IMAGE,
        # The copy beside the tenant policies: readable by the broker's user, like the rest.
        "DOCBROKER_DOCKER_SECCOMP_PROFILE": str(base / "policies" / SECCOMP.name),
        "DOCBROKER_IDLE_TIMEOUT": "300",
        "DOCBROKER_DOCKER_POOL_SIZE": str(request.param),
    }
    broker = make_broker(base, runtime="docker", env=env)
    try:
        start_for_daemon(broker, daemon, base, {"acme": DOC})
        yield broker
    finally:
        broker.stop()
        shutil.rmtree(base, ignore_errors=True)


async def test_search_read_and_approved_save_through_a_real_container(
    docker_broker: Broker, daemon: Daemon
) -> None:
    broker = docker_broker
    writer = broker.token("acme", subject="alice", scope="docs:read docs:write")
    approver = broker.token("acme", subject="bob", scope="reports:approve")

    async with broker.client(writer) as client:
        names = {t.name for t in (await client.list_tools()).tools}
        assert names == {"search_documents", "read_document", "save_report"}

        found = structured(await client.call_tool("search_documents", {"query": "tenant apart"}))
        assert found["status"] == "ok"
        assert [h["filename"] for h in found["data"]["hits"]] == ["notes.md"]

        read = structured(await client.call_tool("read_document", {"filename": "notes.md"}))
        assert read["status"] == "ok" and read["data"]["content"] == DOC

        args = {"filename": "summary.md", "content": REPORT}
        waiting = structured(await client.call_tool("save_report", args))
        assert waiting["status"] == "waiting_approval"
        approval_id = waiting["data"]["approval_id"]

        with broker.http(approver) as http:
            assert http.get(f"/v1/approvals/{approval_id}").status_code == 200  # read first
            decided = http.post(f"/v1/approvals/{approval_id}/approve")
            assert decided.status_code == 200, decided.text

        cold = _plant_from_inside(daemon, "later.md")  # as a compromised sandbox would, between saves
        saved = structured(await client.call_tool("save_report", args))
        assert saved["status"] == "ok", saved
        assert saved["data"]["bytes"] == len(REPORT.encode())

    stored = broker.reports("acme") / "summary.md"
    assert stored.read_bytes() == REPORT.encode("utf-8")
    dropbox = broker.data_dir / "tenants" / "acme" / "docs" / "reports"
    assert list(dropbox.iterdir()) == []  # moved out: the sandbox can never see it again
    if cold:  # the planted file was quarantined before the save, by the broker's own user
        quarantine = broker.data_dir / "tenants" / "acme" / "quarantine"
        assert [p.name.rsplit(".", 1)[0] for p in quarantine.iterdir()] == ["later.md"]
        swept = [e for e in broker.audit_events() if e["event"] == "reports.quarantined"]
        assert [(e["reason"], e["count"]) for e in swept] == [("dropbox_before_save", 1)]

    started = [e for e in broker.audit_events() if e["event"] == "sandbox.started"]
    assert started and started[0]["tenant"] == "acme"
    expected_mode = "rootful" if daemon.owner_uid == 0 else "rootless"
    assert started[0]["sandbox_mode"] == expected_mode

    with broker.http() as http:
        ready = http.get("/readyz", headers=broker.ops_headers).json()
    assert ready["checks"]["sandboxes"]["mode"] == expected_mode
    pool = ready["checks"]["sandboxes"]["pool"]
    client = daemon.client()
    try:
        [sandbox] = client.containers.list(filters={"name": "docbroker-acme"})
        labels = sandbox.labels
    finally:
        client.close()
    # The group the sandbox runs in: 0 only rootless (the broker user's own gid), never the
    # host's root group on a rootful daemon (DESIGN §7); the approved save above went through it.
    user, gids = _identity(daemon)
    assert user == ("10001:10001" if expected_mode == "rootful" else "10001:0")
    if expected_mode == "rootful":  # real, effective, saved and fs gid; no supplementary 0
        assert gids["Gid"] == [10001] * 4 and 0 not in gids["Groups"]
    else:
        assert gids["Gid"] == [0] * 4
    if pool["size"]:  # the tenant's sandbox was a warm one, bound on the first call
        assert pool["state"] == "on" and labels.get("io.docbroker.pool") == "true"
    else:
        assert pool["state"] == "off" and labels.get("io.docbroker.tenant") == "acme"


_STATUS = (
    "import json\n"
    "lines = open('/proc/1/status').read().splitlines()\n"
    "status = dict(line.split(':\\t', 1) for line in lines if ':\\t' in line)\n"
    "print(json.dumps({k: [int(n) for n in status[k].split()] for k in ('Gid', 'Groups')}))\n"
)


def _identity(daemon: Daemon) -> tuple[str, dict[str, list[int]]]:
    """The tenant container's configured user, and its server's (PID 1's) group ids."""
    import json

    client = daemon.client()
    try:
        [sandbox] = client.containers.list(filters={"name": "docbroker-acme"})
        user = sandbox.attrs["Config"]["User"]
        result = sandbox.exec_run(["/opt/venv/bin/python", "-c", _STATUS], user=user)
    finally:
        client.close()
    assert result.exit_code == 0, result.output
    return user, json.loads(result.output.decode().strip().splitlines()[-1])


def _plant_from_inside(daemon: Daemon, name: str) -> bool:
    """Create a file in a cold sandbox's drop-box from inside, as its own user; False for a
    warm one (its drop-box is a descriptor of the server's, not a path anyone can reach)."""
    client = daemon.client()
    try:
        [sandbox] = client.containers.list(filters={"name": "docbroker-acme"})
        if sandbox.labels.get("io.docbroker.pool") == "true":
            return False
        flags = "os.O_WRONLY | os.O_CREAT | os.O_EXCL"
        code = f"import os; os.close(os.open('/srv/docs/reports/{name}', {flags}, 0o040))"
        result = sandbox.exec_run(["/opt/venv/bin/python", "-c", code], user=sandbox.attrs["Config"]["User"])
    finally:
        client.close()
    assert result.exit_code == 0, result.output
    return True
