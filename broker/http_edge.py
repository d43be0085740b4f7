"""The broker's HTTP protocol at the edge: each request must arrive whole, soon, and small-headed.

uvicorn with httptools bounds neither how long a request may take to arrive nor how large its
head may grow; it bounds only the idle time between two requests on a keep-alive connection.
So a client that connects and sends nothing, sends a head a byte at a time, or announces a
body and never sends it keeps its connection (a file descriptor, a parser, a handler task) for
as long as it likes (slowloris), and one that streams an endless header has it buffered in
memory (200 MB of one header took the broker from 77 to 265 MiB). Here:

- **Read deadline.** A request, head and body, must be read within `read_timeout_seconds` of
  its first byte; the first request on a connection, within that time of the accept.
  When it passes before the head is complete (no handler runs yet) or while the handler waits
  for the body: `408 Request Timeout`, connection closed. The handler then sees the client
  leave, and the scope's `READ_DEADLINE` extension says why, so the audit line records a
  timeout, not a disconnect.
- **Head cap.** The request line and headers together may be at most `max_head_bytes`:
  `431 Request Header Fields Too Large`, connection closed, before a handler runs for it.
- **Trailers.** httptools reports a chunked body's trailer fields through the same `on_header`
  as the head's, after the head is complete, and uvicorn appends them to the scope's headers:
  a token sent only in a trailer authenticated, and endless trailer lines were buffered (20 MiB
  of them grew the broker by 480 MiB). Trailer fields are discarded (RFC 9110 §6.5.1 lets a
  recipient do so; nothing the broker serves uses them, and uvicorn's h11 protocol drops them
  too), and everything of a request after its head that is not body data (chunk sizes, chunk
  extensions, trailers) again may be at most `max_head_bytes`: past it, 431 and the connection
  is closed. Refusing every trailer outright would instead break clients that send a harmless
  checksum trailer, and would buy nothing once trailers are neither believed nor buffered.

Either answer is written only when no handler's answer can be going out at the same time;
otherwise the connection is only closed.

Answers are not timed here (the gateway's call deadline does that), and they still leave in
one write each (`OneWriteHttpToolsProtocol`). Cost per request: a clock read, a few
attribute writes and a length check per read (the timer is per connection).

    uvicorn.Config(app, http=edge_protocol(settings.edge, on_cut=metrics.cut), ...)
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from broker.settings import EdgeSettings
from server.http_protocol import OneWriteHttpToolsProtocol

READ_DEADLINE = "docbroker.read_deadline"  # scope["extensions"] key, set when the deadline passed


def _refusal(status: bytes, error: bytes, description: bytes) -> bytes:
    body = b'{"error":"%s","error_description":"%s"}' % (error, description)
    head = b"HTTP/1.1 %s\r\ncontent-type: application/json\r\ncontent-length: %d\r\n" % (status, len(body))
    return head + b"connection: close\r\n\r\n" + body


_REQUEST_TIMEOUT = _refusal(
    b"408 Request Timeout", b"request_timeout", b"the request was not received in time"
)
_HEAD_TOO_LARGE = _refusal(
    b"431 Request Header Fields Too Large",
    b"headers_too_large",
    b"the request line and headers are too large",
)
_TRAILERS_TOO_LARGE = _refusal(
    b"431 Request Header Fields Too Large",
    b"trailers_too_large",
    b"the request's chunk framing and trailers are too large",
)


class _Discarded(list[tuple[bytes, bytes]]):
    """Where uvicorn's `on_header` appends once a head is complete: trailer fields go nowhere.

    One shared instance, always empty: no allocation per request, and nothing to iterate."""

    def append(self, item: tuple[bytes, bytes]) -> None:
        pass


_DISCARDED = _Discarded()


class EdgeProtocol(OneWriteHttpToolsProtocol):
    """`OneWriteHttpToolsProtocol` with the edge's read deadline and head cap (see the module)."""

    limits = EdgeSettings()  # both set per server by `edge_protocol`
    on_cut: Callable[[str], object] = staticmethod(lambda reason: None)

    _due: float | None = None  # when the read in progress must be done (None: none in progress)
    _timer: asyncio.TimerHandle | None = None
    _in_head = True  # the next bytes belong to a request's head (none read yet, or part of it)
    _head_read = False  # this request's head is complete: a handler runs for it
    _head_bytes = 0  # in the head: its bytes; after it: the request's non-body bytes since
    _body_bytes = 0  # body data the parser has handed over on this connection
    _heads_read = 0  # heads completed on this connection
    _refused = False  # a limit was broken: the connection is closing, nothing more is parsed

    # -- the connection -----------------------------------------------------------------------

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._start_read()

    def connection_lost(self, exc: Exception | None) -> None:
        self._due = None
        if self._timer is not None:
            self._timer.cancel()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        # Counted here, in raw bytes: httptools hands a header over only once it is complete,
        # buffering it until then, so a cap on its callbacks would come too late.
        if self._refused:
            return
        if not self._in_head:
            self._after_head(data)
            return
        room = self.limits.max_head_bytes - self._head_bytes
        if len(data) <= room:
            self._head_bytes += len(data)
            super().data_received(data)
            return
        # Parse only what may still be head; if no head is completed within it, the one being
        # read is too large. Otherwise the rest of this read (a body, a pipelined request) is
        # parsed and counted as what it is.
        heads = self._heads_read
        super().data_received(data[:room])
        if self._refused or self.transport.is_closing():
            return
        if self._heads_read == heads:
            self._refuse("head_too_large", _HEAD_TOO_LARGE if self._nobody_writing() else None)
            return
        self.data_received(data[room:])  # a body, or the next request's head: counted as such

    def _after_head(self, data: bytes) -> None:
        """Parse bytes read after a head; those that are not body data count against the cap.

        Fed in pieces no larger than the room left, so the count never passes the cap and
        what the parser buffers meanwhile (an unfinished trailer line) stays within it. A
        content-length body is all body data: one piece per read, nothing counted."""
        while data:
            room = self.limits.max_head_bytes - self._head_bytes
            if room <= 0:
                self._refuse("trailers_too_large", _TRAILERS_TOO_LARGE if self._nobody_writing() else None)
                return
            piece = data if len(data) <= room else data[:room]
            heads, body = self._heads_read, self._body_bytes
            super().data_received(piece)
            if self._refused or self.transport.is_closing():
                return
            data = data[len(piece) :]
            if self._in_head or self._heads_read != heads:
                # The request ended within the piece; the rest belongs to the next one.
                self.data_received(data)
                return
            self._head_bytes += len(piece) - (self._body_bytes - body)

    # -- the parser's callbacks -----------------------------------------------------------------

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._head_read = False
        if self._due is None:  # the connection's first request keeps the accept-time deadline
            self._start_read()

    def on_headers_complete(self) -> None:
        self._in_head, self._head_read = False, True
        self._heads_read += 1
        self._head_bytes = 0  # from here on: the non-body bytes after the head
        super().on_headers_complete()
        # uvicorn's `on_header` appends to `self.headers`, the list the scope holds: a trailer
        # field must never land there (until the next request's `on_message_begin` resets it).
        self.headers = _DISCARDED

    def on_body(self, body: bytes) -> None:
        self._body_bytes += len(body)
        super().on_body(body)

    def on_message_complete(self) -> None:
        self._due = None
        self._in_head, self._head_bytes = True, 0
        super().on_message_complete()

    # -- the limits -----------------------------------------------------------------------------

    def _nobody_writing(self) -> bool:
        """Whether an answer of ours can go out without mixing into a handler's: no handler runs
        for the head being read and no earlier answer is still going out, or this request's
        handler, its answer not begun, waits for the body (it wakes only when the close reaches
        it)."""
        if self.pipeline:
            return False
        cycle = self.cycle
        if self._head_read:
            return cycle is not None and not cycle.response_started
        return cycle is None or cycle.response_complete

    def _refuse(self, reason: str, answer: bytes | None) -> None:
        self._refused, self._due = True, None
        self.on_cut(reason)
        if answer is not None:
            self.transport.write(answer)
        self.transport.close()

    # One timer per connection, not one per request: a request sets its due time (a float), and
    # the timer, when it fires early for a later request, waits again for what remains. A timer
    # made and cancelled per request costs far more than this: a clock read.

    def _start_read(self) -> None:
        self._due = self.loop.time() + self.limits.read_timeout_seconds
        if self._timer is None:
            self._timer = self.loop.call_later(self.limits.read_timeout_seconds, self._check_due)

    def _check_due(self) -> None:
        self._timer = None
        if self._due is None:
            return  # no read in progress: the next request starts the timer again
        remaining = self._due - self.loop.time()
        if remaining > 0:
            self._timer = self.loop.call_later(remaining, self._check_due)
            return
        self._due = None
        if self.transport.is_closing():
            return
        if self._head_read:  # a handler runs for this request: tell it why its client leaves
            self.scope.setdefault("extensions", {})[READ_DEADLINE] = {}
        self._refuse("read_timeout", _REQUEST_TIMEOUT if self._nobody_writing() else None)


def edge_protocol(
    limits: EdgeSettings, on_cut: Callable[[str], object] = lambda reason: None
) -> type[EdgeProtocol]:
    """The protocol class for uvicorn's `http=`: this server's limits, and what to call with
    the reason (`read_timeout`, `head_too_large`, `trailers_too_large`) each time a connection
    is cut (a metric)."""
    namespace: dict[str, Any] = {"limits": limits, "on_cut": staticmethod(on_cut), "__module__": __name__}
    return type("EdgeHttpProtocol", (EdgeProtocol,), namespace)
