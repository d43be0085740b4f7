"""`Origin` validation: a request that carries an Origin not on the allow-list is refused.

A web page can make a browser send requests to any host its DNS answer names, a local
broker included (DNS rebinding); the page's origin still travels in `Origin`, so the MCP
Streamable HTTP transport requires servers to check it. Requests without `Origin` pass:
MCP clients and other non-browser callers do not send one, and a browser always does for
the requests a page could abuse (fetch/XHR with a body, every cross-origin one).

The allow-list defaults to the origin of `DOCBROKER_PUBLIC_URL` (the approvals page's own).
Values are compared as browsers serialise them (`broker.settings.origin_of`), as bytes.
The refused origin's value is never written anywhere: it is the page's choice.
"""

from __future__ import annotations

from collections.abc import Iterable

from broker.protocol import jsonrpc as rpc

REASON = "origin_not_allowed"

_MCP_BODY = rpc.encode(rpc.error(None, rpc.FORBIDDEN, "Origin not allowed"))
_JSON_BODY = b'{"error":"origin_not_allowed"}'


class Origins:
    def __init__(self, allowed: Iterable[str]) -> None:
        self._allowed = frozenset(origin.encode("latin-1") for origin in allowed)

    def refused(self, headers: Iterable[tuple[bytes, bytes]]) -> bool:
        """Whether any `Origin` header of the request is not allowed (two must both be)."""
        for name, value in headers:
            if name == b"origin" and value not in self._allowed:
                return True
        return False


def refusal(path: str) -> tuple[bytes, list[tuple[bytes, bytes]]]:
    """The 403's body and headers: a JSON-RPC error on `/mcp`, plain JSON elsewhere."""
    body = _MCP_BODY if path == "/mcp" else _JSON_BODY
    return body, [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]


def surface(path: str) -> str:
    """The audit's `method` for a refused request: which surface it was for (a fixed name)."""
    if path == "/mcp":
        return "mcp"
    if path == "/v1/approvals" or path.startswith("/v1/approvals/"):
        return "approvals"
    if path == "/approvals" or path.startswith("/approvals/"):
        return "approvals_page"
    return "other"
