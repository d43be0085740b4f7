"""A real broker for tests and benchmarks: `python -m broker serve` in a subprocess, real HTTP,
real sandboxes (as `starlette.testclient`, shipped with the product so `bench/` need not import
`tests/`; nothing in `broker/` imports it).

Tokens are RS256, signed with a key whose public half the broker loads from a JWKS file, as
an identity provider's would be. Nothing here reaches into the broker's memory: tests see it
the way clients and operators do (HTTP, files, logs).
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx2
import jwt
from cryptography.hazmat.primitives.asymmetric import rsa
from jwt.algorithms import RSAAlgorithm
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from broker.settings import RuntimeKind

ROOT = Path(__file__).resolve().parents[2]
ISSUER = "https://idp.test.invalid"
AUDIENCE = "docbroker-test"
ALL_SCOPES = "docs:read docs:write reports:approve"
TENANTS = ("acme", "globex")


def free_port() -> int:
    """A port on 127.0.0.1 kept from everyone else for about a minute, for a server started
    later (a CI run lost one to another worker in the seconds an OpenID Provider took to start
    first). One connection is accepted and closed on it, the accepted side first: the port
    stays in TIME_WAIT, which the kernel's bind(0) and outgoing connections skip, while a bind
    with SO_REUSEADDR (uvicorn's, server/listen.py's) takes it at once."""
    with socket.socket() as listener:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)
        port = int(listener.getsockname()[1])
        with socket.create_connection(("127.0.0.1", port)):
            accepted, _ = listener.accept()
            accepted.close()
    return port


@dataclass
class Broker:
    url: str
    data_dir: Path
    log_file: Path
    env: dict[str, str]
    private_key: rsa.RSAPrivateKey
    kid: str
    proc: subprocess.Popen[bytes] | None = None
    ops_token: str = ""  # DOCBROKER_OPS_TOKEN_FILE's: /metrics and /readyz's details
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def mcp_url(self) -> str:
        return f"{self.url}/mcp"

    @property
    def audit_file(self) -> Path:
        return self.data_dir / "audit.jsonl"

    def token(
        self, tenant: str = "acme", subject: str = "alice", scope: str = ALL_SCOPES, **claims: Any
    ) -> str:
        now = int(time.time())
        payload: dict[str, Any] = {
            "iss": ISSUER,
            "aud": AUDIENCE,
            "sub": subject,
            "tenant": tenant,
            "scope": scope,
            "iat": now,
            "exp": now + 600,
        }
        payload.update(claims)
        payload = {k: v for k, v in payload.items() if v is not _DROP}
        return jwt.encode(payload, self.private_key, algorithm="RS256", headers={"kid": self.kid})

    def sources(self, tenant: str) -> Path:
        return self.data_dir / "tenants" / tenant / "docs" / "sources"

    def reports(self, tenant: str) -> Path:
        return self.data_dir / "tenants" / tenant / "reports"

    def audit_events(self) -> list[dict[str, Any]]:
        if not self.audit_file.exists():
            return []
        return [json.loads(line) for line in self.audit_file.read_text().splitlines() if line.strip()]

    def logs(self) -> str:
        return self.log_file.read_text(errors="replace") if self.log_file.exists() else ""

    @property
    def ops_headers(self) -> dict[str, str]:
        """What an operator (a Prometheus scraper) sends to read /metrics and /readyz's details."""
        return {"authorization": f"Bearer {self.ops_token}"}

    def http(self, token: str | None = None, **kwargs: Any) -> httpx2.Client:
        headers = {"authorization": f"Bearer {token}"} if token else {}
        return httpx2.Client(base_url=self.url, headers=headers, timeout=30, **kwargs)

    @contextlib.asynccontextmanager
    async def client(self, token: str, mode: str = "auto", **kwargs: Any) -> AsyncIterator[Client]:
        http = httpx2.AsyncClient(headers={"authorization": f"Bearer {token}"}, timeout=30)
        async with (
            http,
            Client(streamable_http_client(self.mcp_url, http_client=http), mode=mode, **kwargs) as c,
        ):
            yield c

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None

    def start(self) -> None:
        log = self.log_file.open("ab")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "broker", "serve"],
            cwd=ROOT,
            env=self.env,
            stdout=log,
            stderr=log,
            stdin=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"broker exited early:\n{self.logs()[-3000:]}")
            with contextlib.suppress(httpx2.TransportError):
                if self._answers_as_itself():
                    return
            time.sleep(0.1)
        raise RuntimeError(f"broker did not start:\n{self.logs()[-3000:]}")

    def _answers_as_itself(self) -> bool:
        """Whether our process answers on our port, not another test's server that took the port
        between free_port() and our bind (seen in CI: our broker then exits, the other answers
        /healthz, and the module's tests meet a closed port later): the listening socket must
        be one of our process's own descriptors."""
        if httpx2.get(f"{self.url}/healthz", timeout=1).status_code != 200:
            return False
        assert self.proc is not None
        return _listening_inodes(urlsplit(self.url).port or 0) & _socket_inodes(self.proc.pid) != set()


class _Drop:
    """Marker: leave this claim out of the token."""


_DROP = _Drop()
DROP: Any = _DROP


def make_broker(
    tmp: Path,
    *,
    runtime: str = "local",
    env: dict[str, str] | None = None,
    tenants: Iterable[str] = TENANTS,
    limits: str = "[limits]\nrate_per_minute = 100000\nburst = 10000\n",
) -> Broker:
    """A broker (not started) with its own identity provider (an RS256 JWKS file) and policies.

    Also used by bench/broker_overhead.py, so the tests and the benchmark run the same setup.
    """
    data_dir = tmp / "data"
    policies = tmp / "policies"
    shutil.copytree(ROOT / "policies", policies, ignore=shutil.ignore_patterns("tenants"))
    (policies / "tenants").mkdir()
    for tenant in tenants:
        (policies / "tenants" / f"{tenant}.toml").write_text(limits)
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    kid = secrets.token_hex(4)
    jwk = json.loads(RSAAlgorithm.to_jwk(key.public_key()))
    jwk.update({"kid": kid, "alg": "RS256", "use": "sig"})
    jwks_file = tmp / "jwks.json"
    jwks_file.write_text(json.dumps({"keys": [jwk]}))
    ops_token = secrets.token_urlsafe(32)
    ops_file = tmp / "ops.token"
    ops_file.write_text(ops_token + "\n")
    ops_file.chmod(0o600)
    port = free_port()
    full_env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": os.environ.get("HOME", "/root"),
        "PYTHONPATH": str(ROOT),
        "DOCBROKER_HOST": "127.0.0.1",
        "DOCBROKER_PORT": str(port),
        "DOCBROKER_DATA_DIR": str(data_dir),
        "DOCBROKER_POLICIES_DIR": str(policies),
        "DOCBROKER_AUTH_ISSUER": ISSUER,
        "DOCBROKER_AUTH_AUDIENCE": AUDIENCE,
        "DOCBROKER_AUTH_JWKS_FILE": str(jwks_file),
        "DOCBROKER_OPS_TOKEN_FILE": str(ops_file),
        "DOCBROKER_RUNTIME": runtime,
        "DOCBROKER_ALLOW_INSECURE_LOCAL_RUNTIME": "1" if runtime == RuntimeKind.LOCAL else "0",
        # Every test client shares 127.0.0.1, and many send bad tokens on purpose: the pre-auth
        # limit would turn their 401s into 429s. Its own tests set it tight.
        "DOCBROKER_PREAUTH_RATE": "10000",
        "DOCBROKER_PREAUTH_BURST": "1000000",
        # Signed checkpoints only as each file's first line and at shutdown, so a test reading the
        # lines of its own requests never meets one; tests of checkpoints set their own cadence.
        "DOCBROKER_AUDIT_CHECKPOINT_EVERY": "1000000",
        "DOCBROKER_AUDIT_CHECKPOINT_INTERVAL": "86400",
        **(env or {}),
    }
    return Broker(
        url=f"http://127.0.0.1:{port}",
        data_dir=data_dir,
        log_file=tmp / "broker.log",
        env=full_env,
        private_key=key,
        kid=kid,
        ops_token=ops_token,
    )


@contextlib.contextmanager
def running_broker(tmp: Path, **kwargs: Any) -> Iterator[Broker]:
    broker = make_broker(tmp, **kwargs)
    broker.start()
    try:
        yield broker
    finally:
        broker.stop()


def structured(result: Any) -> dict[str, Any]:
    """The structured result of a CallToolResult, as a dict."""
    value = result.structured_content
    assert isinstance(value, dict), result
    return value


def _listening_inodes(port: int) -> set[str]:
    """Inodes of the sockets listening on `port` (any address), from /proc/net/tcp{,6}."""
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError), open(table) as f:
            for row in f.readlines()[1:]:
                fields = row.split()
                if fields[3] == "0A" and int(fields[1].rsplit(":", 1)[1], 16) == port:  # 0A: LISTEN
                    found.add(fields[9])
    return found


def _socket_inodes(pid: int) -> set[str]:
    """Inodes of the sockets `pid` and its descendants hold (a broker run as another user is
    the child of the command that switched users)."""
    found, pending = set(), [pid]
    while pending:
        current = pending.pop()
        with contextlib.suppress(OSError):
            for fd in os.listdir(f"/proc/{current}/fd"):
                with contextlib.suppress(OSError):
                    target = os.readlink(f"/proc/{current}/fd/{fd}")
                    if target.startswith("socket:["):
                        found.add(target[8:-1])
            for task in os.listdir(f"/proc/{current}/task"):
                with contextlib.suppress(OSError), open(f"/proc/{current}/task/{task}/children") as f:
                    pending.extend(int(child) for child in f.read().split())
    return found
