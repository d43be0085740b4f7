"""The sandbox's own guard on the pod network (DESIGN §10): no broker credential, no MCP.

On Kubernetes the server listens on TCP, reachable by anything on the pod network that a
NetworkPolicy does not stop (and many CNIs enforce none). So, in front of the MCP app, every
HTTP request must carry exactly one `Authorization: Bearer <tenant's sandbox key>`, compared
in constant time. Anything else gets a bare 401 before a byte of it reaches the SDK: no body,
no reason (a prober learns nothing about what was wrong), nothing logged.

The scheme is matched as the broker sends it (`Bearer`), not case-insensitively: the only
legitimate caller is our own broker, so every other spelling is somebody else.
"""

from __future__ import annotations

import hmac

from starlette.types import ASGIApp, Receive, Scope, Send

_UNAUTHORIZED_HEAD = {
    "type": "http.response.start",
    "status": 401,
    "headers": [(b"content-length", b"0")],
}


class BearerRequired:
    """ASGI middleware: passes lifespan through, lets an HTTP request in only with the key."""

    def __init__(self, app: ASGIApp, *, key: str) -> None:
        self.app = app
        self._expected = b"Bearer " + key.encode("ascii")

    def __repr__(self) -> str:  # the key must never reach a log through a repr
        return "BearerRequired(key=<hidden>)"

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self.app(scope, receive, send)
            return
        if scope["type"] == "http" and self._authorized(scope):
            await self.app(scope, receive, send)
            return
        if scope["type"] == "http":
            await send(_UNAUTHORIZED_HEAD)
            await send({"type": "http.response.body", "body": b""})
        else:  # a WebSocket (the server has none): refused at the handshake
            await send({"type": "websocket.close", "code": 1008})

    def _authorized(self, scope: Scope) -> bool:
        # Header names arrive lower-cased; duplicates stay separate entries. Two Authorization
        # headers are ambiguous (which one would a proxy forward?), so they are refused.
        values = [value for name, value in scope["headers"] if name == b"authorization"]
        return len(values) == 1 and hmac.compare_digest(values[0], self._expected)
