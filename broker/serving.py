"""The broker's uvicorn server: SIGINT or SIGTERM shuts it down gracefully, and `serve` returns.

uvicorn's own signal handling re-raises the signal once its graceful shutdown is done. Under
asyncio's runner that cancels the main task while it is still closing the audit log (the
final fsync), and Ctrl-C ends in a traceback; a re-raised SIGTERM kills the process before the
log is closed at all. Here the same uvicorn shutdown runs, then `serve` simply returns, so the
caller closes the audit log and the process exits 0. A second Ctrl-C during the shutdown
forces it, as in uvicorn, with one difference: uvicorn's forced shutdown skips the app's own
shutdown, which is what stops the tenants' sandboxes and closes the engine connections (a
Ctrl-C pressed twice left every sandbox running). Here "forced" stops the wait for open
connections only; the app's shutdown always runs, and bounds itself (`Runtime.close`).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import resource
import signal
import socket
from collections.abc import Iterator

import uvicorn

log = logging.getLogger("docbroker")
_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class BrokerServer(uvicorn.Server):
    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        loop = asyncio.get_running_loop()
        for sig in _SIGNALS:
            loop.add_signal_handler(sig, self.handle_exit, sig, None)
        try:
            yield
        finally:
            for sig in _SIGNALS:
                loop.remove_signal_handler(sig)

    async def main_loop(self) -> None:
        # Started: what start-up made (modules, the app, its settings) lives as long as the
        # process, and a full collection would walk all of it each time (~35 ms of a held GIL
        # on this host: the warm calls' p99). Frozen, the collector skips it.
        gc.collect()
        gc.freeze()
        await super().main_loop()

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        app_shutdown = self.lifespan.shutdown
        ran = False

        async def once() -> None:
            nonlocal ran
            ran = True
            await app_shutdown()

        setattr(self.lifespan, "shutdown", once)  # noqa: B010 - to see whether uvicorn ran it
        try:
            await super().shutdown(sockets)
        finally:
            setattr(self.lifespan, "shutdown", app_shutdown)  # noqa: B010
        if not ran:  # forced: uvicorn skipped it; the sandboxes still have to go
            log.warning("forced shutdown: stopping the sandboxes before exiting")
            await app_shutdown()


def raise_open_file_limit(needed: int) -> tuple[int, int]:
    """The soft open-file limit raised to the hard one; (soft, hard) after.

    Each client connection, each tenant's sandbox connections and the Docker client's pool is
    a descriptor, and a service manager's default soft limit (systemd: 1024) is about what
    DOCBROKER_MAX_CONNECTIONS alone allows (1000): with a few hundred tenants the broker would
    fail accepts and sandbox connections with EMFILE. The hard limit is the operator's; below
    `needed` (what the settings allow at most) the broker says so once, with the numbers.
    """
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        soft = hard
    limit = soft if soft != resource.RLIM_INFINITY else needed
    if limit < needed:
        log.warning(
            "the open-file limit is below what the settings allow: raise LimitNOFILE / ulimit -Hn",
            extra={"limit": limit, "needed": needed},
        )
    return soft, hard
