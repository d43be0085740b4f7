"""The gateway's HTTP plumbing: ASGI headers and bodies, and the client-facing checks.

Small functions with no state, kept apart from the pipeline in handler.py.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Coroutine
from typing import Any

from starlette.types import Receive, Scope

from broker.auth import AuthError
from broker.errors import Denial, Denied
from broker.http_edge import READ_DEADLINE
from broker.protocol import jsonrpc as rpc
from broker.types import Outcome


async def until_client_leaves(receive: Receive, work: Coroutine[Any, Any, None]) -> bool:
    """Run `work` (a GET stream's relay) until it ends or the client disconnects; True if the
    client left first. Only `receive` tells: uvicorn drops what is sent to a gone client
    without a word, and a sandbox's idle stream sends nothing the relay would forward, so a
    vanished client would otherwise hold its tenant's concurrency slot and lease for ever."""
    job = asyncio.ensure_future(work)

    async def disconnected() -> None:
        while (await receive())["type"] != "http.disconnect":
            pass

    watcher = asyncio.ensure_future(disconnected())
    try:
        await asyncio.wait({job, watcher}, return_when=asyncio.FIRST_COMPLETED)
    except BaseException:
        job.cancel()
        raise
    finally:
        watcher.cancel()
    if job.done():
        job.result()  # the relay's own exceptions (Denied, _AuditFailed...) go on as usual
        return False
    job.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await job
    return True


def headers_of(scope: Scope) -> dict[str, str]:
    return {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}


def all_values(scope: Scope, name: bytes) -> list[str]:
    """Every value of a header: two Authorization headers must be refused, not merged."""
    return [v.decode("latin-1") for k, v in scope["headers"] if k == name]


def str_headers(headers: list[tuple[bytes, bytes]]) -> list[tuple[str, str]]:
    return [(k.decode("latin-1"), v.decode("latin-1")) for k, v in headers]


async def read_body(scope: Scope, receive: Receive, limit: int, headers: dict[str, str]) -> bytes:
    if not headers.get("content-type", "").lower().startswith("application/json"):
        raise Denied(Denial.UNSUPPORTED_MEDIA, "unsupported_media_type")
    declared = headers.get("content-length")
    if declared is not None and (not declared.isdigit() or int(declared) > limit):
        raise Denied(Denial.TOO_LARGE, "body_too_large")
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            if READ_DEADLINE in (scope.get("extensions") or {}):  # the edge closed a too-slow client
                raise Denied(Denial.READ_TIMEOUT, "read_timeout")
            raise Denied(Denial.BAD_REQUEST, "client_disconnected")
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise Denied(Denial.TOO_LARGE, "body_too_large")
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)


def check_routing_headers(msg: rpc.RpcMessage, headers: dict[str, str]) -> None:
    """2026-07-28 routing headers must agree with the body, or policy could judge one thing
    while the sandbox routes another."""
    method_header = headers.get("mcp-method")
    if method_header is not None and method_header != msg.method:
        raise Denied(Denial.BAD_REQUEST, "routing_header_mismatch")
    name_header = headers.get("mcp-name")
    if name_header is not None and msg.method == "tools/call" and name_header != msg.tool:
        raise Denied(Denial.BAD_REQUEST, "routing_header_mismatch")


def forward_body(msg: rpc.RpcMessage, arguments: dict[str, Any]) -> bytes:
    # The in-band answer is the broker's business: the sandbox gets a plain call with the token.
    params = {k: v for k, v in msg.params.items() if k not in ("requestState", "inputResponses")}
    params["arguments"] = arguments
    return rpc.encode({**msg.body, "params": params})


def plain_outcome(status: int) -> tuple[Outcome, str]:
    return (Outcome.OK, "ok") if status < 300 else (Outcome.ERROR, f"upstream_http_{status}")


def auth_error_body(exc: AuthError) -> dict[str, Any]:
    text = {401: "Unauthorized", 403: "Forbidden", 429: "Too many requests"}.get(exc.status)
    code = {403: rpc.FORBIDDEN, 429: rpc.RATE_LIMITED}.get(exc.status, rpc.INVALID_REQUEST)
    return rpc.error(None, code, text or "Service unavailable")
