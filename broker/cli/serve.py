"""`docbroker serve`: the broker's wiring — settings, audit log, approvals store, runtime, app,
and the HTTP server around it. The only command that runs the broker itself."""

from __future__ import annotations

import argparse
import logging

from broker.cli.base import Subparsers, load_settings
from broker.settings import Settings


def register(sub: Subparsers) -> None:
    serve = sub.add_parser(
        "serve",
        help="run the broker (configuration: DOCBROKER_* variables)",
        description="Run the broker until SIGTERM or SIGINT. Exit 1 when it cannot start (one line "
        "naming the part), 2 on a configuration error.",
    )
    serve.set_defaults(func=cmd_serve)


def cmd_serve(args: argparse.Namespace) -> int:
    from broker.master_key import create_master_key

    settings = load_settings()
    # The data dir is the one barrier between tenants' files and other users of the host.
    settings.data_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    settings.data_dir.chmod(0o700)
    if create_master_key(settings.master_key_file):
        logging.getLogger("docbroker").warning("created a new master key file")
    from broker.serving import raise_open_file_limit

    # Descriptors the settings allow at most: client connections, a few per sandbox (its
    # connections, its pinned folders), the Docker client's pool, files and the rest.
    raise_open_file_limit(settings.edge.max_connections + 4 * settings.runtime.max_sandboxes + 256)
    import uvloop

    # uvloop and httptools: less broker CPU per call than asyncio + h11 (bench/REPORT.md).
    return uvloop.run(_serve(settings))


async def _serve(settings: Settings) -> int:
    import uvicorn

    from broker.app import build_app
    from broker.approvals.store import SchemaMismatch, StoreError
    from broker.approvals.stores import open_store
    from broker.audit import AuditLog, AuditSinkError
    from broker.http_edge import edge_protocol
    from broker.master_key import MasterKeyError
    from broker.policy import PolicyError
    from broker.runtime.backends import make_backend
    from broker.runtime.base import RuntimeErrorBase
    from broker.runtime.host_replicas import ReplicaTaken
    from broker.schema_wait import wait_for_schema
    from broker.serving import BrokerServer

    try:
        audit = await AuditLog.open(settings.audit)
    except AuditSinkError as exc:
        raise SystemExit(exc.startup_message()) from None
    async with audit:
        try:
            store = await open_store(settings)
        except SchemaMismatch as exc:
            if settings.database.url is None:  # the SQLite file is this broker's: nobody else migrates it
                raise SystemExit(f"docbroker: cannot start: {exc}") from None
            # PostgreSQL is migrated by a step of its own (on a cluster the db-upgrade Job):
            # wait for it, alive and Not Ready, rather than crash-loop.
            if not await wait_for_schema(settings, str(exc)):
                return 0  # stopped while waiting
            try:
                store = await open_store(settings)
            except StoreError as again:
                raise SystemExit(f"docbroker: cannot start: {again}") from None
        except StoreError as exc:  # fixed texts: never the database URL
            raise SystemExit(f"docbroker: cannot start: {exc}") from None
        try:
            backend = await make_backend(settings)
            await backend.replicas.join()  # before serving: a twin replica id stops here, in one line
            app = build_app(settings, audit, backend, store)
        except (MasterKeyError, PolicyError, RuntimeErrorBase, ReplicaTaken, ValueError, OSError) as exc:
            await store.close()
            raise SystemExit(f"docbroker: cannot start: {exc}") from None
        config = uvicorn.Config(
            app,
            host=settings.server.host,
            port=settings.server.port,
            log_level="warning",
            access_log=False,  # the audit log is the access log; uvicorn's would carry paths and peers
            # httptools, each answer in one write; each request read within a deadline and a head cap
            http=edge_protocol(settings.edge, on_cut=app.components.metrics.cut),
            limit_concurrency=settings.edge.max_connections,  # past it: 503, not one more fd each
            proxy_headers=False,  # no X-Forwarded-* trust: the broker is the edge it audits
            server_header=False,  # no software banner for callers to fingerprint
            lifespan="on",
            timeout_graceful_shutdown=10,
        )
        await BrokerServer(config).serve()
    return 0
