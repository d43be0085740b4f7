"""`docbroker`: serve, mint dev tokens, provision tenants, build images, verify audit, db, doctor."""

from __future__ import annotations

import argparse
import json
import logging
import secrets
import sys
import time
from pathlib import Path

from broker.settings import Settings, SettingsError

_DEMO_SCOPES = "docs:read docs:write reports:approve"


def _settings() -> Settings:
    try:
        return Settings.from_env()
    except SettingsError as exc:
        raise SystemExit(f"docbroker: configuration error: {exc}") from None


def cmd_serve(args: argparse.Namespace) -> int:
    from broker.approvals.secrets import create_master_key

    settings = _settings()
    # The data dir is the one barrier between tenants' files and other users of the host.
    settings.data_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    settings.data_dir.chmod(0o700)
    if create_master_key(settings.master_key_file):
        logging.getLogger("docbroker").warning("created a new master key file")
    import uvloop

    # uvloop and httptools: measured ~0.3 ms less broker CPU per call than asyncio + h11.
    return uvloop.run(_serve(settings))


async def _serve(settings: Settings) -> int:
    import uvicorn

    from broker.app import build_app, make_backend, open_store
    from broker.approvals.secrets import KeyError_
    from broker.approvals.store import StoreError
    from broker.audit import AuditLog, AuditSinkError
    from broker.http_edge import edge_protocol
    from broker.policy import PolicyError
    from broker.runtime.base import RuntimeErrorBase
    from broker.serving import BrokerServer

    try:
        audit = await AuditLog.open(settings.audit)
    except AuditSinkError as exc:
        raise SystemExit(f"docbroker: cannot open the audit log ({exc.code}); refusing to start") from None
    async with audit:
        try:
            store = await open_store(settings)
        except StoreError as exc:  # fixed texts: never the database URL
            raise SystemExit(f"docbroker: cannot start: {exc}") from None
        try:
            backend = await make_backend(settings)
            app = build_app(settings, audit, backend, store)
        except (KeyError_, PolicyError, RuntimeErrorBase, ValueError, OSError) as exc:
            await store.close()
            raise SystemExit(f"docbroker: cannot start: {exc}") from None
        config = uvicorn.Config(
            app,
            host=settings.host,
            port=settings.port,
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


def cmd_token(args: argparse.Namespace) -> int:
    """Mint an HS256 token for the dev mode. Refuses when the broker is not in dev mode."""
    import jwt

    settings = _settings()
    secret_file = settings.auth.dev_hs256_secret_file
    if secret_file is None:
        raise SystemExit("docbroker token: only in dev mode (DOCBROKER_AUTH_DEV_HS256_SECRET_FILE)")
    now = int(time.time())
    claims = {
        "iss": settings.auth.issuer,
        "aud": settings.auth.audience,
        "sub": args.subject,
        settings.auth.tenant_claim: args.tenant,
        "scope": args.scope,
        "iat": now,
        "exp": now + min(args.ttl, settings.auth.max_lifetime_seconds),
        "jti": secrets.token_hex(8),
    }
    from broker.auth import load_dev_secret

    key = load_dev_secret(secret_file)
    sys.stdout.write(jwt.encode(claims, key, algorithm="HS256") + "\n")
    return 0


def cmd_tenant(args: argparse.Namespace) -> int:
    from broker.approvals.secrets import create_master_key, load_master_key
    from broker.tenants import Tenants

    settings = _settings()
    create_master_key(settings.master_key_file)
    tenants = Tenants(settings, load_master_key(settings.master_key_file))
    try:
        spec = tenants.provision(args.name)
    except ValueError as exc:
        raise SystemExit(f"docbroker tenant: {exc}") from None
    policy = settings.policies_dir / "tenants" / f"{args.name}.toml"
    if not policy.exists():
        policy.parent.mkdir(parents=True, exist_ok=True)
        policy.write_text(f"# Tenant {args.name}: overrides of policies/default.toml\n")
    sys.stdout.write(
        json.dumps({"tenant": args.name, "sources": spec.sources_dir, "policy": str(policy)}, indent=2) + "\n"
    )
    return 0


def cmd_audit_verify(args: argparse.Namespace) -> int:
    from broker.audit.verify import main_verify

    return main_verify(Path(args.file))


def _progress(line: str) -> None:
    sys.stderr.write(line.rstrip() + "\n")


def cmd_image_build(args: argparse.Namespace) -> int:
    import os

    from broker.images import ImageError, build_images

    try:
        build_images(
            args.which,
            base=args.base,
            progress=_progress,
            base_url=os.environ.get("DOCBROKER_DOCKER_HOST") or None,
        )
    except ImageError as exc:
        sys.stderr.write(f"docbroker image build: {exc}\n")
        return 1
    return 0


def cmd_doctor(args: argparse.Namespace) -> int:
    from broker.doctor import run_doctor

    return run_doctor(_settings(), out=sys.stdout)


# -- db: the approvals schema (broker/approvals/migrations.py) ----------------------------------


def cmd_db(args: argparse.Namespace) -> int:
    import asyncio

    from broker.approvals.store import StoreError

    settings = _settings()
    try:
        before, applied = asyncio.run(_db(settings, upgrade=args.db_command == "upgrade"))
    except StoreError as exc:  # fixed texts: never the database URL
        sys.stderr.write(f"docbroker db {args.db_command}: {exc}\n")
        return 1
    from broker.approvals.migrations import LATEST

    backend = "postgresql" if settings.database.url else "sqlite"
    now = applied[-1] if applied else before
    state = "current" if now == LATEST else ("needs upgrade" if now < LATEST else "newer than this broker")
    report = {"backend": backend, "schema_version": now, "broker_version": LATEST, "state": state}
    if args.db_command == "upgrade":
        report["applied"] = applied
    sys.stdout.write(json.dumps(report) + "\n")
    return 0 if now == LATEST else 1


async def _db(settings: Settings, *, upgrade: bool) -> tuple[int, list[int]]:
    """(version found, versions applied)."""
    if settings.database.url is not None:
        from broker.approvals.postgres_store import PostgresApprovalStore

        store = await PostgresApprovalStore.open(settings.database, check_schema=False)
        try:
            before = await store.schema_version()
            return before, (await store.upgrade() if upgrade else [])
        finally:
            await store.close()
    import sqlite3

    from broker.approvals import migrations

    if not upgrade and not settings.approvals_db.exists():
        return 0, []
    settings.data_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    db = sqlite3.connect(settings.approvals_db, isolation_level=None)
    try:
        before = migrations.sqlite_version(db)
        return before, (migrations.upgrade_sqlite(db) if upgrade else [])
    finally:
        db.close()


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="docbroker", description="Multi-tenant MCP broker for document tools"
    )
    sub = parser.add_subparsers(dest="command", required=True)

    sub.add_parser("serve", help="run the broker (configuration: DOCBROKER_* variables)").set_defaults(
        func=cmd_serve
    )

    token = sub.add_parser("token", help="mint a dev token (HS256 dev mode only)")
    token.add_argument("--tenant", default="demo")
    token.add_argument("--subject", default="dev-user")
    token.add_argument("--scope", default=_DEMO_SCOPES)
    token.add_argument("--ttl", type=int, default=3600, help="seconds")
    token.set_defaults(func=cmd_token)

    tenant = sub.add_parser("tenant", help="provision a tenant (folders, secret, policy file)")
    tenant.add_argument("name")
    tenant.set_defaults(func=cmd_tenant)

    image = sub.add_parser("image", help="container images").add_subparsers(
        dest="image_command", required=True
    )
    build = image.add_parser("build", help="build the images offline (base, wheelhouse, server, broker)")
    build.add_argument("which", nargs="*", default=["server"], choices=["server", "broker"])
    build.add_argument("--base", default=None, help="base image (default: a locally built Debian base)")
    build.set_defaults(func=cmd_image_build)

    audit = sub.add_parser("audit", help="audit log tools").add_subparsers(
        dest="audit_command", required=True
    )
    verify = audit.add_parser("verify", help="check an audit log's hash chain; report the first broken line")
    verify.add_argument("file")
    verify.set_defaults(func=cmd_audit_verify)

    db = sub.add_parser("db", help="the approvals database's schema").add_subparsers(
        dest="db_command", required=True
    )
    db.add_parser("upgrade", help="apply the schema migrations this broker needs").set_defaults(func=cmd_db)
    db.add_parser("status", help="the schema version found and the one this broker needs").set_defaults(
        func=cmd_db
    )

    sub.add_parser("doctor", help="check the host: daemon, rootless, images, keys").set_defaults(
        func=cmd_doctor
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(
        stream=sys.stderr, level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s"
    )
    # Client libraries log URLs and request lines at INFO: not values we want in any log.
    for noisy in ("httpx2", "httpcore2", "docker", "urllib3"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    # psycopg's pool logs connection errors with libpq's text (hosts, sockets, perhaps more
    # of the URL): the store logs its own fixed lines instead.
    logging.getLogger("psycopg").setLevel(logging.CRITICAL)
    args = build_parser().parse_args(argv)
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
