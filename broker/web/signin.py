"""Approvers sign in to /approvals with the organisation's OpenID Provider (DESIGN §12).

    GET  /approvals/session    what the page needs: {"mode": "token"} without a provider;
                               {"mode": "oidc", "signed_in": false} or, signed in,
                               {"mode": "oidc", "signed_in": true, "subject", "issuer",
                                "tenants", "groups", "csrf"}
    GET  /approvals/login?return_to=/approvals[?id=…]   → 302 to the provider
    GET  /approvals/callback?code&state[&iss]           → 303 back to return_to, signed in
    POST /approvals/logout     (X-CSRF-Token)  → {"logout_url": the provider's, or null}

Cookies, both `__Host-` (Secure, Path=/, no Domain: no sibling host can set or read them),
HttpOnly:
- `__Host-docbroker-signin` for the sign-in under way: its state, nonce, PKCE verifier and
  return_to, sealed (broker/sealing.py, a key of its own from the master key) with its expiry,
  10 minutes. Nothing of a sign-in is stored before its callback: starts that never finish
  cost the broker nothing to keep, so no flood of them can fill a table and lock approvers
  out (issue 34 item 10), and any replica completes a sign-in another began. SameSite=Lax,
  because it must come back on the provider's cross-site redirect to the callback; dropped
  there.
- `__Host-docbroker-session`: an opaque random value whose digest is the store's key;
  SameSite=Strict. The page is static and its script's fetches
  are same-site, so Strict costs nothing; the session cookie never rides a cross-site request.

Defences, each tested from the attacker's side (tests/oidc/):
- state: the callback's `state` must equal the one sealed in this browser's sign-in cookie
  (login CSRF; another site cannot set a `__Host-` cookie), a code is redeemed once by the
  provider (a replayed callback is `code_refused`), and a provider that names another issuer
  in `iss` (RFC 9207, mix-up) is refused;
- nonce and PKCE bind the id_token and the code to this sign-in (broker/web/oidc.py);
- session fixation: a new session id is made at every sign-in; a cookie the browser brought
  is never promoted, and is ended;
- CSRF: every state-changing request with a session must carry the session's CSRF token in
  `X-CSRF-Token` (compared in constant time), besides SameSite=Strict and the Origin check;
- return_to: only this page (`/approvals`, optionally `?id=<approval id>`), never a URL;
- logout ends the session in the store, for every replica: the cookie is dead everywhere.
"""

from __future__ import annotations

import hmac
import re
import secrets
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Literal

from starlette.requests import Request
from starlette.responses import JSONResponse, RedirectResponse, Response
from starlette.routing import Route

from broker.approvals.store import StoreUnavailable
from broker.audit import AuditSinkError
from broker.audit.schema import AuditEvent
from broker.auth.claims_map import ClaimMapping, claim_at, group_names, person_id
from broker.auth.preauth import PreAuthLimiter, client_address
from broker.sealing import RecordSealer
from broker.settings import OidcSettings
from broker.types import Outcome
from broker.web.approver_sessions import WebSession, WebSessions, digest, new_secret
from broker.web.oidc import OidcProvider, SignInFailed

SESSION_COOKIE = "__Host-docbroker-session"
SIGNIN_COOKIE = "__Host-docbroker-signin"
CSRF_HEADER = "x-csrf-token"
SIGNIN_SECONDS = 600
MAX_SIGNIN_COOKIE_CHARS = 1024  # a sealed sign-in is about 400
PAGE = "/approvals"
_RETURN_TO = re.compile(r"/approvals(\?id=[0-9a-f]{32})?")
_HEADERS = {
    "cache-control": "no-store",
    "x-content-type-options": "nosniff",
    "referrer-policy": "no-referrer",
}

Audit = Callable[..., Awaitable[None]]


def safe_return_to(value: str | None) -> str:
    """Where to go after sign-in: this page, or one approval on it; anything else → the page."""
    return value if value is not None and _RETURN_TO.fullmatch(value) else PAGE


SameSite = Literal["lax", "strict"]


@dataclass(frozen=True)
class Pending:
    """A sign-in under way, as sealed into the browser's sign-in cookie (never stored here)."""

    state: str
    nonce: str
    verifier: str
    return_to: str
    expires: float


def pending_sealer(key: bytes, clock: Callable[[], float]) -> RecordSealer[Pending]:
    """Pending sign-ins into cookie values and back; None for anything forged, altered or old."""
    return RecordSealer(
        Pending, key, prefix="dbl1.", aad=b"docbroker/web-signin/v1", max_chars=MAX_SIGNIN_COOKIE_CHARS,
        clock=clock,
    )  # fmt: skip


def _cookie(response: Response, name: str, value: str, *, max_age: int, same_site: SameSite) -> None:
    response.set_cookie(
        name, value, max_age=max_age, path="/", secure=True, httponly=True, samesite=same_site
    )


def _drop_cookie(response: Response, name: str, same_site: SameSite) -> None:
    _cookie(response, name, "", max_age=0, same_site=same_site)


def _failure(status: int, reason: str) -> Response:
    # A short plain page the person can act on; the reason is a fixed code, never provider text.
    body = f"Sign-in failed ({reason}). Go back to {PAGE} and sign in again.\n"
    response = Response(body, status, media_type="text/plain; charset=utf-8", headers=_HEADERS)
    _drop_cookie(response, SIGNIN_COOKIE, "lax")
    return response


class SignIn:
    def __init__(
        self,
        settings: OidcSettings,
        provider: OidcProvider,
        sessions: WebSessions,
        *,
        signin_key: bytes,
        known_tenant: Callable[[str], bool],
        audit: Audit,
        preauth: PreAuthLimiter,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._settings = settings
        self._provider = provider
        self._sessions = sessions
        self._pending = pending_sealer(signin_key, clock)
        self._mapping = ClaimMapping(
            settings.tenant_claim, settings.tenant_map, settings.approver_claim, settings.approver_value
        )
        self._known = known_tenant
        self._audit = audit
        # Refused sign-ins count against the client's address like failed tokens: past its
        # burst they are counted on the interval's line, so a flood cannot fill the audit log.
        self._preauth = preauth
        self._clock = clock

    @property
    def issuer(self) -> str:
        return self._settings.issuer

    # -- for the approvals API -----------------------------------------------------------

    @staticmethod
    def has_cookie(request: Request) -> bool:
        return SESSION_COOKIE in request.cookies

    async def session(self, request: Request) -> WebSession | None:
        """The live session the request's cookie names (its idle time restarted), or None."""
        secret = request.cookies.get(SESSION_COOKIE)
        if not secret or len(secret) > 128:
            return None
        return await self._sessions.touch(digest(secret), self._clock(), self._settings.session_idle_seconds)

    def counted(self, request: Request, reason: str) -> bool:
        """A request refused for its cookie (`session_invalid`, `csrf_token_invalid`): charged to
        the client's address like a bad token. True if it is counted on the interval's
        `auth.denied` line instead of a line of its own, so a flood cannot fill the audit log."""
        return not self._preauth.failed(client_address(request.scope), reason)

    @staticmethod
    def csrf_ok(request: Request, session: WebSession) -> bool:
        sent = request.headers.getlist(CSRF_HEADER)
        return len(sent) == 1 and hmac.compare_digest(sent[0].encode(), session.csrf.encode())

    # -- the sign-in flow ------------------------------------------------------------------

    async def login(self, request: Request) -> Response:
        state, nonce = secrets.token_urlsafe(32), secrets.token_urlsafe(32)
        verifier = secrets.token_urlsafe(48)  # 64 characters: RFC 7636 asks 43 to 128
        return_to = safe_return_to(request.query_params.get("return_to"))
        try:
            url = await self._provider.authorization_url(state=state, nonce=nonce, verifier=verifier)
        except SignInFailed as exc:
            await self._record(Outcome.ERROR, exc.reason, 503)
            return _failure(503, exc.reason)
        # Sealed into the cookie, not stored: nothing here grows with starts that never finish.
        sealed = self._pending.seal(
            Pending(state, nonce, verifier, return_to, self._clock() + SIGNIN_SECONDS)
        )
        response = RedirectResponse(url, 302, headers=_HEADERS)
        _cookie(response, SIGNIN_COOKIE, sealed, max_age=SIGNIN_SECONDS, same_site="lax")
        return response

    async def callback(self, request: Request) -> Response:
        query = request.query_params
        login = self._pending.open(request.cookies.get(SIGNIN_COOKIE))
        reason = self._refused(query, login)
        if reason is not None or login is None:
            reason = reason or "no_signin"
            await self._record(Outcome.DENIED, reason, 400, request=request)
            return _failure(400, reason)
        try:
            identity = await self._provider.redeem(
                code=query["code"], verifier=login.verifier, nonce=login.nonce
            )
        except SignInFailed as exc:
            status = 503 if exc.reason == "provider_unavailable" else 400
            outcome = Outcome.DENIED if status == 400 else Outcome.ERROR
            await self._record(outcome, exc.reason, status, request=request)
            return _failure(status, exc.reason)
        # The person as the operator names them (DOCBROKER_OIDC_PERSON_CLAIM), and their groups
        # for the policy; a malformed groups claim refuses, as it refuses a token.
        person = person_id(identity.claims, self._settings.person_claim)
        groups = group_names(claim_at(identity.claims, self._settings.groups_claim))
        if person is None or groups is None:
            reason = "no_person" if person is None else "bad_groups"
            await self._record(Outcome.DENIED, reason, 400, identity.subject, request=request)
            return _failure(400, reason)
        tenants = self._mapping.approver_tenants(identity.claims, self._known)
        if not tenants:
            await self._record(Outcome.DENIED, "no_tenant_mapped", 403, person, request=request)
            return _failure(403, "no_tenant_mapped")
        now = self._clock()
        session_secret = new_secret()  # always new: a cookie the browser brought is never promoted
        session = WebSession(
            id=digest(session_secret),
            issuer=identity.issuer,
            subject=person,
            tenants=tenants,
            csrf=secrets.token_urlsafe(32),
            created_at=now,
            expires_at=now + self._settings.session_lifetime_seconds,
            idle_until=now + self._settings.session_idle_seconds,
            groups=tuple(sorted(groups)),
        )
        try:
            old = request.cookies.get(SESSION_COOKIE)
            if old and len(old) <= 128:
                await self._sessions.end(digest(old))  # whoever planted it holds nothing now
            await self._sessions.purge(now)  # ended sessions, at the pace sessions are made
            await self._sessions.create(session)
        except StoreUnavailable:
            await self._record(Outcome.ERROR, "approval_store_unavailable", 503, person)
            return _failure(503, "sessions_unavailable")
        await self._record(Outcome.OK, "signed_in", 303, person)
        response = RedirectResponse(login.return_to, 303, headers=_HEADERS)
        _cookie(response, SESSION_COOKIE, session_secret, max_age=self._settings.session_lifetime_seconds,
                same_site="strict")  # fmt: skip
        _drop_cookie(response, SIGNIN_COOKIE, "lax")
        return response

    def _refused(self, query: Any, login: Pending | None) -> str | None:
        """Why the callback's parameters cannot be this browser's sign-in, or None."""
        if "error" in query:
            return "provider_refused"  # the person cancelled, or the provider said no
        if login is None:
            return "no_signin"  # no sign-in under way here, forged, or expired
        if not hmac.compare_digest(query.get("state", "").encode(), login.state.encode()):
            return "bad_state"
        if "iss" in query and query["iss"] != self._settings.issuer:
            return "bad_issuer"  # RFC 9207: the answer comes from another provider (mix-up)
        if not query.get("code"):
            return "no_code"
        return None

    async def logout(self, request: Request) -> Response:
        session = await self.session(request)
        if session is None:
            response = JSONResponse({"error": "unauthorized"}, 401, headers=_HEADERS)
            _drop_cookie(response, SESSION_COOKIE, "strict")
            return response
        if not self.csrf_ok(request, session):
            await self._record(
                Outcome.DENIED, "csrf_token_invalid", 403, session.subject, signout=True, request=request
            )
            return JSONResponse({"error": "csrf"}, 403, headers=_HEADERS)
        await self._sessions.end(session.id)
        await self._record(Outcome.OK, "signed_out", 200, session.subject, signout=True)
        response = JSONResponse({"logout_url": await self._provider.logout_url()}, headers=_HEADERS)
        _drop_cookie(response, SESSION_COOKIE, "strict")
        return response

    async def describe(self, request: Request) -> Response:
        try:
            session = await self.session(request)
        except StoreUnavailable:
            return JSONResponse({"error": "approvals_unavailable"}, 503, headers=_HEADERS)
        if session is None:
            return JSONResponse({"mode": "oidc", "signed_in": False}, headers=_HEADERS)
        body = {
            "mode": "oidc",
            "signed_in": True,
            "subject": session.subject,
            "issuer": session.issuer,
            "tenants": list(session.tenants),
            "groups": list(session.groups),
            "csrf": session.csrf,
        }
        return JSONResponse(body, headers=_HEADERS)

    async def _record(
        self,
        outcome: Outcome,
        reason: str,
        status: int,
        subject: str | None = None,
        *,
        signout: bool = False,
        request: Request | None = None,
    ) -> None:
        if request is not None and outcome is Outcome.DENIED:
            if not self._preauth.failed(client_address(request.scope), reason):
                return  # counted on the interval's auth.denied line
        await self._audit(
            AuditEvent.WEB_SIGNOUT if signout else AuditEvent.WEB_SIGNIN,
            request_id=secrets.token_hex(16),
            subject=subject,
            issuer=self._settings.issuer,
            method="approvals",
            outcome=outcome,
            reason=reason,
            status=status,
        )


async def _token_mode(_: Request) -> Response:
    return JSONResponse({"mode": "token"}, headers=_HEADERS)


def _guarded(endpoint: Callable[[Request], Awaitable[Response]]) -> Callable[[Request], Awaitable[Response]]:
    """As the approvals API does: nothing goes on unaudited, and a store or audit log that
    cannot be reached is one 503, never a bare 500 (a sign-in or sign-out not recorded did not
    happen: the session row and the audit line go together or the person tries again)."""

    async def guarded(request: Request) -> Response:
        try:
            return await endpoint(request)
        except AuditSinkError:
            return JSONResponse({"error": "audit_unavailable"}, 503, headers=_HEADERS)
        except StoreUnavailable:
            return JSONResponse(
                {"error": "approvals_unavailable"}, 503, headers={**_HEADERS, "retry-after": "5"}
            )

    return guarded


def routes(signin: SignIn | None) -> list[Route]:
    if signin is None:
        return [Route("/approvals/session", _token_mode, methods=["GET"])]
    return [
        Route("/approvals/session", _guarded(signin.describe), methods=["GET"]),
        Route("/approvals/login", _guarded(signin.login), methods=["GET"]),
        Route("/approvals/callback", _guarded(signin.callback), methods=["GET"]),
        Route("/approvals/logout", _guarded(signin.logout), methods=["POST"]),
    ]
