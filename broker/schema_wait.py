"""Start-up against a PostgreSQL schema that is not this broker's yet: wait, and say so.

On a cluster the schema is migrated by a step of its own (k8s/base/db-upgrade.yaml runs
`docbroker db upgrade`, the only writer of the schema), and the broker Pods may start before
it has finished, or roll back onto a schema a newer release made. A broker that exited there
would only crash-loop, its reason buried in restarts. So it waits instead: `/healthz` answers
(the process is alive, the kubelet need not kill it), `/readyz` answers 503 with, for the
operators' bearer, the version found and the one needed, every other path 503. It polls the
database until the schema is the one it knows, then returns and the real broker starts on the
same port. Nothing here touches the schema.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from broker.approvals import migrations
from broker.approvals.store import StoreUnavailable
from broker.auth.ops import OpsTokens
from broker.serving import BrokerServer
from broker.settings import Settings

log = logging.getLogger("docbroker")
POLL_SECONDS = 2.0  # a few queries a minute per replica while it waits; ready within 2 s after
NO_STORE = {"cache-control": "no-store"}


@dataclass
class _Found:
    version: int | None  # None: the database did not answer the last poll


async def schema_version(settings: Settings) -> int | None:
    """The schema version in the database (None: unreachable now)."""
    from broker.approvals.postgres_store import PostgresApprovalStore

    try:
        store = await PostgresApprovalStore.open(settings.database, check_schema=False)
    except StoreUnavailable:
        return None
    try:
        return await store.schema_version()
    except StoreUnavailable:
        return None
    finally:
        await store.close()


def waiting_app(found: _Found, ops: OpsTokens) -> Starlette:
    async def healthz(_: Request) -> Response:
        return JSONResponse({"status": "ok"})

    async def readyz(request: Request) -> Response:
        body: dict[str, object] = {"status": "not_ready"}
        if ops.allowed(request.scope["headers"]):
            body["checks"] = {
                "approvals_database": {
                    "backend": "postgresql",
                    "reachable": found.version is not None,
                    "schema": {"found": found.version, "needed": migrations.LATEST, "state": "waiting"},
                }
            }
        return JSONResponse(body, 503, headers=NO_STORE)

    async def elsewhere(_: Request) -> Response:
        return JSONResponse({"error": "not_ready"}, 503, headers={"retry-after": "5", **NO_STORE})

    routes = [
        Route("/healthz", healthz, methods=["GET"]),
        Route("/readyz", readyz, methods=["GET"]),
        Route(
            "/{path:path}", elsewhere, methods=["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"]
        ),
    ]
    return Starlette(routes=routes)


async def wait_for_schema(settings: Settings, reason: str) -> bool:
    """Serve the waiting answers until the schema is `migrations.LATEST` (True), or until
    SIGTERM/SIGINT (False: the caller exits without starting). `reason` is the one line the
    schema check gave (what to run); it is logged once, and again when the version changes."""
    found = _Found(None)
    app = waiting_app(found, OpsTokens.load(settings.server.ops_token_file))
    config = uvicorn.Config(
        app,
        host=settings.server.host,
        port=settings.server.port,
        log_level="warning",
        access_log=False,
        proxy_headers=False,
        server_header=False,
        lifespan="off",
        timeout_graceful_shutdown=1,
    )
    server = BrokerServer(config)
    serving = asyncio.create_task(server.serve())
    log.warning("waiting for the approvals database schema (Not Ready until then): %s", reason)
    said = None
    try:
        while not serving.done():
            found.version = await schema_version(settings)
            if found.version == migrations.LATEST:
                log.warning("approvals database schema ready (version %d): starting", found.version)
                return True
            if found.version != said and found.version is not None:
                said = found.version
                log.warning(
                    "approvals database schema at version %d, this broker needs %d: waiting",
                    found.version,
                    migrations.LATEST,
                )
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(serving), POLL_SECONDS)
        return False
    finally:
        server.should_exit = True
        await serving
