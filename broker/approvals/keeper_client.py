"""`Reports` for a tenant whose reports live with a keeper in its Pod (`broker/keeper/`).

Same interface as `ReportStore`: `saving()` sweeps the drop-box before and after an approved
save, `accept()` moves the approved file into the store after the keeper's sha256 check,
`exists()` asks whether a report of that name is in the store. The keeper does the file work;
this side only asks, with the tenant's keeper key as the bearer.

The Pod's address changes when the Pod is replaced, so the keeper's URL is asked for at each
call (`endpoint`: the tenant's current sandbox `Endpoint`, or None when none runs; a Pod
that does not run has a fresh, empty drop-box, so there is nothing to sweep).

A save holds the keeper's turn (`/v1/turn` … `/v1/sweep` with its id): the keeper is the one
place all replicas reach, so one replica's sweep never takes another's file mid-save. The
turn's lease (`turn_seconds`) outlasts the save's call; a replica that dies mid-save holds it
no longer than that.

The keeper is another party on the network: whatever goes wrong (no Pod, refused, timed out,
an answer that is not one of the expected few) is never a traceback. An accept that fails is
`Accepted.IO_ERROR`, which the gateway turns into the audited "write result unknown"; a sweep
that fails counts as one item `stuck` (audited as `quarantine_failed`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, cast

from broker.approvals.reports import Accepted, OnSwept, SweepReason, Swept
from broker.types import Endpoint
from broker.upstream import Upstream, UpstreamError

log = logging.getLogger("docbroker.reports")

MAX_ANSWER_BYTES = 4096
EndpointFor = Callable[[], Awaitable[Endpoint | None]]


class KeeperError(Exception):
    """The keeper could not be asked, or its answer is not one of the expected few."""


class KeeperReports:
    """One tenant's reports through its keeper. Saves and sweeps of this replica take turns."""

    def __init__(
        self,
        endpoint: EndpointFor,
        key: str,
        *,
        turn_seconds: int = 660,
        connect_timeout: float = 2.0,
        timeout: float = 10.0,
    ) -> None:
        self._endpoint = endpoint
        self._key = key
        self._turn_seconds = turn_seconds
        self._connect_timeout = connect_timeout
        self._timeout = timeout
        self._turns = asyncio.Lock()
        self._turn: str | None = None  # the keeper's turn this replica's save holds

    def __repr__(self) -> str:
        return "KeeperReports(key=<hidden>)"

    @contextlib.asynccontextmanager
    async def saving(self, on_swept: OnSwept) -> AsyncIterator[None]:
        async with self._turns:
            self._turn, swept = await self._begin()
            try:  # the turn is ended whatever happens from here, or it stays leased for minutes
                await on_swept(swept, SweepReason.BEFORE_SAVE)
                yield
            finally:
                turn, self._turn = self._turn, None
                await on_swept(await self._sweep(SweepReason.AFTER_SAVE, turn), SweepReason.AFTER_SAVE)

    async def sweep(self, on_swept: OnSwept, reason: SweepReason) -> None:
        async with self._turns:
            await on_swept(await self._sweep(reason), reason)

    async def accept(self, name: str, sha256: str) -> Accepted:
        try:
            body = {"name": name, "sha256": sha256}
            answer = await self._ask("accept", body if self._turn is None else {**body, "turn": self._turn})
            if set(answer) != {"accepted"} or answer["accepted"] not in Accepted._value2member_map_:
                _bad_answer()  # never Accepted(value): its ValueError would carry the answer to the log
            return Accepted(answer["accepted"])
        except (KeeperError, ValueError, TypeError) as exc:
            _warn("could not have a report accepted", exc)
            return Accepted.IO_ERROR

    async def exists(self, name: str) -> bool:
        """False when the keeper cannot say: the keeper's own O_EXCL accept still refuses an
        existing name (quarantined, result unknown), so no report is ever overwritten."""
        try:
            answer = await self._ask("exists", {"name": name})
            if set(answer) != {"exists"} or not isinstance(answer["exists"], bool):
                _bad_answer()
            return bool(answer["exists"])
        except KeeperError as exc:
            _warn("could not ask whether a report exists", exc)
            return False

    async def _begin(self) -> tuple[str | None, Swept]:
        """Take the keeper's turn for a save, sweeping before it. No turn: the save goes on and
        its accept waits for the keeper's files like any request (no Pod: nothing to sweep)."""
        body = {"reason": SweepReason.BEFORE_SAVE.value, "seconds": str(self._turn_seconds)}
        try:
            answer = await self._ask("turn", body, none_running={})
            if answer == {}:
                return None, Swept()
            turn = answer.pop("turn", None)
            if not isinstance(turn, str) or not turn.isalnum() or len(turn) > 64:
                _bad_answer()
            return turn, _swept(answer)
        except KeeperError as exc:
            _warn("could not take the keeper's turn", exc)
            return None, Swept(stuck=1)

    async def _sweep(self, reason: SweepReason, turn: str | None = None) -> Swept:
        body = {"reason": reason.value} if turn is None else {"reason": reason.value, "turn": turn}
        try:
            answer = await self._ask("sweep", body, none_running={})
            return Swept() if answer == {} else _swept(answer)
        except KeeperError as exc:
            _warn("could not have a drop-box emptied", exc)
            return Swept(stuck=1)

    async def _ask(
        self, operation: str, body: dict[str, str], *, none_running: dict[str, Any] | None = None
    ) -> dict[str, Any]:
        try:
            endpoint = await self._endpoint()
        except Exception as exc:
            raise KeeperError("no endpoint") from exc
        if endpoint is None or endpoint.keeper_url is None:
            if none_running is not None:
                return none_running
            raise KeeperError("no keeper runs")
        url = f"{endpoint.keeper_url.rstrip('/')}/v1/{operation}"
        client = Upstream(
            Endpoint(url=url, token=self._key),
            connect_timeout=self._connect_timeout,
            read_timeout=self._timeout,
        )
        data = json.dumps(body).encode()
        host = url.split("/", 3)[2]
        headers = {"host": host, "content-type": "application/json", "accept": "application/json"}
        try:
            async with asyncio.timeout(self._timeout):
                async with client.stream("POST", headers, data) as response:
                    status = response.status_code
                    raw = await response.read(MAX_ANSWER_BYTES)
        except (UpstreamError, TimeoutError) as exc:
            raise KeeperError(type(exc).__name__) from exc
        finally:
            await client.close()
        if status != 200:
            raise KeeperError(f"status {status}")
        try:
            answer = json.loads(raw)
        except ValueError:
            raise KeeperError("not JSON") from None
        if not isinstance(answer, dict):
            raise KeeperError("unexpected answer")
        return cast(dict[str, Any], answer)


def _swept(answer: dict[str, Any]) -> Swept:
    counts = (answer.get("quarantined"), answer.get("stuck"))
    if set(answer) != {"quarantined", "stuck"} or not all(_count(n) for n in counts):
        _bad_answer()
    return Swept(quarantined=answer["quarantined"], stuck=answer["stuck"])


def _count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 1_000_000


def _bad_answer() -> Any:
    raise KeeperError("unexpected answer")


def _warn(what: str, exc: Exception) -> None:
    # KeeperError's own fixed phrases or status codes; of anything else only its type: never a name
    log.warning("%s: keeper %s", what, exc if isinstance(exc, KeeperError) else type(exc).__name__)
