"""Is a sandbox's server listening yet: the one wait the lifecycle and the warm pool share."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time
from collections.abc import Awaitable, Callable

from broker.types import Endpoint


async def wait_ready(
    endpoint: Endpoint, timeout: float, alive: Callable[[], Awaitable[bool]] | None = None
) -> bool:
    """Wait until the endpoint accepts connections (uvicorn listening), or time out.

    With `alive`, a sandbox that died while starting is given up on at once instead of after
    the whole start timeout (a crash loop must not hold callers for seconds each).

    Polling is tight while a start is normal (a sandbox is ready ~1 s after its start, and
    every step past that moment is added to the tenant's first call) and looser once a start
    runs long: a host starting a hundred sandboxes at once is busy enough.
    """
    started = time.monotonic()
    deadline = started + timeout
    next_alive_check = started + 0.25
    delay = 0.005
    while time.monotonic() < deadline:
        now = time.monotonic()
        if alive is not None and now >= next_alive_check:
            if not await alive():
                return False
            next_alive_check = time.monotonic() + (0.25 if now - started < _TIGHT_SECONDS else 1.0)
        if endpoint.uds is not None:
            if _uds_accepts(endpoint.uds):
                return True
        else:
            with contextlib.suppress(OSError):
                host, port = _host_port(endpoint.url)
                _, writer = await asyncio.wait_for(asyncio.open_connection(host, port), timeout=1.0)
                writer.close()
                return True
        await asyncio.sleep(delay)
        delay = min(delay * 2, 0.01 if time.monotonic() - started < _TIGHT_SECONDS else 0.05)
    return False


_TIGHT_SECONDS = 3.0


def _uds_accepts(path: str) -> bool:
    """Does a server listen on this unix socket? Never blocks: on Linux a non-blocking AF_UNIX
    connect succeeds or fails at once (EAGAIN, a full backlog, counts as not yet)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.setblocking(False)
        try:
            sock.connect(path)
        except OSError:
            return False
        return True


def _host_port(url: str) -> tuple[str, int]:
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    return parts.hostname or "localhost", parts.port or (443 if parts.scheme == "https" else 80)
