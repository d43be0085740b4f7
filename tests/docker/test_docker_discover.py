"""A reaper pass asks the daemon once, however many tenants run (bench/scale.py: the broker's
work per pass must not grow by one daemon request per tenant).

Every reaper pass (every 30 s at the default idle timeout) calls `DockerBackend.discover()`.
The Docker SDK's `containers.list` answers with one list request and then inspects each
container, so with 300 tenants a pass was 300 requests to the daemon, each parsed in the
broker while it holds the GIL. The requests are counted here on a relay in front of the real
daemon, as the daemon receives them.
"""

from __future__ import annotations

import asyncio
import re
import shutil
import socket
import tempfile
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from broker.runtime.docker import DockerBackend
from tests.docker.conftest import Daemon, LiveSandbox

pytestmark = pytest.mark.docker
REQUEST_LINE = re.compile(rb"(GET|HEAD|POST|PUT|DELETE) (/\S*) HTTP/1\.1\r\n")


class CountingRelay:
    """A unix-socket relay to a real daemon that keeps every byte the clients send it."""

    def __init__(self, path: Path, upstream: str) -> None:
        self.path = path
        self._upstream = upstream.removeprefix("unix://")
        self._sent = bytearray()
        self._lock = threading.Lock()
        self._server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._server.bind(str(path))
        self._server.listen(16)
        threading.Thread(target=self._accept, daemon=True).start()

    def requests(self) -> list[tuple[str, str]]:
        """(method, path) of each request sent since the last `reset`."""
        with self._lock:
            sent = bytes(self._sent)
        return [(m.decode(), p.decode()) for m, p in REQUEST_LINE.findall(sent)]

    def reset(self) -> None:
        with self._lock:
            self._sent.clear()

    def close(self) -> None:
        self._server.close()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._server.accept()
            except OSError:
                return  # closed
            daemon = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            daemon.connect(self._upstream)
            threading.Thread(target=self._pump, args=(client, daemon, True), daemon=True).start()
            threading.Thread(target=self._pump, args=(daemon, client, False), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket, keep: bool) -> None:
        try:
            while data := source.recv(65536):
                if keep:
                    with self._lock:
                        self._sent += data
                sink.sendall(data)
        except OSError:
            pass
        finally:
            source.close()
            sink.close()


@pytest.fixture
def relay(daemon: Daemon) -> Iterator[CountingRelay]:
    top = Path(tempfile.mkdtemp(prefix="dbr-", dir="/tmp"))  # a unix socket's path is short
    counting = CountingRelay(top / "docker.sock", daemon.host)
    yield counting
    counting.close()
    shutil.rmtree(top, ignore_errors=True)


def test_a_reaper_pass_asks_the_daemon_once_whatever_the_number_of_tenants(
    daemon: Daemon, live_factory: Callable[..., LiveSandbox], relay: CountingRelay
) -> None:
    sandboxes = [live_factory() for _ in range(3)]
    instance = sandboxes[0].container.labels["io.docbroker.instance"]
    proxied = Daemon(f"unix://{relay.path}", daemon.owner_uid, daemon.owner_gid)
    backend = asyncio.run(DockerBackend.connect(proxied.settings(), instance=instance))
    try:
        relay.reset()
        found = asyncio.run(backend.discover())
        asked = relay.requests()
    finally:
        asyncio.run(backend.close())

    # What a pass needs is all there: each tenant, running, at its socket, by its container.
    assert {(i.tenant, i.backend_id, i.state.value) for i in found} == {
        (s.tenant.spec.tenant, s.info.backend_id, "running") for s in sandboxes
    }
    assert {i.endpoint.uds for i in found if i.endpoint is not None} == {
        s.info.endpoint.uds for s in sandboxes if s.info.endpoint is not None
    }
    # ... from one request: the list, and no inspect of each container.
    assert len(asked) == 1, asked
    method, path = asked[0]
    assert method == "GET" and re.fullmatch(r"/v[\d.]+/containers/json\?\S*", path), asked
