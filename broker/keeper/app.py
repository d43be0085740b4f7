"""The keeper's HTTP surface: three POST routes over `ReportFiles`, behind the keeper key.

Bodies are strict: JSON objects of exactly the expected keys with string values, at most
`MAX_BODY_BYTES`, duplicate keys refused. Every refusal is a fixed code, never an echo of what
was sent. File operations take turns (one lock, one worker thread at a time): a sweep never
moves the file an accept is checking.
"""

from __future__ import annotations

import asyncio
import json
import re
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp

from broker.approvals.reports import ReportFiles, SweepReason
from broker.threads import to_thread_to_the_end
from server.bearer import BearerRequired
from server.contracts import FILENAME_RE

MAX_BODY_BYTES = 1024
_SHA256_RE = re.compile(r"[0-9a-f]{64}")
_REASONS = frozenset(reason.value for reason in SweepReason)


class _Refused(Exception):
    def __init__(self, status: int, code: str) -> None:
        self.status, self.code = status, code


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out = dict(pairs)
    if len(out) != len(pairs):
        raise _Refused(400, "invalid_body")
    return out


async def _body(request: Request, keys: frozenset[str]) -> dict[str, str]:
    if request.headers.get("content-type", "").split(";")[0].strip() != "application/json":
        raise _Refused(415, "json_required")
    raw = b""
    async for chunk in request.stream():
        raw += chunk
        if len(raw) > MAX_BODY_BYTES:
            raise _Refused(413, "body_too_large")
    try:
        body = json.loads(raw, object_pairs_hook=_no_duplicates)
    except (ValueError, RecursionError):
        raise _Refused(400, "invalid_body") from None
    if not isinstance(body, dict) or set(body) != keys or not all(isinstance(v, str) for v in body.values()):
        raise _Refused(400, "invalid_body")
    return body


def keeper_app(files: ReportFiles, *, key: str) -> ASGIApp:
    turns = asyncio.Lock()

    async def in_turn(fn: Any, *args: Any) -> Any:
        async with turns:
            return await to_thread_to_the_end(fn, *args)

    async def sweep(request: Request) -> Response:
        body = await _body(request, frozenset({"reason"}))
        if body["reason"] not in _REASONS:
            raise _Refused(400, "invalid_reason")
        swept = await in_turn(files.sweep)
        return JSONResponse({"quarantined": swept.quarantined, "stuck": swept.stuck})

    async def accept(request: Request) -> Response:
        body = await _body(request, frozenset({"name", "sha256"}))
        if not FILENAME_RE.fullmatch(body["name"]):
            raise _Refused(400, "invalid_name")
        if not _SHA256_RE.fullmatch(body["sha256"]):
            raise _Refused(400, "invalid_sha256")
        accepted = await in_turn(files.accept, body["name"], body["sha256"])
        return JSONResponse({"accepted": accepted.value})

    async def exists(request: Request) -> Response:
        body = await _body(request, frozenset({"name"}))
        if not FILENAME_RE.fullmatch(body["name"]):
            raise _Refused(400, "invalid_name")
        return JSONResponse({"exists": await in_turn(files.exists, body["name"])})

    async def refused(_: Request, exc: Exception) -> Response:
        assert isinstance(exc, _Refused)
        return JSONResponse({"error": exc.code}, exc.status)

    async def failed(_: Request, exc: Exception) -> Response:
        return JSONResponse({"error": "internal_error"}, 500)  # never a traceback to the caller

    app = Starlette(
        routes=[
            Route("/v1/sweep", sweep, methods=["POST"]),
            Route("/v1/accept", accept, methods=["POST"]),
            Route("/v1/exists", exists, methods=["POST"]),
        ],
        exception_handlers={_Refused: refused, Exception: failed},
    )
    return BearerRequired(app, key=key)
