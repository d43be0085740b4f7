from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from broker.audit import AuditLog
from broker.settings import AuditFsync
from tests.broker.audit.audit_helpers import plain


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def log_path(tmp_path: Path) -> Path:
    return tmp_path / "audit" / "audit.jsonl"


@pytest.fixture
async def audit(log_path: Path) -> AsyncIterator[AuditLog]:
    log = await AuditLog.open(plain(log_path, fsync=AuditFsync.INTERVAL))
    try:
        yield log
    finally:
        await log.close()
