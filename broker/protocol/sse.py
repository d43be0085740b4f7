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


class EventReader:
    """Splits an SSE byte stream into events, fed one chunk at a time.

    The sandbox chooses how its bytes are cut: an event of a megabyte in 100-byte chunks is
    10,000 chunks, and rebuilding and searching the whole buffer on each one cost 2.6 s of
    the broker's event loop, four times that per doubling (here, 6 ms: bench/sse_parse.py).
    Each chunk is normalised alone and only bytes not yet searched are searched (one byte
    back, for a terminator cut in two). `searched` counts the bytes searched.
    """

    def __init__(self, max_event_bytes: int) -> None:
        self._max = max_event_bytes
        self._buffer = bytearray()  # the event being received, line ends normalised
        self._done = 0  # bytes of the buffer already searched for a terminator
        self._cr = False  # the last chunk ended in CR: the next may begin with its LF
        self.searched = 0

    def feed(self, chunk: bytes) -> list[Event]:
        """The events this chunk completes; EventTooLarge when the one it leaves open is over
        the limit."""
        if self._cr:
            chunk, self._cr = b"\r" + chunk, False
        if chunk.endswith(b"\r"):
            chunk, self._cr = chunk[:-1], True
        buffer = self._buffer
        buffer.extend(chunk.replace(b"\r\n", b"\n"))
        found: list[Event] = []
        while True:
            start = max(self._done - 1, 0)
            end = buffer.find(b"\n\n", start)
            if end < 0:
                self.searched += len(buffer) - start
                self._done = len(buffer)
                break
            self.searched += end + 2 - start
            raw = bytes(buffer[:end])
            del buffer[: end + 2]  # from the front of a bytearray: no copy of the rest
            self._done = 0
            if raw.strip():
                found.append(Event(raw))
        if len(buffer) > self._max:
            raise EventTooLarge
        return found

    def close(self) -> Event | None:
        """The last event, if the stream ended without its blank line."""
        rest = bytes(self._buffer) + (b"\r" if self._cr else b"")
        self._buffer.clear()
        return Event(rest.rstrip(b"\n")) if rest.strip() else None


async def events(chunks: AsyncIterator[bytes], max_event_bytes: int) -> AsyncIterator[Event]:
    reader = EventReader(max_event_bytes)
    async for chunk in chunks:
        for event in reader.feed(chunk):
            yield event
    last = reader.close()
    if last is not None:
        yield last
