"""The broker's HTTP protocol at the edge: each request must arrive whole within a deadline.

uvicorn bounds only the idle time between two requests on a keep-alive connection. A client
that connects and sends nothing, sends a request head a byte at a time, or announces a body
and never sends it keeps its connection (a file descriptor, a parser, a handler task) for as
long as it likes, and enough such clients lock every tenant out (slowloris). Here a request,
head and body, must be read within `read_timeout` seconds of its first byte; the first request
on a connection, within `read_timeout` of the connection being accepted.

When the deadline passes:
- before the head is complete (no handler runs yet): `408 Request Timeout`, connection closed;
- while the body is read (the handler is waiting for it): the same 408, the connection closed;
  the handler then sees the client leave, and the scope's `READ_DEADLINE` extension says why,
  so the audit line records a timeout, not a disconnect;
- after the handler has started its answer: the connection is closed, nothing more is written.

Answers still leave in one write each (`OneWriteHttpToolsProtocol`).

    uvicorn.Config(app, http=edge_protocol(read_timeout=15.0, on_timeout=counter.inc), ...)

Cost: one libuv timer per request, made and cancelled (~3 µs warm on uvloop).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from server.http_protocol import OneWriteHttpToolsProtocol

READ_DEADLINE = "docbroker.read_deadline"  # scope["extensions"] key, set when the deadline passed

_BODY = b'{"error":"request_timeout","error_description":"the request was not received in time"}'
_REQUEST_TIMEOUT = (
    b"HTTP/1.1 408 Request Timeout\r\n"
    b"content-type: application/json\r\n"
    b"content-length: %d\r\n"
    b"connection: close\r\n\r\n%s" % (len(_BODY), _BODY)
)


class ReadDeadlineProtocol(OneWriteHttpToolsProtocol):
    """`OneWriteHttpToolsProtocol` with a deadline on reading each request (see the module)."""

    read_timeout: float = 15.0  # both set per server by `edge_protocol`
    on_timeout: Callable[[], object] = staticmethod(lambda: None)
    _deadline: asyncio.TimerHandle | None = None
    _head_read = False

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._head_read = False
        if self._deadline is None:  # the connection's first request keeps the accept-time deadline
            self._arm()

    def on_headers_complete(self) -> None:
        self._head_read = True
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        self._disarm()
        super().on_message_complete()

    def _arm(self) -> None:
        self._deadline = self.loop.call_later(self.read_timeout, self._deadline_passed)

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _deadline_passed(self) -> None:
        self._deadline = None
        if self.transport.is_closing():
            return
        self.on_timeout()
        cycle = self.cycle
        if self._head_read:  # a handler runs for this request: tell it why its client leaves
            self.scope.setdefault("extensions", {})[READ_DEADLINE] = {}
        # The 408 is written only where no handler can be writing: while a head is read and
        # no earlier answer is still going out, or while this request's handler, its answer
        # not begun, waits for the body (it wakes only when the close reaches it).
        if self._head_read:
            quiet = cycle is not None and not cycle.response_started
        else:
            quiet = cycle is None or cycle.response_complete
        if quiet and not self.pipeline:
            self.transport.write(_REQUEST_TIMEOUT)
        self.transport.close()


def edge_protocol(
    read_timeout: float, on_timeout: Callable[[], object] = lambda: None
) -> type[ReadDeadlineProtocol]:
    """The protocol class for uvicorn's `http=`: this server's read deadline, and what to call
    each time it cuts a connection (a metric)."""
    namespace: dict[str, Any] = {
        "read_timeout": read_timeout,
        "on_timeout": staticmethod(on_timeout),
        "__module__": __name__,
    }
    return type("EdgeHttpProtocol", (ReadDeadlineProtocol,), namespace)
