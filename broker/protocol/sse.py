"""Server-Sent Events: parsed incrementally, one event at a time, and framed.

The gateway must see each JSON-RPC message in an SSE stream (to filter and audit it) without
buffering the whole response: events are forwarded as soon as their blank-line terminator
arrives. An event larger than the limit ends the stream.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from dataclasses import dataclass

_EVENT_ID = re.compile(rb"[A-Za-z0-9_.:-]{1,128}")


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
        """An event of the broker's framing carrying `data`: of the sandbox's event only its id
        is kept (for resumption), and only if it is a plain token. Its `retry:` (how long a
        client waits to reconnect), its event type and comments are the sandbox's words."""
        ids = [line[3:].strip() for line in self.raw.split(b"\n") if line.startswith(b"id:")]
        head = b"id: " + ids[-1] + b"\n" if ids and _EVENT_ID.fullmatch(ids[-1]) else b""
        return head + frame(data)

    def framed(self) -> bytes:
        return self.raw + b"\n\n"


def frame(data: bytes) -> bytes:
    """One `message` event of the broker's framing carrying `data` (a JSON-RPC message)."""
    return b"event: message\ndata: " + data + b"\n\n"


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
