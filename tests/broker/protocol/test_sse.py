"""SSE parsing (`broker/protocol/sse.py`) from a hostile sandbox's side: however it cuts its
stream, the events are the same, and the broker's work stays linear in the bytes it sent
(issue 24 item 4: rebuilding and searching the whole buffer on every chunk made an event
sent in 100-byte chunks cost four times as much CPU per doubling of its size).

No timing here (bench/sse_parse.py measures the CPU): the bytes the reader searches are
counted, and the memory it takes per chunk is traced."""

from __future__ import annotations

import asyncio
import tracemalloc
from collections.abc import AsyncIterator, Iterable

import pytest

from broker.protocol import sse

LIMIT = 1024 * 1024
STREAM = (
    b'event: message\r\nid: 1\r\ndata: {"a":1}\r\n\r\n'
    b": a comment\n\n"
    b'data: {"b":\r\ndata: 2}\n\n'
    b"\n\n"  # nothing between two blank lines: no event
    b"id: 3\rdata: lone CR kept\n\n"
    b'data: {"c":3}\r\n\r\n'
    b"data: the last, unterminated\r\n"
)
EXPECTED = [
    b'event: message\nid: 1\ndata: {"a":1}',
    b": a comment",
    b'data: {"b":\ndata: 2}',
    b"id: 3\rdata: lone CR kept",
    b'data: {"c":3}',
    b"data: the last, unterminated",
]


async def _chunks(parts: Iterable[bytes]) -> AsyncIterator[bytes]:
    for part in parts:
        yield part


def parse(parts: Iterable[bytes], limit: int = LIMIT) -> list[bytes]:
    async def run() -> list[bytes]:
        return [event.raw async for event in sse.events(_chunks(parts), limit)]

    return asyncio.run(run())


def test_the_events_do_not_depend_on_how_the_stream_is_cut() -> None:
    assert parse([STREAM]) == EXPECTED
    assert parse([bytes([b]) for b in STREAM]) == EXPECTED  # a byte at a time
    for i in range(len(STREAM) + 1):  # every cut in two: a CR from its LF, a blank line in half
        assert parse([STREAM[:i], STREAM[i:]]) == EXPECTED, i
    for i in range(0, len(STREAM), 7):  # and in three
        for j in range(i, len(STREAM), 5):
            assert parse([STREAM[:i], STREAM[i:j], STREAM[j:]]) == EXPECTED, (i, j)


def test_an_event_over_the_limit_ends_the_stream() -> None:
    with pytest.raises(sse.EventTooLarge):
        parse([b"data: " + b"x" * 100] * 20, limit=1000)
    assert parse([b"data: " + b"x" * 990 + b"\n\n"] * 20, limit=1000) == [b"data: " + b"x" * 990] * 20


def test_each_byte_is_searched_once_however_small_the_chunks() -> None:
    reader = sse.EventReader(LIMIT)
    event = b"data: " + b"A" * (512 * 1024)
    for i in range(0, len(event), 100):
        assert reader.feed(event[i : i + 100]) == []
        # never more than each byte once, plus one byte back per chunk (a terminator cut in two)
        assert reader.searched <= i + 100 + i // 100 + 1
    assert [e.raw for e in reader.feed(b"\n\ndata: next\n\n")] == [event, b"data: next"]
    assert reader.close() is None


def test_a_chunk_costs_memory_for_itself_not_for_the_event_so_far() -> None:
    """Through the public `events()`: the memory taken while one 100-byte chunk of a growing
    event is handled. Rebuilding the buffer per chunk copied the whole event so far, each time."""
    event = b"data: " + b"A" * (256 * 1024)
    spikes: list[tuple[int, int]] = []  # (peak above the memory before the chunk, bytes so far)

    async def measured() -> AsyncIterator[bytes]:
        for i in range(0, len(event), 100):
            tracemalloc.reset_peak()
            before, _ = tracemalloc.get_traced_memory()
            yield event[i : i + 100]
            _, peak = tracemalloc.get_traced_memory()
            spikes.append((peak - before, i + 100))

    async def run() -> list[sse.Event]:
        return [e async for e in sse.events(measured(), LIMIT)]

    tracemalloc.start()
    try:
        events = asyncio.run(run())
    finally:
        tracemalloc.stop()
    assert [e.raw for e in events] == [event]
    late = [(spike, so_far) for spike, so_far in spikes if so_far > 64 * 1024]
    assert late
    # A bytearray grows in steps of an eighth of its size: a spike of that order at a step,
    # never the event so far (which the rebuild cost at every chunk).
    assert all(spike < so_far / 2 for spike, so_far in late), max(late)
