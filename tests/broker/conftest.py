"""Fixtures for the broker's end-to-end tests: one real broker per session, shared.

A broker costs a few seconds to start and each tenant's first call another second or two
(its server starts), so the tests share one broker with a handful of tenants whose policies
differ, and only tests that must own a broker's whole life (restart, a failing audit sink)
start their own.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from broker.testing import Broker, make_broker
from tests.broker.support import CALL_TIMEOUT_SECONDS, UNLIMITED, write_policies

# Tenants of the shared broker, each with the policy its tests need. "acme" and "globex" are
# the harness's; their files are rewritten here so that the many approvals the suite opens
# never hit the per-tenant cap of pending approvals.
TENANT_POLICIES = {
    "acme": UNLIMITED + "[approvals]\nmax_pending = 10000\n",
    "globex": UNLIMITED + "[approvals]\nmax_pending = 10000\n",
    # 3 requests at once, then one every 10 s
    "ratelimited": "[limits]\nrate_per_minute = 6\nburst = 3\n",
    "ratelimited-too": "[limits]\nrate_per_minute = 6\nburst = 3\n",
    "solo": UNLIMITED + "max_concurrent = 1\nmax_streams = 1\n",
    "readonly": UNLIMITED + '[tools]\nallowed = ["search_documents", "read_document"]\n',
    "strict": UNLIMITED + "[approvals]\nrequire_distinct_approver = true\nmax_pending = 10000\n",
    "crashy": UNLIMITED,
}


@pytest.fixture(scope="session")
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="session")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Broker]:
    b = make_broker(
        tmp_path_factory.mktemp("shared-broker"),
        env={"DOCBROKER_CALL_TIMEOUT": str(CALL_TIMEOUT_SECONDS), "DOCBROKER_BREAKER_COOLDOWN": "1"},
    )
    write_policies(b, TENANT_POLICIES)
    b.start()
    try:
        yield b
    finally:
        b.stop()
