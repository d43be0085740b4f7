"""The broker's uvicorn server: SIGINT or SIGTERM shuts it down gracefully, and `serve` returns.

uvicorn's own signal handling re-raises the signal once its graceful shutdown is done. Under
asyncio's runner that cancels the main task while it is still closing the audit log (the
final fsync), and Ctrl-C ends in a traceback; a re-raised SIGTERM kills the process before the
log is closed at all. Here the same uvicorn shutdown runs, then `serve` simply returns, so the
caller closes the audit log and the process exits 0. A second signal during the shutdown
forces it, as in uvicorn.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import Iterator

import uvicorn

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
