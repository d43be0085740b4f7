"""The broker's own `tools/list` of a sandbox: every page, bounded, cursors checked.

Clients never page through the sandbox themselves: the broker follows `nextCursor` (an empty
string is a valid cursor), stops at a repeated cursor or too many pages, and hands the whole
listing to admission.

A page is read whole up to `MAX_PAGE_BYTES`, far above what the contract's three tools take,
so one oversized descriptor (a megabyte of description) reaches admission and excludes only
its own tool. A page past even that is not read: the listing ends before it (its tools are
not admitted, which admission's audit records), the same as a cursor loop ends it, and not
as a broken sandbox: no retry, no breaker.
"""

from __future__ import annotations

import itertools
from typing import Any

from broker.protocol import sse
from broker.protocol.codec import encode, loads_sandbox
from broker.protocol.versions import META_CAPABILITIES, META_PROTOCOL, MODERN
from broker.upstream import BodyTooLarge, Upstream

MAX_PAGES = 4
MAX_PAGE_BYTES = 2 * 1024 * 1024
PAGE_TOO_LARGE = "page_too_large"
_ids = itertools.count(1)


class ListingError(Exception):
    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


async def request(client: Upstream, method: str, params: dict[str, Any]) -> Any:
    """One modern (2026-07-28) request from the broker itself; returns the `result` value."""
    request_id = f"broker-{next(_ids)}"
    meta = {META_PROTOCOL: MODERN, META_CAPABILITIES: {}}
    body = {"jsonrpc": "2.0", "id": request_id, "method": method, "params": {**params, "_meta": meta}}
    headers = {
        "host": "localhost",
        "content-type": "application/json",
        "accept": "application/json, text/event-stream",
        "mcp-protocol-version": MODERN,
        "mcp-method": method,
    }
    async with client.stream("POST", headers, encode(body)) as response:
        if response.status_code != 200:
            raise ListingError(f"upstream_http_{response.status_code}")
        if response.headers.get("content-type", "").startswith("text/event-stream"):
            try:
                async for event in sse.events(response.aiter_raw(), MAX_PAGE_BYTES):
                    message = loads_sandbox(event.data)
                    if isinstance(message, dict) and message.get("id") == request_id:
                        return _result(message)
            except sse.EventTooLarge:
                raise ListingError(PAGE_TOO_LARGE) from None
            raise ListingError("no_response")
        try:
            raw = await response.read(MAX_PAGE_BYTES)
        except BodyTooLarge:
            raise ListingError(PAGE_TOO_LARGE) from None
        message = loads_sandbox(raw)
        if not isinstance(message, dict) or message.get("id") != request_id:
            raise ListingError("invalid_response")
        return _result(message)


async def session_alive(client: Upstream, session_id: str, protocol: str) -> bool:
    """Whether the sandbox still holds this legacy session. It alone knows: sessions are not
    kept by the broker (broker.gateway.legacy_sessions), and a DELETE through any replica ends one.
    Asked only where the broker answers a session's request itself (`tools/list`)."""
    body = {"jsonrpc": "2.0", "id": f"broker-{next(_ids)}", "method": "ping"}
    headers = {
        "host": "localhost",
        "content-type": "application/json",
        "accept": "application/json, text/event-stream",
        "mcp-protocol-version": protocol,
        "mcp-session-id": session_id,
    }
    async with client.stream("POST", headers, encode(body)) as response:
        return response.status_code != 404


async def needs_session(client: Upstream) -> bool:
    """Whether the sandbox refuses a handshake-era request that names no session (the SDK's
    stateful server does: 400). Asked only before the broker answers such a `tools/list`
    itself, so that the client is told what the sandbox would tell it."""
    body = {"jsonrpc": "2.0", "id": f"broker-{next(_ids)}", "method": "ping"}
    headers = {"host": "localhost", "content-type": "application/json",
               "accept": "application/json, text/event-stream"}  # fmt: skip
    async with client.stream("POST", headers, encode(body)) as response:
        return response.status_code == 400


async def list_all_tools(client: Upstream) -> tuple[list[Any], list[str]]:
    """All descriptors across pages, and the reasons (if any) the listing was cut short."""
    tools: list[Any] = []
    problems: list[str] = []
    cursors: set[str] = set()
    params: dict[str, Any] = {}
    for _ in range(MAX_PAGES):
        try:
            result = await request(client, "tools/list", params)
        except ListingError as exc:
            if exc.reason != PAGE_TOO_LARGE:
                raise
            problems.append(PAGE_TOO_LARGE)
            return tools, problems
        if not isinstance(result, dict) or not isinstance(result.get("tools"), list):
            raise ListingError("invalid_listing")
        tools.extend(result["tools"])
        cursor = result.get("nextCursor")
        if cursor is None:
            return tools, problems
        if not isinstance(cursor, str) or len(cursor) > 256:
            problems.append("cursor_invalid")
            return tools, problems
        if cursor in cursors:
            problems.append("cursor_repeated")
            return tools, problems
        cursors.add(cursor)
        params = {"cursor": cursor}
    problems.append("too_many_pages")
    return tools, problems


def _result(message: dict[str, Any]) -> Any:
    if "error" in message:
        raise ListingError("upstream_error")
    return message.get("result")
