"""The broker's Starlette application: routes, the order of things, and the lifespan.

`build_app(settings)` is the only place where components are constructed and wired; each
gets what it needs passed in. Data flows one way: request → auth → policy → runtime →
gateway → audit.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import signal
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from broker.approvals import retention
from broker.approvals.claims import HOLD_MARGIN_SECONDS, Claims, recover_forever
from broker.approvals.flow import ApprovalFlow
from broker.approvals.keeper_client import KeeperReports
from broker.approvals.reports import Reports, ReportStore, sweep_dropboxes
from broker.approvals.sealing import StateSealer
from broker.approvals.store import ApprovalStore
from broker.audit import fields as audit_fields
from broker.audit.log import AuditLog
from broker.audit.schema import AuditEvent
from broker.auth.ops import REALM as OPS_REALM
from broker.auth.ops import OpsTokens
from broker.auth.preauth import PreAuthLimiter, TrustedProxies, client_address, write_counts
from broker.auth.service import AuthService
from broker.gateway.breaker import CircuitBreakers
from broker.gateway.contract import ContractPins
from broker.gateway.gate import Gate
from broker.gateway.handler import McpGateway
from broker.gateway.legacy_sessions import SessionSealer
from broker.gateway.pinning import Pinning
from broker.gateway.relay import Relay
from broker.master_key import keeper_key, load_master_key, sealing_key, session_key, signin_key
from broker.metrics import Metrics
from broker.origin import REASON as ORIGIN_REFUSED
from broker.origin import Origins
from broker.origin import refusal as origin_refusal
from broker.origin import surface as origin_surface
from broker.policy import LivePolicy, Policies, PolicyEngine, TenantLimiter
from broker.runtime.base import SandboxBackend
from broker.runtime.lifecycle import Runtime
from broker.settings import RuntimeKind, Settings, origin_of
from broker.tenants import Tenants
from broker.tracing import Tracing
from broker.types import Endpoint, Outcome, TenantId
from broker.upstream import Upstreams
from broker.web import page
from broker.web.api import ApprovalsApi
from broker.web.approver_sessions import web_sessions_for
from broker.web.oidc import OidcProvider
from broker.web.signin import SignIn
from broker.web.signin import routes as signin_routes
from broker.web.webhooks import Webhooks

log = logging.getLogger("docbroker")

NO_STORE = {"cache-control": "no-store"}  # answers that are true now, for one caller


@dataclass
class Components:
    """Everything the app holds, for the lifespan and for tests that need a handle."""

    settings: Settings
    audit: AuditLog
    auth: AuthService
    policies: Policies
    engine: LivePolicy
    tenants: Tenants
    runtime: Runtime
    upstreams: Upstreams
    store: ApprovalStore
    metrics: Metrics


def build_app(
    settings: Settings, audit: AuditLog, backend: SandboxBackend, store: ApprovalStore
) -> BrokerApp:
    """The app, wired. The audit log, the backend and the store are opened by the caller first."""
    master_key = load_master_key(settings.master_key_file)
    ops = OpsTokens.load(settings.server.ops_token_file)
    policies = Policies.load(settings.policies_dir)
    first = PolicyEngine.load(settings.policies_dir, policies)  # validated, or start-up refused
    tenants = Tenants(settings, master_key)
    preauth = PreAuthLimiter(settings.preauth)
    auth = AuthService(
        settings.auth, known_tenant=policies.known, public_url=settings.server.public_url, preauth=preauth
    )

    upstreams = Upstreams(
        connect_timeout=2.0,
        call_timeout=settings.runtime.call_timeout_seconds,
        max_open=settings.runtime.sandbox_connections,
    )

    async def sandbox_event(event: AuditEvent, tenant: str, sandbox_id: str, details: dict[str, Any]) -> None:
        if event != AuditEvent.SANDBOX_STARTED:
            upstreams.forget(tenant)  # stopped or failed: its client goes with it
        await audit.emit(event, **audit_fields.sandbox_event(event, tenant, sandbox_id, details))

    runtime = Runtime(
        backend,
        tenants.provision,
        max_sandboxes=settings.runtime.max_sandboxes,
        idle_timeout=settings.runtime.idle_timeout_seconds,
        start_timeout=settings.runtime.start_timeout_seconds,
        on_event=sandbox_event,
    )
    metrics = Metrics(
        runtime.running_count, store.pending_count, lambda: len(upstreams), lambda: audit.stats.totals()
    )
    engine = LivePolicy(
        settings.policies_dir, first, on_reload=lambda result: metrics.policy_reloads.labels(result).inc()
    )
    # one budget per tenant, for /mcp and REST alike: this replica's share of it
    limiter = TenantLimiter(policies, replicas=settings.server.replicas)

    report_stores: dict[str, Reports] = {}  # one per tenant: its saves and sweeps take turns

    def new_reports(tenant: str) -> Reports:
        if settings.runtime.kind is not RuntimeKind.KUBERNETES:
            return ReportStore(tenants.dropbox_dir(tenant), tenants.reports_dir(tenant))

        # In a Pod the reports are the keeper's (broker/keeper/), asked at the Pod's current address.
        async def endpoint() -> Endpoint | None:
            info = runtime.get(TenantId(tenant))  # the approval's tenant, checked when the call was made
            return info.endpoint if info is not None else None

        return KeeperReports(
            endpoint,
            keeper_key(master_key, tenant),
            # the save's call and its accept, with room: a replica that dies frees it by then
            turn_seconds=min(900, math.ceil(2 * settings.runtime.call_timeout_seconds + 30)),
            timeout=settings.runtime.call_timeout_seconds,
        )

    def reports_for(tenant: str) -> Reports:
        reports = report_stores.get(tenant)
        if reports is None:
            reports = report_stores[tenant] = new_reports(tenant)
        return reports

    replica = runtime.backend.replicas
    claims = Claims(
        owner=replica.owner,
        # an unsent claim is held across a sandbox start and the listing before the write
        hold_seconds=settings.runtime.start_timeout_seconds
        + settings.runtime.call_timeout_seconds
        + HOLD_MARGIN_SECONDS,
        owner_dead=replica.owner_dead,
    )
    webhooks = Webhooks(settings.webhook, count=metrics.webhook) if settings.webhook else None
    approvals = ApprovalFlow(
        notify_pending=webhooks.pending if webhooks else None,
        store=store,
        sealer=StateSealer(sealing_key(master_key)),
        secret_for=tenants.secret,
        reports_for=reports_for,
        claims=claims,
        settings=settings.approvals,
        public_url=settings.server.public_url,
        audit=audit.emit,
        engine=engine,
    )
    sessions = SessionSealer(session_key(master_key), ttl_seconds=settings.limits.session_ttl_seconds)
    tracing = Tracing.from_settings(settings.tracing.enabled, metrics.sandbox_spans_dropped.inc)
    gateway = _gateway(settings, auth, policies, engine, limiter, runtime, upstreams, sessions, approvals,
                       reports_for, audit, metrics, tracing)  # fmt: skip
    signin = _signin(settings, store, policies, audit, preauth, signin_key(master_key))
    api = ApprovalsApi(
        auth=auth,
        store=store,
        policies=policies,
        engine=engine,
        limiter=limiter,
        audit=audit.emit,
        audit_ready=audit.check,
        require_distinct_approver=settings.approvals.require_distinct_approver,
        signin=signin,
        audit_log=settings.audit.path,
    )
    parts = Components(settings, audit, auth, policies, engine, tenants, runtime, upstreams, store, metrics)

    async def healthz(_: Request) -> Response:
        return JSONResponse({"status": "ok"})

    async def readyz(request: Request) -> Response:
        keys = await auth.ready()
        ok = audit.healthy and keys
        body: dict[str, Any] = {"status": "ready" if ok else "not_ready"}
        # Ready or not is for anyone (probes, load balancers); what runs where is for operators.
        if ops.allowed(request.scope["headers"]):
            body["checks"] = {
                "audit": audit.healthy,
                "keys": keys,
                "sandboxes": runtime.backend.describe(),
                # Reported, not required: without its database a replica still serves search
                # and read (approvals fail closed), so it stays in the load balancer's set.
                "approvals_database": await store.health(),
                # The set in force, and whether the files on disk failed to replace it.
                "policy": {"set": engine.hash, "stale": engine.stale},
            }
        return JSONResponse(body, 200 if ok else 503, headers=NO_STORE)

    async def metrics_endpoint(request: Request) -> Response:
        if not ops.allowed(request.scope["headers"]):
            refusal = {"www-authenticate": OPS_REALM, **NO_STORE}
            return JSONResponse({"error": "unauthorized"}, 401, headers=refusal)
        return Response(metrics.render(), media_type=metrics.content_type, headers=NO_STORE)

    async def resource_metadata(_: Request) -> Response:
        return JSONResponse(auth.resource_metadata(), headers={"cache-control": "public, max-age=3600"})

    async def write_denial_counts() -> None:
        try:
            await write_counts(preauth, audit.emit)
        except Exception:
            log.error("audit write failed; pre-auth denial counts kept for the next interval")

    async def denial_counts_every_interval() -> None:
        while True:
            await asyncio.sleep(settings.preauth.interval_seconds)
            await write_denial_counts()

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        await sweep_dropboxes(tenants.provisioned(), reports_for, audit.emit)
        await runtime.start()
        purger = asyncio.create_task(
            retention.purge_forever(
                store,
                retention_seconds=settings.approvals.retention_seconds,
                audit=audit.emit,
                audit_ready=audit.check,
            )
        )
        recovery = asyncio.create_task(recover_forever(store, claims, audit.emit, audit.check))
        counts = asyncio.create_task(denial_counts_every_interval())
        reloads = asyncio.create_task(engine.watch(settings.policy.reload_seconds))
        loop = asyncio.get_running_loop()
        loop.add_signal_handler(signal.SIGHUP, engine.reload_soon)
        if webhooks is not None:
            webhooks.start()
        log.info("broker ready", extra={"sandbox_backend": runtime.backend.name})
        try:
            yield
        finally:
            loop.remove_signal_handler(signal.SIGHUP)
            for task in (purger, recovery, reloads):
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
            counts.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await counts
            await write_denial_counts()  # the last interval's counts, before the log closes
            if webhooks is not None:
                await webhooks.close()  # notices still queued are not sent: the page lists them
            await runtime.close()
            await upstreams.close()
            await store.close()
            await asyncio.to_thread(tracing.shutdown)  # the last spans, exported

    routes = [
        Route("/mcp", gateway),  # every HTTP method reaches the gateway, so even a 405 is audited
        Route("/.well-known/oauth-protected-resource/mcp", resource_metadata, methods=["GET"]),
        Route("/healthz", healthz, methods=["GET"]),
        Route("/readyz", readyz, methods=["GET"]),
        Route("/metrics", metrics_endpoint, methods=["GET"]),
        *api.routes(),
        *signin_routes(signin),
        *page.routes(),
    ]
    app = Starlette(routes=routes, lifespan=lifespan)
    app.state.components = parts
    origins = Origins(
        settings.server.allowed_origins
        or (origin_of(settings.server.public_url) or settings.server.public_url,)
    )
    proxies = TrustedProxies(settings.preauth.trusted_proxies)
    return BrokerApp(app, gateway, origins=origins, preauth=preauth, proxies=proxies, audit=audit)


def _signin(
    settings: Settings,
    store: ApprovalStore,
    policies: Policies,
    audit: AuditLog,
    preauth: PreAuthLimiter,
    key: bytes,
) -> SignIn | None:
    """Approvers' sign-in with the OpenID Provider, when one is configured (DESIGN §12)."""
    if settings.oidc is None:
        return None
    provider = OidcProvider(
        settings.oidc,
        redirect_uri=f"{settings.server.public_url}/approvals/callback",
        post_logout_uri=f"{settings.server.public_url}/approvals",
    )
    sessions = web_sessions_for(store)
    return SignIn(
        settings.oidc,
        provider,
        sessions,
        signin_key=key,
        known_tenant=policies.known,
        audit=audit.emit,
        preauth=preauth,
    )


def _gateway(
    settings: Settings,
    auth: AuthService,
    policies: Policies,
    engine: LivePolicy,
    limiter: TenantLimiter,
    runtime: Runtime,
    upstreams: Upstreams,
    sessions: SessionSealer,
    approvals: ApprovalFlow,
    reports_for: Callable[[str], Reports],
    audit: AuditLog,
    metrics: Metrics,
    tracing: Tracing,
) -> McpGateway:
    """The `/mcp` pipeline: gate, relay (with the pinned contracts), one responder per call."""
    breakers = CircuitBreakers(
        threshold=settings.runtime.breaker_threshold,
        cooldown=settings.runtime.breaker_cooldown_seconds,
        trial_timeout=settings.runtime.call_timeout_seconds,
    )
    pinning = Pinning(pins=ContractPins(), runtime=runtime, breakers=breakers, engine=engine, audit=audit)
    relay = Relay(
        runtime=runtime,
        upstreams=upstreams,
        breakers=breakers,
        pinning=pinning,
        sessions=sessions,
        approvals=approvals,
        reports_for=reports_for,
        audit=audit,
        max_response_bytes=settings.limits.max_response_bytes,
    )
    gate = Gate(
        auth=auth,
        policies=policies,
        engine=engine,
        limiter=limiter,
        sessions=sessions,
        approvals=approvals,
        audit=audit,
        pinned_without=pinning.pinned_without,
        session_alive=relay.session_alive,
        max_body_bytes=settings.limits.max_body_bytes,
    )
    return McpGateway(
        gate=gate, relay=relay, approvals=approvals, limiter=limiter, audit=audit, metrics=metrics,
        tracing=tracing,
    )  # fmt: skip


class BrokerApp:
    """Finds the client behind a trusted proxy, refuses a disallowed `Origin` on every
    surface, then sends `/mcp` straight to the gateway and everything else through Starlette.

    The gateway handles its own errors and is on the path of every call; Starlette's
    middleware stack and router would add work to each one and give nothing there.
    """

    def __init__(
        self,
        app: Starlette,
        gateway: McpGateway,
        *,
        origins: Origins,
        preauth: PreAuthLimiter,
        proxies: TrustedProxies,
        audit: AuditLog,
    ) -> None:
        self.app = app
        self._gateway = gateway
        self._origins = origins
        self._preauth = preauth
        self._proxies = proxies
        self._audit = audit

    @property
    def components(self) -> Components:
        components: Components = self.app.state.components
        return components

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            self._proxies.rewrite(scope)  # first: every limit below is per client address
            if self._origins.refused(scope["headers"]):
                await self._refuse_origin(scope, send)
            elif scope["path"] == "/mcp":
                await self._gateway(scope, receive, send)
            else:
                await self.app(scope, receive, send)
        else:
            await self.app(scope, receive, send)

    async def _refuse_origin(self, scope: Scope, send: Send) -> None:
        """403 before anything else runs; audited like a failed authentication (and counted
        against the client address), so a flood of them cannot fill the audit disk either."""
        path = scope["path"]
        if self._preauth.failed(client_address(scope), ORIGIN_REFUSED):
            # Refused either way: a log that cannot be written changes nothing about the answer.
            with contextlib.suppress(Exception):
                await self._audit.emit(
                    AuditEvent.AUTH_DENIED,
                    outcome=Outcome.DENIED,
                    reason=ORIGIN_REFUSED,
                    method=origin_surface(path),
                    status=403,
                )
        body, headers = origin_refusal(path)
        await send({"type": "http.response.start", "status": 403, "headers": headers})
        await send({"type": "http.response.body", "body": body})
