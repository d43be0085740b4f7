"""While the Docker daemon does not answer (found by the reliability run, issue 25): a save sent
to its sandbox, whose sandbox then dies, is `result_unknown` — never "503, retry later"; and
the reaper says so in one line, not a traceback per pass.

Seen in the run during `docker_restarted`: a save went out on a pooled connection, the
sandbox died with the daemon, and the gateway's check of the sandbox (`Runtime.mark_broken`
asks the engine whether it is still alive) raised "daemon unavailable". That error replaced
the call's own failure: the client was told 503 (a definite refusal, "retry later") for a
write that had been sent, and the approval stayed consumed. A client that retries then asks a
human again for a report that may already exist.

Here, on the rootless daemon the Docker tests use, through a proxy that can stop answering
(tests/docker/hung_daemon.py): the tenant's server is SIGSTOPped, the approved save is seen
waiting in its socket (sent), the proxy freezes, and the server is SIGKILLed. The answer must
be `result_unknown`, audited as such.
"""

from __future__ import annotations

import os
import pwd
import queue
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import docker
import pytest

from broker.testing import Broker, make_broker
from tests.broker.support import call_modern, decide, open_http, rpc_reply, wait_for
from tests.docker.conftest import IMAGE, SECCOMP
from tests.docker.test_docker_broker_e2e import DOC, _chown_tree, _start_as
from tests.reliability.test_docker_reliability import process_state, queued, rootless_user, source_host

pytestmark = [pytest.mark.docker, pytest.mark.reliability, pytest.mark.timeout(300)]

HUNG_DAEMON = Path(__file__).resolve().parents[1] / "docker" / "hung_daemon.py"


class Proxy:
    """hung_daemon.py run as the daemon's user (the broker, that user too, must connect)."""

    def __init__(self, folder: Path, upstream: str, uid: int, gid: int) -> None:
        script = folder / "hung_daemon.py"
        shutil.copy(HUNG_DAEMON, script)
        os.chown(script, uid, gid)
        self.socket = folder / "docker.sock"
        self.proc = subprocess.Popen(
            [os.path.realpath(sys.executable), str(script), str(self.socket), upstream.removeprefix("unix://")],
            stdout=subprocess.PIPE, stdin=subprocess.DEVNULL, user=uid, group=gid, cwd=folder,
        )  # fmt: skip
        self.lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()
        self.expect("ready")

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for raw in self.proc.stdout:
            self.lines.put(raw.decode().strip())

    def expect(self, line: str) -> None:
        while (said := self.lines.get(timeout=60)) != line:  # a bound for a broken test, never a wait
            pass
        assert said == line

    def freeze(self) -> None:
        self.proc.send_signal(signal.SIGUSR1)
        self.expect("frozen")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()


@pytest.fixture
def behind_proxy() -> Iterator[tuple[Broker, Proxy, str]]:
    user = pwd.getpwnam(rootless_user())
    uid, gid = user.pw_uid, user.pw_gid
    base = Path(tempfile.mkdtemp(prefix="docbroker-hung-", dir="/var/tmp"))
    instance = f"hung{secrets.token_hex(3)}"
    proxy_dir = base / "proxy"
    proxy_dir.mkdir()
    os.chown(proxy_dir, uid, gid)
    base.chmod(0o711)
    proxy = Proxy(proxy_dir, source_host(), uid, gid)
    env = {
        "DOCBROKER_DOCKER_HOST": f"unix://{proxy.socket}",
        "DOCBROKER_DOCKER_IMAGE": IMAGE,
        "DOCBROKER_DOCKER_SECCOMP_PROFILE": str(base / "policies" / SECCOMP.name),
        "DOCBROKER_DOCKER_POOL_SIZE": "0",
        "DOCBROKER_DOCKER_API_TIMEOUT": "2",
        "DOCBROKER_IDLE_TIMEOUT": "8",  # a reaper pass every 2 s
        "DOCBROKER_INSTANCE": instance,
    }
    broker = make_broker(base, runtime="docker", env=env)
    sources = broker.sources("acme")
    sources.mkdir(parents=True)
    (sources / "notes.md").write_text(DOC, encoding="utf-8")
    _chown_tree(base, uid, gid)
    try:
        _start_as(broker, uid, gid, base)
        yield broker, proxy, instance
    finally:
        broker.stop()
        proxy.stop()
        client = docker.DockerClient(base_url=source_host(), timeout=30)
        try:
            for c in client.containers.list(
                all=True, filters={"label": f"io.docbroker.instance={instance}"}, ignore_removed=True
            ):
                c.remove(force=True)
        finally:
            client.close()
        shutil.rmtree(base, ignore_errors=True)


def test_a_sent_save_whose_sandbox_dies_while_the_daemon_is_away_is_result_unknown(
    behind_proxy: tuple[Broker, Proxy, str],
) -> None:
    broker, proxy, instance = behind_proxy
    writer = broker.token("acme", subject="alice", scope="docs:read docs:write")
    args = {"filename": "daemon-away.md", "content": "# Written while the daemon was away\n"}
    with open_http(broker, writer) as http:
        assert rpc_reply(call_modern(http, "read_document", {"filename": "notes.md"}))["result"][
            "structuredContent"]["status"] == "ok"  # fmt: skip
        waiting = rpc_reply(call_modern(http, "save_report", args))["result"]["structuredContent"]
        assert waiting["status"] == "waiting_approval", waiting
    assert decide(broker, waiting["data"]["approval_id"]).status_code == 200

    client = docker.DockerClient(base_url=source_host(), timeout=30)
    try:
        pid = int(client.containers.get(f"docbroker-{instance}-acme").attrs["State"]["Pid"])
    finally:
        client.close()
    os.kill(pid, signal.SIGSTOP)
    assert wait_for(lambda: process_state(pid) == "T", 10)
    before = queued(pid)
    with ThreadPoolExecutor(1) as pool, open_http(broker, writer) as http:
        save = pool.submit(call_modern, http, "save_report", args)
        assert wait_for(lambda: queued(pid) > before or save.done(), 30)
        assert not save.done(), "the save was answered before it reached the stopped sandbox"
        proxy.freeze()  # the engine stops answering: the gateway cannot ask about the sandbox
        os.kill(pid, signal.SIGKILL)
        response = save.result(timeout=60)

    assert response.status_code == 200, (response.status_code, response.text[:300])
    result = rpc_reply(response)["result"]["structuredContent"]
    assert result["status"] == "result_unknown", result
    approval_id = waiting["data"]["approval_id"]
    [event] = [
        e
        for e in broker.audit_events()
        if e["event"] == "mcp.request"
        and e.get("approval_id") == approval_id
        and e["outcome"] != "waiting_approval"
    ]
    assert event["outcome"] == "result_unknown", event
    assert "Traceback" not in broker.logs()


def test_the_reaper_says_one_line_while_the_daemon_is_away(behind_proxy: tuple[Broker, Proxy, str]) -> None:
    """Seen in the run: each reaper pass while the daemon restarted logged "reaper pass
    failed" with a traceback. The engine being away is an operating condition: one line."""
    broker, proxy, _ = behind_proxy
    proxy.freeze()
    assert wait_for(lambda: "reaper pass" in broker.logs(), 30)
    assert "Traceback" not in broker.logs()
    [line, *_] = [line for line in broker.logs().splitlines() if "reaper pass" in line]
    assert "WARNING" in line and "sandbox_daemon_unavailable" in line, line
