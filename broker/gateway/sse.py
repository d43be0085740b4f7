"""Incremental Server-Sent Events parsing, one event at a time.

The gateway must see each JSON-RPC message in an SSE stream (to filter and audit it) without
buffering the whole response: events are forwarded as soon as their blank-line terminator
arrives. An event larger than the limit ends the stream.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass


class EventTooLarge(Exception):
    pass


@dataclass
class Event:
    raw: bytes  # the event's lines as received, without the terminating blank line

    @property
    def data(self) -> bytes | None:
        lines = [line[5:].removeprefix(b" ") for line in self.raw.split(b"\n") if line.startswith(b"data:")]
        return b"\n".join(lines) if lines else None

    def with_data(self, data: bytes) -> bytes:
        """The same event (id, event type, retry kept) carrying new data, framed for the wire."""
        kept = [line for line in self.raw.split(b"\n") if not line.startswith(b"data:")]
        return b"\n".join([*kept, b"data: " + data]) + b"\n\n"

    def framed(self) -> bytes:
        return self.raw + b"\n\n"


async def events(chunks: AsyncIterator[bytes], max_event_bytes: int) -> AsyncIterator[Event]:
    buffer = b""
    async for chunk in chunks:
        buffer = (buffer + chunk).replace(b"\r\n", b"\n")  # a CR may end one chunk, its LF start the next
        while True:
            end = buffer.find(b"\n\n")
            if end < 0:
                break
            raw, buffer = buffer[:end], buffer[end + 2 :]
            if raw.strip():
                yield Event(raw)
        if len(buffer) > max_event_bytes:
            raise EventTooLarge
    if buffer.strip():
        yield Event(buffer.rstrip(b"\n"))
