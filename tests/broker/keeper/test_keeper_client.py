"""The broker's `KeeperReports` against a real keeper subprocess, and against a keeper that is
gone, refuses or lies: every failure is a value (IO_ERROR, stuck), never an exception."""

from __future__ import annotations

import asyncio
import hashlib
import os

import pytest

from broker.approvals.keeper_client import KeeperReports
from broker.approvals.reports import Accepted, SweepReason, Swept
from broker.types import Endpoint
from tests.broker.keeper.keeper_support import KEEPER_KEY, Keeper, derived, free_port

pytestmark = pytest.mark.anyio

APPROVED = b"# Q3\napproved\n"
SHA = hashlib.sha256(APPROVED).hexdigest()


class Sweeps:
    """An OnSwept that keeps what it was told, as the audit would."""

    def __init__(self) -> None:
        self.seen: list[tuple[Swept, SweepReason]] = []

    async def __call__(self, swept: Swept, reason: SweepReason) -> None:
        self.seen.append((swept, reason))


def reports_at(url: str | None, key: str = KEEPER_KEY) -> KeeperReports:
    async def endpoint() -> Endpoint | None:
        return None if url is None else Endpoint(url="http://unused/mcp", keeper_url=url)

    return KeeperReports(endpoint, key, connect_timeout=1.0, timeout=3.0)


async def test_a_save_through_the_keeper(keeper: Keeper) -> None:
    reports = reports_at(keeper.url)
    keeper.drop("planted.md", b"planted before the save")
    sweeps = Sweeps()
    async with reports.saving(sweeps):
        keeper.drop("q3.md", APPROVED)  # the sandbox writes the approved file
        keeper.drop("beside.md", b"planted beside it")
        assert await reports.accept("q3.md", SHA) is Accepted.OK
    assert sweeps.seen == [
        (Swept(quarantined=1), SweepReason.BEFORE_SAVE),
        (Swept(quarantined=1), SweepReason.AFTER_SAVE),
    ]
    assert (keeper.reports / "q3.md").read_bytes() == APPROVED
    assert await reports.exists("q3.md") is True
    assert await reports.exists("q4.md") is False
    assert os.listdir(keeper.dropbox) == []


async def test_outcomes_come_back_as_the_keeper_decides(keeper: Keeper) -> None:
    reports = reports_at(keeper.url)
    keeper.drop("q3.md", b"other bytes")
    assert await reports.accept("q3.md", SHA) is Accepted.MISMATCH
    (keeper.reports / "old.md").write_bytes(b"earlier")
    keeper.drop("old.md", APPROVED)
    assert await reports.accept("old.md", SHA) is Accepted.EXISTS
    assert (keeper.reports / "old.md").read_bytes() == b"earlier"
    # A name the keeper refuses (400) is not a report accepted either.
    assert await reports.accept("../old.md", SHA) is Accepted.IO_ERROR


@pytest.mark.parametrize(
    "key",
    [derived(b"docbroker/keeper/v1/", "globex"), derived(b"docbroker/sandbox/v1/", "acme")],
    ids=["another_tenants_keeper_key", "the_sandbox_key"],  # the keys are random per run
)
async def test_a_wrong_key_accepts_nothing(keeper: Keeper, key: str) -> None:
    reports = reports_at(keeper.url, key)
    keeper.drop("q3.md", APPROVED)
    sweeps = Sweeps()
    await reports.sweep(sweeps, SweepReason.STARTUP)
    assert sweeps.seen == [(Swept(stuck=1), SweepReason.STARTUP)]  # audited as quarantine_failed
    assert await reports.accept("q3.md", SHA) is Accepted.IO_ERROR
    assert not (keeper.reports / "q3.md").exists()
    assert (keeper.dropbox / "q3.md").exists()


async def test_a_keeper_that_is_gone_is_a_value_not_an_exception() -> None:
    reports = reports_at(f"http://127.0.0.1:{free_port()}")
    sweeps = Sweeps()
    async with reports.saving(sweeps):
        assert await reports.accept("q3.md", SHA) is Accepted.IO_ERROR
    assert sweeps.seen == [
        (Swept(stuck=1), SweepReason.BEFORE_SAVE),
        (Swept(stuck=1), SweepReason.AFTER_SAVE),
    ]
    assert await reports.exists("q3.md") is False


async def test_no_sandbox_running_means_nothing_to_sweep() -> None:
    reports = reports_at(None)
    sweeps = Sweeps()
    await reports.sweep(sweeps, SweepReason.STARTUP)
    assert sweeps.seen == [(Swept(), SweepReason.STARTUP)]
    assert await reports.accept("q3.md", SHA) is Accepted.IO_ERROR


async def test_the_current_pod_is_asked(keeper: Keeper) -> None:
    """The Pod is replaced and its address changes: each call asks for the endpoint anew."""
    urls = [f"http://127.0.0.1:{free_port()}", keeper.url]

    async def endpoint() -> Endpoint | None:
        return Endpoint(url="http://unused/mcp", keeper_url=urls[0])

    reports = KeeperReports(endpoint, KEEPER_KEY, connect_timeout=1.0, timeout=3.0)
    keeper.drop("q3.md", APPROVED)
    assert await reports.accept("q3.md", SHA) is Accepted.IO_ERROR  # the old Pod is gone
    urls.pop(0)
    assert await reports.accept("q3.md", SHA) is Accepted.OK


async def lying_keeper(answer: bytes) -> tuple[asyncio.Server, str]:
    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(answer)
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    return server, f"http://127.0.0.1:{port}"


def http_200(body: bytes) -> bytes:
    return b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s" % (
        len(body),
        body,
    )


LIES = {
    "not-json": http_200(b"ok"),
    "unknown-outcome": http_200(b'{"accepted": "probably"}'),
    "extra-field": http_200(b'{"accepted": "ok", "also": 1}'),
    "negative-count": http_200(b'{"quarantined": -1, "stuck": 0}'),
    "bool-count": http_200(b'{"quarantined": true, "stuck": 0}'),
    "exists-string": http_200(b'{"exists": "yes"}'),
    "huge": http_200(b'{"accepted": "' + b"o" * 10_000 + b'"}'),
    "garbage": b"\x00\x01 not http at all",
    "hangs-up": b"",
}


@pytest.mark.parametrize("lie", sorted(LIES))
async def test_a_keeper_answering_nonsense_accepts_nothing(lie: str) -> None:
    server, url = await lying_keeper(LIES[lie])
    try:
        reports = reports_at(url)
        assert await reports.accept("q3.md", SHA) is Accepted.IO_ERROR
        sweeps = Sweeps()
        await reports.sweep(sweeps, SweepReason.BEFORE_SAVE)
        assert sweeps.seen == [(Swept(stuck=1), SweepReason.BEFORE_SAVE)]
        assert await reports.exists("q3.md") is False
    finally:
        server.close()
        await server.wait_closed()


def test_the_keeper_key_is_not_in_a_repr() -> None:
    assert KEEPER_KEY not in repr(reports_at("http://127.0.0.1:1"))


class Tap:
    """A TCP relay in front of the keeper that shows when a request holding `marker` has been
    passed on whole, and counts the bytes the keeper answered on that connection."""

    def __init__(self, port: int, marker: bytes) -> None:
        self.port, self.marker = port, marker
        self.asked = asyncio.Event()
        self.answered = 0
        self.server: asyncio.Server | None = None

    @classmethod
    async def start(cls, port: int, marker: bytes) -> Tap:
        tap = cls(port, marker)
        tap.server = await asyncio.start_server(tap._relay, "127.0.0.1", 0)
        return tap

    @property
    def url(self) -> str:
        assert self.server is not None
        return f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}"

    async def close(self) -> None:
        if self.server is not None:
            self.server.close()
            await self.server.wait_closed()

    async def _relay(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        keeper_r, keeper_w = await asyncio.open_connection("127.0.0.1", self.port)
        marked = [False]

        async def up() -> None:
            seen = b""
            while data := await client_r.read(65536):
                keeper_w.write(data)
                await keeper_w.drain()
                seen += data
                if self.marker in seen and not marked[0]:
                    marked[0] = True
                    self.asked.set()
            keeper_w.close()

        async def down() -> None:
            while data := await keeper_r.read(65536):
                if marked[0]:
                    self.answered += len(data)
                client_w.write(data)
                await client_w.drain()
            client_w.close()

        await asyncio.gather(up(), down(), return_exceptions=True)


async def test_two_replicas_saving_for_one_tenant_at_once_both_land(keeper: Keeper) -> None:
    """Each replica has its own KeeperReports; the keeper's turn keeps one's sweep off the
    other's file in flight (without it, b's sweep before its save quarantined a's file)."""
    tap = await Tap.start(keeper.port, b"dropbox_before_save")
    a, b = reports_at(keeper.url), reports_at(tap.url)
    other = b"# Q4\nalso approved\n"
    a_written, b_entered = asyncio.Event(), asyncio.Event()

    async def save_on_a() -> Accepted:
        async with a.saving(Sweeps()):
            keeper.drop("q3.md", APPROVED)
            a_written.set()
            # b's whole request for its turn is at the keeper (the race is entered) ...
            await asyncio.wait_for(tap.asked.wait(), 10)
            accepted = await a.accept("q3.md", SHA)
            # ... and the keeper has not answered it while a's turn lasts.
            assert not b_entered.is_set() and tap.answered == 0
            return accepted

    async def save_on_b() -> Accepted:
        await a_written.wait()
        async with b.saving(Sweeps()):
            b_entered.set()
            keeper.drop("q4.md", other)
            return await b.accept("q4.md", hashlib.sha256(other).hexdigest())

    try:
        assert list(await asyncio.gather(save_on_a(), save_on_b())) == [Accepted.OK, Accepted.OK]
    finally:
        await tap.close()
    assert (keeper.reports / "q3.md").read_bytes() == APPROVED
    assert (keeper.reports / "q4.md").read_bytes() == other
    assert not keeper.quarantine.exists() or os.listdir(keeper.quarantine) == []
