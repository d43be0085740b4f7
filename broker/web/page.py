"""The approvals web page: a static page whose script calls the REST API as the approver signed
in with the OpenID Provider (session cookie; broker/web/signin.py), or with a pasted bearer
token where no provider is configured.

With a session, every POST carries the session's CSRF token (`X-CSRF-Token`); with a bearer
token there are no cookies, so no CSRF. All text is inserted with `textContent`, and a strict CSP forbids
inline script, so a report's content cannot run in the approver's browser. The script shows
invisible and control characters as marks by `broker.approvals.visible`'s classification,
served as `marks.json`, so the page and the in-band question flag the same characters.
"""

from __future__ import annotations

import functools
import json
from importlib import resources

import anyio
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from broker.approvals import visible

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


@functools.cache
def _marks_json() -> bytes:
    tables = {"marks": visible.table(), "right_to_left": visible.right_to_left_table()}
    return json.dumps(tables, separators=(",", ":")).encode()


async def _marks(_: Request) -> Response:
    # Built on first use, off the event loop: it asks the classifier about every code point.
    body = await anyio.to_thread.run_sync(_marks_json)
    return Response(body, media_type="application/json", headers=_HEADERS)


def routes() -> list[Route]:
    return [
        _file("index.html", "text/html; charset=utf-8"),
        _file("approvals.js", "text/javascript; charset=utf-8"),
        _file("approvals.css", "text/css; charset=utf-8"),
        Route("/approvals/marks.json", _marks, methods=["GET"]),
    ]
