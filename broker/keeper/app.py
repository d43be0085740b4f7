"""The keeper's HTTP surface: POST routes over `ReportFiles`, behind the keeper key.

Bodies are strict: JSON objects of exactly the expected keys with string values, at most
`MAX_BODY_BYTES`, duplicate keys refused. Every refusal is a fixed code, never an echo of what
was sent. File operations take turns (one lock, one worker thread at a time): a sweep never
moves the file an accept is checking.

A save is a *turn* that spans several requests, and the keeper is the one place every broker
replica reaches, so it holds the turn: `/v1/turn` waits for it and sweeps (before the save),
`/v1/accept` with the turn's id accepts, `/v1/sweep` with the id sweeps (after) and ends it.
Meanwhile no other replica's sweep can take the file in flight. A broker that dies mid-turn
leaves it to its lease (`seconds`, capped), after which the turn is free again: once the work
still running in it is done (turns.py).
"""

from __future__ import annotations

import logging
import re

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from broker.approvals.reports import ReportFiles, SweepReason
from broker.keeper.turns import Busy, TurnOver, Turns
from broker.protocol.codec import loads_strict
from broker.threads import to_thread_to_the_end
from server.bearer import BearerRequired
from server.contracts import FILENAME_RE

MAX_BODY_BYTES = 1024
MAX_TURN_SECONDS = 900  # the longest lease a broker may ask for (its call timeout and more)
_SHA256_RE = re.compile(r"[0-9a-f]{64}")
_SECONDS_RE = re.compile(r"[0-9]{1,3}")  # ASCII digits only: int() also reads other scripts' digits
_REASONS = frozenset(reason.value for reason in SweepReason)

log = logging.getLogger("docbroker.keeper")


class _Refused(Exception):
    def __init__(self, status: int, code: str) -> None:
        self.status, self.code = status, code


async def _body(
    request: Request, keys: frozenset[str], optional: frozenset[str] = frozenset()
) -> dict[str, str]:
    if request.headers.get("content-type", "").split(";")[0].strip() != "application/json":
        raise _Refused(415, "json_required")
    raw = b""
    async for chunk in request.stream():
        raw += chunk
        if len(raw) > MAX_BODY_BYTES:
            raise _Refused(413, "body_too_large")
    try:
        body = loads_strict(raw.decode("utf-8"))  # duplicate members and NaN refused
    except (ValueError, RecursionError):  # UnicodeDecodeError and StrictJsonError are ValueErrors
        raise _Refused(400, "invalid_body") from None
    if not isinstance(body, dict) or not keys <= set(body) <= keys | optional:
        raise _Refused(400, "invalid_body")
    if not all(isinstance(v, str) for v in body.values()):
        raise _Refused(400, "invalid_body")
    return body


def _reason(body: dict[str, str]) -> None:
    if body["reason"] not in _REASONS:
        raise _Refused(400, "invalid_reason")


def keeper_app(files: ReportFiles, *, key: str) -> ASGIApp:
    turns = Turns()
    in_turn = turns.run

    async def turn(request: Request) -> Response:
        body = await _body(request, frozenset({"reason", "seconds"}))
        _reason(body)
        if not _SECONDS_RE.fullmatch(body["seconds"]) or not 1 <= int(body["seconds"]) <= MAX_TURN_SECONDS:
            raise _Refused(400, "invalid_seconds")
        held = await turns.lease(int(body["seconds"]))
        try:
            swept = await turns.within(held, files.sweep)
        except BaseException:
            turns.end(held)
            raise
        return JSONResponse({"turn": held, "quarantined": swept.quarantined, "stuck": swept.stuck})

    async def sweep(request: Request) -> Response:
        body = await _body(request, frozenset({"reason"}), optional=frozenset({"turn"}))
        _reason(body)
        if "turn" in body:  # the save's sweep after: it ends its turn, whatever happens
            try:
                swept = await turns.within(body["turn"], files.sweep)
            finally:
                turns.end(body["turn"])
        else:
            swept = await in_turn(files.sweep)
        return JSONResponse({"quarantined": swept.quarantined, "stuck": swept.stuck})

    async def accept(request: Request) -> Response:
        body = await _body(request, frozenset({"name", "sha256"}), optional=frozenset({"turn"}))
        if not FILENAME_RE.fullmatch(body["name"]):
            raise _Refused(400, "invalid_name")
        if not _SHA256_RE.fullmatch(body["sha256"]):
            raise _Refused(400, "invalid_sha256")
        if "turn" in body:
            accepted = await turns.within(body["turn"], files.accept, body["name"], body["sha256"])
        else:
            accepted = await in_turn(files.accept, body["name"], body["sha256"])
        return JSONResponse({"accepted": accepted.value})

    async def exists(request: Request) -> Response:
        body = await _body(request, frozenset({"name"}))
        if not FILENAME_RE.fullmatch(body["name"]):
            raise _Refused(400, "invalid_name")
        # No turn: a report that exists is never moved or removed, and a save's turn may be long.
        return JSONResponse({"exists": await to_thread_to_the_end(files.exists, body["name"])})

    async def refused(_: Request, exc: Exception) -> Response:
        assert isinstance(exc, _Refused)
        return JSONResponse({"error": exc.code}, exc.status)

    async def busy(_: Request, exc: Exception) -> Response:
        return JSONResponse({"error": "busy"}, 503)

    async def turn_over(_: Request, exc: Exception) -> Response:
        return JSONResponse({"error": "turn_over"}, 409)

    async def failed(_: Request, exc: Exception) -> Response:
        return JSONResponse({"error": "internal_error"}, 500)  # never a traceback to the caller

    app = Starlette(
        routes=[
            Route("/v1/turn", turn, methods=["POST"]),
            Route("/v1/sweep", sweep, methods=["POST"]),
            Route("/v1/accept", accept, methods=["POST"]),
            Route("/v1/exists", exists, methods=["POST"]),
        ],
        exception_handlers={_Refused: refused, Busy: busy, TurnOver: turn_over, Exception: failed},
    )
    return BearerRequired(_NoTracebacks(app), key=key)


class _NoTracebacks:
    """Starlette answers an unexpected error with `failed` (500), then raises it again for the
    server to log, traceback and message included; an OSError's message names the file (a
    report's name). Logged here by its type only."""

    def __init__(self, app: ASGIApp) -> None:
        self._app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await self._app(scope, receive, send)
        except Exception as exc:
            log.error("keeper request failed (%s)", type(exc).__name__)
