"""The approvals web page: a static page whose script calls the REST API with a bearer token.

No cookies, so no CSRF; all text is inserted with `textContent`, and a strict CSP forbids
inline script, so a report's content cannot run in the approver's browser.
"""

from __future__ import annotations

from importlib import resources

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

_CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; "
    "base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)
_HEADERS = {
    "content-security-policy": _CSP,
    "x-content-type-options": "nosniff",
    "referrer-policy": "no-referrer",
    "cache-control": "no-store",
}
_STATIC = resources.files("broker.web") / "static"


def _file(name: str, media_type: str) -> Route:
    body = (_STATIC / name).read_bytes()

    async def serve(_: Request) -> Response:
        return Response(body, media_type=media_type, headers=_HEADERS)

    return Route(f"/approvals{'' if name == 'index.html' else '/' + name}", serve, methods=["GET"])


def routes() -> list[Route]:
    return [
        _file("index.html", "text/html; charset=utf-8"),
        _file("approvals.js", "text/javascript; charset=utf-8"),
        _file("approvals.css", "text/css; charset=utf-8"),
    ]
