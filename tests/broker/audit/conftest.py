from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from broker.audit import AuditLog
from broker.settings import AuditFsync, AuditSettings


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def log_path(tmp_path: Path) -> Path:
    return tmp_path / "audit" / "audit.jsonl"


@pytest.fixture
async def audit(log_path: Path) -> AsyncIterator[AuditLog]:
    log = await AuditLog.open(AuditSettings(path=log_path, fsync=AuditFsync.INTERVAL))
    try:
        yield log
    finally:
        await log.close()
