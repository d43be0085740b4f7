"""A real reports keeper (`python -m broker.keeper`) on real folders, for the keeper tests.

The tenant Pod's layout in one temporary directory: `dropbox/` (what the server writes into,
the emptyDir) and `reports/` (the PVC, only the keeper's). The keeper is a subprocess with its
own key file; requests are raw HTTP, as anything on the pod network could send them.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import secrets
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from broker.testing import free_port

REPO = Path(__file__).resolve().parents[3]

MASTER = secrets.token_bytes(32)


def derived(label: bytes, tenant: str) -> str:
    """DESIGN §10's derivations, computed here (not imported from the broker)."""
    return hmac.new(MASTER, label + tenant.encode(), hashlib.sha256).hexdigest()


KEEPER_KEY = derived(b"docbroker/keeper/v1/", "acme")


@dataclass
class Keeper:
    base: Path
    port: int
    proc: subprocess.Popen[bytes]
    log: Path

    @property
    def dropbox(self) -> Path:
        return self.base / "dropbox"

    @property
    def reports(self) -> Path:
        return self.base / "reports"

    @property
    def quarantine(self) -> Path:
        return self.base / "quarantine"  # beside the drop-box, as in the Pod's emptyDir

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def drop(self, name: str, data: bytes) -> Path:
        """What the server does: a new file in the drop-box, mode 0o040."""
        path = self.dropbox / name
        path.write_bytes(data)
        path.chmod(0o040)
        return path

    def post(
        self,
        path: str,
        body: Any,
        *,
        key: str | None = KEEPER_KEY,
        raw: bytes | None = None,
        content_type: str = "application/json",
        method: str = "POST",
    ) -> tuple[int, Any]:
        data = raw if raw is not None else json.dumps(body).encode()
        head = [
            f"{method} {path} HTTP/1.1",
            f"host: 127.0.0.1:{self.port}",
            f"content-type: {content_type}",
            f"content-length: {len(data)}",
            "connection: close",
        ]
        if key is not None:
            head.append(f"authorization: Bearer {key}")
        with socket.create_connection(("127.0.0.1", self.port), timeout=10) as s:
            s.sendall("\r\n".join(head).encode() + b"\r\n\r\n" + data)
            answer = b""
            while chunk := s.recv(65536):
                answer += chunk
        status_line, _, rest = answer.partition(b"\r\n")
        payload = rest.partition(b"\r\n\r\n")[2]
        try:
            parsed = json.loads(payload) if payload else None
        except ValueError:
            parsed = payload
        return int(status_line.split()[1]), parsed

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def start_keeper(base: Path, *, key: str = KEEPER_KEY, env: dict[str, str] | None = None) -> Keeper:
    for folder in ("dropbox", "reports"):
        (base / folder).mkdir(exist_ok=True)
    (base / "dropbox").chmod(0o1733)  # as the Pod's keeper makes it (the contract, stated here)
    key_file = base / "keeper.key"
    key_file.write_text(key + "\n", encoding="ascii")
    key_file.chmod(0o600)
    port = free_port()
    values = {
        "PATH": "/usr/bin:/bin",
        "KEEPER_DROPBOX": str(base / "dropbox"),
        "KEEPER_REPORTS": str(base / "reports"),
        "KEEPER_KEY_FILE": str(key_file),
        **(env or {}),
    }
    log = base / "keeper.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "broker.keeper", "--http", f"127.0.0.1:{port}"],
            cwd=REPO,
            env={k: v for k, v in values.items() if v},
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    return Keeper(base=base, port=port, proc=proc, log=log)


def wait_serving(keeper: Keeper) -> Keeper:
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        if keeper.proc.poll() is not None:
            pytest.fail(f"keeper exited with {keeper.proc.returncode}: {keeper.log.read_text()}")
        try:
            socket.create_connection(("127.0.0.1", keeper.port), timeout=1).close()
            return keeper
        except OSError:
            time.sleep(0.05)
    pytest.fail(f"keeper did not start: {keeper.log.read_text()}")
