"""Shared fixtures for the document-tools server tests.

A tenant here is a real folder pair (`sources/`, `reports/`) in a temporary directory, a real
secret file, and tokens minted exactly as DESIGN §3 prescribes. Nothing is mocked: the tests
drive the real `Workspace`, `ApprovalVerifier` and `DocumentTools`, or the real server process.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import os
import secrets
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
# Subprocesses run `python -m server` with cwd=REPO (pytest's `pythonpath` covers this process).

from server.approval import content_sha256  # noqa: E402
from server.contracts import TOOL_SAVE  # noqa: E402

TENANT = "acme"
SECRET = "acme-approval-secret-" + "0123456789abcdef" * 2  # 53 ASCII characters

# Strings that must never come back in a message, nor reach a log line.
CANARIES = ("CANARY-PATH-7f3a", "CANARY-CONTENT-91bc", "CANARY-TOKEN-5d2e", "CANARY-QUERY-c0de")


@pytest.fixture(scope="session")
def anyio_backend() -> str:
    # Session scope: the protocol tests hold one connected client per module.
    return "asyncio"


def make_tenant(base: Path, secret: str = SECRET) -> tuple[Path, Path]:
    """Create DOCS_ROOT (with sources/ and reports/) and a secret file under `base`."""
    root = base / "docs"
    (root / "sources").mkdir(parents=True)
    (root / "reports").mkdir()
    secret_file = base / "approval.key"
    secret_file.write_text(secret + "\n", encoding="ascii")
    secret_file.chmod(0o600)
    return root, secret_file


@pytest.fixture
def docs_root(tmp_path: Path) -> Path:
    root, _ = make_tenant(tmp_path)
    return root


@pytest.fixture
def sources(docs_root: Path) -> Path:
    return docs_root / "sources"


@pytest.fixture
def reports(docs_root: Path) -> Path:
    return docs_root / "reports"


@pytest.fixture
def secret_file(docs_root: Path) -> Path:
    return docs_root.parent / "approval.key"


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    """A folder next to DOCS_ROOT that the server must never reach."""
    path = tmp_path / "outside"
    path.mkdir()
    return path


def server_env(root: Path | None, secret_file: Path | None, tenant: str | None = TENANT) -> dict[str, str]:
    """The environment of a server process: the caller's, minus any DOCS_* it inherited."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("DOCS_")}
    for name, value in (("DOCS_ROOT", root), ("DOCS_SCOPE", tenant), ("DOCS_SECRET_FILE", secret_file)):
        if value is not None:
            env[name] = str(value)
    return env


# --- approval tokens, built from the DESIGN §3 formula (not from server.approval) ----------------


def sign_payload(payload: Any, secret: str = SECRET) -> str:
    """Encode and MAC any JSON value exactly as DESIGN §3 describes."""
    encoded = base64.urlsafe_b64encode(
        json.dumps(payload, sort_keys=True, separators=(",", ":")).encode()
    ).decode()
    mac = hmac.new(secret.encode("ascii"), encoded.encode(), hashlib.sha256).hexdigest()
    return f"{encoded}.{mac}"


def token_payload(
    filename: str, content: str, /, *, now: float | None = None, **overrides: Any
) -> dict[str, Any]:
    """A valid payload for this save; keyword arguments replace (or add) single fields verbatim."""
    now = time.time() if now is None else now
    payload: dict[str, Any] = {
        "v": 1,
        "scope": TENANT,
        "tool": TOOL_SAVE,
        "filename": filename,
        "sha256": content_sha256(content),
        "expires": int(now) + 120,
        "jti": secrets.token_hex(16),
    }
    payload.update(overrides)
    return payload


def mint(filename: str, content: str, /, *, secret: str = SECRET, **fields: Any) -> str:
    """A token for this save; keyword arguments change single payload fields."""
    return sign_payload(token_payload(filename, content, **fields), secret)


def assert_no_canary(text: str) -> None:
    for canary in CANARIES:
        assert canary not in text


@pytest.fixture
def no_canary_in_logs(caplog: pytest.LogCaptureFixture) -> Iterator[None]:
    """Capture every log record of the test and check none carries a canary."""
    caplog.set_level("DEBUG")
    yield
    # After the yield `caplog.records` is the teardown phase's (empty): ask for the call's.
    records = caplog.get_records("setup") + caplog.get_records("call")
    assert records, "nothing was logged: the check would prove nothing"
    for record in records:
        assert_no_canary(record.getMessage())


class Kit:
    """The helpers above, handed to test modules as the `kit` fixture.

    Test modules do not import conftest (that breaks under pytest's importlib mode and when
    another test folder has its own conftest); they ask for this fixture instead.
    """

    repo = REPO
    tenant = TENANT
    secret = SECRET
    canaries = CANARIES
    make_tenant = staticmethod(make_tenant)
    env = staticmethod(server_env)
    sign = staticmethod(sign_payload)
    payload = staticmethod(token_payload)
    mint = staticmethod(mint)
    assert_no_canary = staticmethod(assert_no_canary)


@pytest.fixture(scope="session")
def kit() -> type[Kit]:
    return Kit
