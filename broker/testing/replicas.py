"""Several real broker replicas on one host (DESIGN §9), for tests and bench/replicas.py.

    replicas = make_replicas(tmp_path, 2, database_url=url)   # not started
    replicas.start()                       # `docbroker db upgrade` first when a database is given
    with make_replicas(...) as replicas:   # or: started, and stopped at the end
    a, b = replicas                        # each a broker.testing.Broker (a `Replica`)
    a.token(...)                           # one identity provider: a token works on every replica
    a.kill(); a.start()                    # SIGKILL, then start again on the same port
    lb = RoundRobin(replicas)              # the test's load balancer: no affinity
    lb.post(token, "/mcp", json=..., headers=...)   # next replica; another on a connection error
    replicas.stop()                        # every replica, SIGTERM then SIGKILL, and orphans

What the replicas share, as a deployment's would: the data dir (tenants' sources and reports,
run dirs), the master key file, the JWKS file (one signing key: `token()` is valid everywhere),
the policies folder and, when `database_url` is given, one PostgreSQL database. `share_data_dir=False`
gives each replica a data dir of its own (`tmp/<replica>/data`) but still one master key.

What each has of its own: its port (`url`), its DOCBROKER_REPLICA_ID (`replica_id`: "a", "b",
"c", ...), its log file (`tmp/<replica>.log`) and its audit chain: `audit-<replica>.jsonl` in the
data dir (`audit_file`, so support.events_since and friends read that replica's own file), with
its own signing key and witness file beside it. `explicit_audit_paths=False` leaves
DOCBROKER_AUDIT_LOG and its siblings unset, to test what a replica picks by itself.

Nothing here reaches into a broker's memory; the replicas are separate `python -m broker serve`
processes, seen only through HTTP, files and logs.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx2

from broker.master_key import create_master_key
from broker.testing import ROOT, TENANTS, Broker, free_port, make_broker

REPLICA_NAMES = "abcdefgh"


@dataclass
class Replica(Broker):
    """A harness.Broker that is one of several: its own id and audit file."""

    replica_id: str = ""
    audit_path: Path | None = None

    @property
    def audit_file(self) -> Path:
        return self.audit_path or self.data_dir / f"audit-{self.replica_id}.jsonl"

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill(self) -> None:
        """SIGKILL: no shutdown of any kind (no final checkpoint, sandboxes left running)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()
        self.proc = None

    def restart(self) -> None:
        self.stop()
        self.start()


@dataclass
class Replicas:
    members: list[Replica]
    database_url: str | None = None
    tmp: Path = field(default_factory=Path)

    def __iter__(self) -> Iterator[Replica]:
        return iter(self.members)

    def __len__(self) -> int:
        return len(self.members)

    def __getitem__(self, index: int) -> Replica:
        return self.members[index]

    def db_upgrade(self) -> None:
        """`docbroker db upgrade` against the shared database (once, before the replicas start)."""
        run = subprocess.run(
            [sys.executable, "-m", "broker", "db", "upgrade"],
            cwd=ROOT,
            env=self.members[0].env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        if run.returncode != 0:
            raise RuntimeError(f"docbroker db upgrade failed:\n{run.stdout}{run.stderr}")

    def start(self) -> None:
        if self.database_url is not None:
            self.db_upgrade()
        for member in self.members:
            member.start()

    def stop(self) -> None:
        """Stop every replica, then end sandbox processes a SIGKILLed one left behind."""
        for member in self.members:
            member.stop()
        for member in self.members:
            reap_orphans(member.data_dir)

    def __enter__(self) -> Replicas:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *_: object) -> None:
        self.stop()


def pids_with(*parts: bytes) -> list[int]:
    """The processes whose command line holds every one of `parts`, found in /proc."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ")
        except OSError:
            continue  # gone, or not ours to read
        if all(part in cmdline for part in parts):
            found.append(int(entry.name))
    return found


def reap_orphans(data_dir: Path) -> list[int]:
    """SIGKILL the local runtime's server processes serving sockets under `data_dir`'s run dir
    (a SIGKILLed broker cannot stop its children). By pid, found in /proc; returns them."""
    found = []
    for pid in pids_with(f"--socket {data_dir}/run/".encode()):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
            found.append(pid)
    return found


def make_replicas(
    tmp: Path,
    count: int = 2,
    *,
    runtime: str = "local",
    env: dict[str, str] | None = None,
    tenants: Sequence[str] = TENANTS,
    limits: str = "[limits]\nrate_per_minute = 100000\nburst = 10000\n",
    database_url: str | None = None,
    share_data_dir: bool = True,
    explicit_audit_paths: bool = True,
) -> Replicas:
    """`count` replicas (not started) of one deployment; see the module docstring."""
    if not 1 <= count <= len(REPLICA_NAMES):
        raise ValueError(f"1 to {len(REPLICA_NAMES)} replicas")
    base = make_broker(tmp / "shared", runtime=runtime, env=env, tenants=tenants, limits=limits)
    master_key = tmp / "shared" / "master.key"
    create_master_key(master_key)
    members = []
    for name in REPLICA_NAMES[:count]:
        data_dir = base.data_dir if share_data_dir else tmp / name / "data"
        port = free_port()
        own = {
            "DOCBROKER_PORT": str(port),
            "DOCBROKER_REPLICA_ID": name,
            "DOCBROKER_DATA_DIR": str(data_dir),
            "DOCBROKER_MASTER_KEY_FILE": str(master_key),
        }
        if explicit_audit_paths:
            own |= {
                "DOCBROKER_AUDIT_LOG": str(data_dir / f"audit-{name}.jsonl"),
                "DOCBROKER_AUDIT_KEY_FILE": str(data_dir / f"audit-signing-{name}.key"),
                "DOCBROKER_AUDIT_WITNESS_FILE": str(data_dir / f"audit-witness-{name}.jsonl"),
            }
        if database_url is not None:
            own["DOCBROKER_DATABASE_URL"] = database_url
        members.append(
            Replica(
                url=f"http://127.0.0.1:{port}",
                data_dir=data_dir,
                log_file=tmp / f"{name}.log",
                env={**base.env, **own, **(env or {})},
                private_key=base.private_key,
                kid=base.kid,
                ops_token=base.ops_token,
                replica_id=name,
            )
        )
    return Replicas(members=members, database_url=database_url, tmp=tmp)


@contextlib.contextmanager
def running_replicas(tmp: Path, count: int = 2, **kwargs: Any) -> Iterator[Replicas]:
    replicas = make_replicas(tmp, count, **kwargs)
    try:
        replicas.start()
        yield replicas
    finally:
        replicas.stop()


class RoundRobin:
    """The test's load balancer: each request to the next replica, no affinity.

    A connection error (refused, reset, the replica died mid-response) moves the request on to
    the next replica, up to `attempts` tries in all, as a load balancer's retry of an idempotent
    request would; an HTTP answer of any status is returned as it is. Thread-safe: one instance
    may serve several client threads. `served` counts the answers each replica gave.
    """

    def __init__(
        self, replicas: Sequence[Broker] | Replicas, *, attempts: int = 4, timeout: float = 30
    ) -> None:
        self._replicas = list(replicas)
        self._next = itertools.count()
        self._lock = threading.Lock()
        self._attempts = attempts
        self._local = threading.local()
        self._timeout = timeout
        self.served = [0] * len(self._replicas)
        self.retries = 0

    def _client(self, index: int) -> httpx2.Client:
        clients: dict[int, httpx2.Client] | None = getattr(self._local, "clients", None)
        if clients is None:
            clients = self._local.clients = {}
        if index not in clients:
            clients[index] = httpx2.Client(base_url=self._replicas[index].url, timeout=self._timeout)
        return clients[index]

    def _forget(self, index: int) -> None:
        """Drop this thread's pooled connections to a replica (they died with it)."""
        clients: dict[int, httpx2.Client] = getattr(self._local, "clients", {})
        client = clients.pop(index, None)
        if client is not None:
            client.close()

    def pick(self) -> int:
        with self._lock:
            return next(self._next) % len(self._replicas)

    def post(self, token: str, path: str, **kwargs: Any) -> httpx2.Response:
        return self.request("POST", path, token, **kwargs)

    def get(self, token: str, path: str, **kwargs: Any) -> httpx2.Response:
        return self.request("GET", path, token, **kwargs)

    def request(self, method: str, path: str, token: str, **kwargs: Any) -> httpx2.Response:
        headers = {"authorization": f"Bearer {token}", **kwargs.pop("headers", {})}
        index = self.pick()
        for attempt in range(self._attempts):
            try:
                response = self._client(index).request(method, path, headers=headers, **kwargs)
            except httpx2.TransportError:
                self._forget(index)
                if attempt + 1 == self._attempts:
                    raise
                with self._lock:
                    self.retries += 1
                index = (index + 1) % len(self._replicas)
                continue
            with self._lock:
                self.served[index] += 1
            return response
        raise AssertionError("unreachable")

    def close(self) -> None:
        clients: dict[int, httpx2.Client] = getattr(self._local, "clients", {})
        for client in clients.values():
            client.close()
        clients.clear()
