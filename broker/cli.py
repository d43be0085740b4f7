"""`docbroker`: serve, mint dev tokens, provision tenants, replace sandboxes, build images,
verify audit, db, doctor, policy."""

from __future__ import annotations

import argparse
import json
import logging
import secrets
import sys
import time
from collections.abc import Callable
from typing import Any

from broker.settings import Settings, SettingsError, StoreSettings

_DEMO_SCOPES = "docs:read docs:write reports:approve"


def _settings() -> Settings:
    try:
        return Settings.from_env()
    except SettingsError as exc:
        raise SystemExit(f"docbroker: configuration error: {exc}") from None


def cmd_serve(args: argparse.Namespace) -> int:
    from broker.master_key import create_master_key

    settings = _settings()
    # The data dir is the one barrier between tenants' files and other users of the host.
    settings.data_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    settings.data_dir.chmod(0o700)
    if create_master_key(settings.master_key_file):
        logging.getLogger("docbroker").warning("created a new master key file")
    import uvloop

    # uvloop and httptools: less broker CPU per call than asyncio + h11 (bench/REPORT.md).
    return uvloop.run(_serve(settings))


async def _serve(settings: Settings) -> int:
    import uvicorn

    from broker.app import build_app, make_backend, open_store
    from broker.approvals.store import StoreError
    from broker.audit import AuditLog, AuditSinkError
    from broker.http_edge import edge_protocol
    from broker.master_key import MasterKeyError
    from broker.policy import PolicyError
    from broker.runtime.base import RuntimeErrorBase
    from broker.runtime.shared import ReplicaTaken
    from broker.serving import BrokerServer

    try:
        audit = await AuditLog.open(settings.audit)
    except AuditSinkError as exc:
        raise SystemExit(exc.startup_message()) from None
    async with audit:
        try:
            store = await open_store(settings)
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
    from broker.master_key import create_master_key, load_master_key
    from broker.tenants import Tenants

    if args.name == "manifest" and args.manifest_of is not None:
        from broker.runtime.kubernetes.manifest import run_manifest

        return run_manifest(args, out=sys.stdout)
    if args.manifest_of is not None:
        raise SystemExit("docbroker tenant: one tenant name (or `tenant manifest NAME`)")

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


def cmd_sandbox_replace(args: argparse.Namespace) -> int:
    """Remove a tenant's sandbox in the engine (by its labels), whichever broker started it.

    Each broker using it finds it gone on its next call, starts a new one and pins that one's
    tools afresh (DESIGN §11). The brokers audit what they see (`sandbox.failed`, then
    `sandbox.stopped` and `sandbox.started`); this command has no audit log of its own to write."""
    import asyncio

    from broker.app import make_backend
    from broker.runtime.base import RuntimeErrorBase
    from server.contracts import TENANT_RE

    if not TENANT_RE.fullmatch(args.tenant):
        raise SystemExit("docbroker sandbox replace: not a tenant id (a DNS label)")
    settings = _settings()

    async def replace() -> int:
        backend = await make_backend(settings)
        try:
            return await backend.remove_tenant(args.tenant, str(settings.run_dir / args.tenant))
        finally:
            await backend.close()

    try:
        removed = asyncio.run(replace())
    except RuntimeErrorBase as exc:
        raise SystemExit(f"docbroker sandbox replace: {exc}") from None
    sys.stdout.write(json.dumps({"tenant": args.tenant, "removed": removed}) + "\n")
    return 0


# -- `docbroker audit ...` ---------------------------------------------------------------------
# One `_add_audit_*` function per subcommand, each adding its parser and setting `func`; list it
# in AUDIT_COMMANDS. Heavy imports stay inside the command functions (start-up time of the CLI).

AuditCommands = Any  # argparse's private _SubParsersAction


def cmd_audit_verify(args: argparse.Namespace) -> int:
    from broker.audit.evidence import main as main_verify

    return main_verify(args.files, args.key, args.witness, args.replica, args.json)


def _add_audit_verify(audit: AuditCommands) -> None:
    verify = audit.add_parser(
        "verify",
        help="check audit logs: chain, signed checkpoints, witness copies; exit 0 intact, 1 broken, 2 usage",
    )
    verify.add_argument(
        "files", nargs="+", metavar="FILE", help="log files: rotated sets, several replicas, any order"
    )
    verify.add_argument(
        "--key", action="append", default=[], help="a replica's public key: PEM file, or hex (repeat)"
    )
    verify.add_argument(
        "--witness", action="append", default=[], help="a witness file of checkpoints (repeat)"
    )
    verify.add_argument("--replica", help="every checkpoint must be this replica's")
    verify.add_argument("--json", action="store_true", help="one JSON document instead of a line per file")
    verify.set_defaults(func=cmd_audit_verify)


def cmd_audit_prove(args: argparse.Namespace) -> int:
    from broker.audit.proofs import main_prove

    return main_prove(args.files, args.seq, args.checkpoint, args.old, args.new)


def _add_audit_prove(audit: AuditCommands) -> None:
    prove = audit.add_parser(
        "prove", help="print an RFC 6962 proof (JSON): one event is in the log, or the log only grew"
    )
    prove.add_argument("files", nargs="+", metavar="FILE", help="one replica's log files, any order")
    which = prove.add_mutually_exclusive_group(required=True)
    which.add_argument("--seq", type=int, help="inclusion: the event with this seq")
    which.add_argument("--from", dest="old", type=int, metavar="N", help="consistency: from checkpoint N")
    prove.add_argument(
        "--checkpoint", type=int, metavar="N", help="inclusion under checkpoint N (default: the last)"
    )
    prove.add_argument(
        "--to", dest="new", type=int, metavar="M", help="consistency: to checkpoint M (default: the last)"
    )
    prove.set_defaults(func=cmd_audit_prove)


def cmd_audit_verify_proof(args: argparse.Namespace) -> int:
    from broker.audit.proofs import main_verify_proof

    return main_verify_proof(args.proof, args.key)


def _add_audit_verify_proof(audit: AuditCommands) -> None:
    check = audit.add_parser(
        "verify-proof", help="check a proof from `audit prove`; exit 0 valid, 1 not, 2 usage"
    )
    check.add_argument("proof", help="the proof's JSON file, or - for stdin")
    check.add_argument(
        "--key", action="append", required=True, help="the replica's public key: PEM file, or hex"
    )
    check.set_defaults(func=cmd_audit_verify_proof)


def cmd_audit_key(args: argparse.Namespace) -> int:
    from broker.audit.checkpoint import KeyFileError, create_signing_key, load_signing_key, public_pem

    key_file = _settings().audit.key_file
    assert key_file is not None  # from_env always names one
    if create_signing_key(key_file):
        logging.getLogger("docbroker").warning("created a new audit signing key")
    try:
        signer = load_signing_key(key_file)
    except KeyFileError as exc:
        raise SystemExit(f"docbroker audit key: {exc}") from None
    public = signer.private.public_key()
    sys.stdout.write(public_pem(public) if args.format == "pem" else signer.key_id + "\n")
    if args.format == "hex":
        from broker.audit.checkpoint import public_hex

        sys.stdout.write(public_hex(public) + "\n")
    return 0


def _add_audit_key(audit: AuditCommands) -> None:
    key = audit.add_parser("key", help="print this replica's public audit key (for `verify --key`)")
    key.add_argument("--format", choices=["pem", "hex"], default="pem", help="hex: key id, then the raw key")
    key.set_defaults(func=cmd_audit_key)


# `audit query` and `audit export`: the same filters over the same streaming scan (broker/audit/query.py).


def _add_audit_filters(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("files", nargs="+", metavar="FILE", help="audit log files, any order")
    more = "repeat for several"
    parser.add_argument("--tenant", action="append", default=[], help=f"tenant name ({more})")
    parser.add_argument("--subject", action="append", default=[], help=f"subject, the token's sub ({more})")
    parser.add_argument("--event", action="append", default=[], help=f"event, e.g. policy.denied ({more})")
    parser.add_argument("--outcome", action="append", default=[], help=f"outcome, e.g. denied ({more})")
    parser.add_argument("--reason", action="append", default=[], help=f"reason code ({more})")
    parser.add_argument("--since", help="from: RFC 3339, a date (UTC), or an age: 15m, 12h, 7d")
    parser.add_argument("--until", help="before this time (same forms as --since)")
    parser.add_argument("--evidence", action="store_true", help="include the log's own audit.* lines")
    parser.add_argument("-f", "--follow", action="store_true", help="keep reading the newest file")


def cmd_audit_query(args: argparse.Namespace) -> int:
    from broker.audit.query import main_query

    return main_query(args)


def _add_audit_query(audit: AuditCommands) -> None:
    query = audit.add_parser("query", help="filter audit events; print a table or JSON lines (--json)")
    _add_audit_filters(query)
    query.add_argument("--json", action="store_true", help="print the matching lines as they are")
    query.set_defaults(func=cmd_audit_query)


def cmd_audit_export(args: argparse.Namespace) -> int:
    from broker.audit.ocsf import main_export

    return main_export(args)


def _add_audit_export(audit: AuditCommands) -> None:
    export = audit.add_parser("export", help="export audit events for a SIEM (OCSF API Activity, JSON lines)")
    _add_audit_filters(export)
    export.add_argument("--format", choices=["ocsf"], required=True, help="OCSF 1.5.0 API Activity (6003)")
    export.set_defaults(func=cmd_audit_export)


AUDIT_COMMANDS: list[Callable[[AuditCommands], None]] = [
    _add_audit_verify,
    _add_audit_prove,
    _add_audit_verify_proof,
    _add_audit_key,
    _add_audit_query,
    _add_audit_export,
]


def _progress(line: str) -> None:
    sys.stderr.write(line.rstrip() + "\n")


def cmd_image_build(args: argparse.Namespace) -> int:
    from broker.images import ImageError, build_images
    from broker.settings import docker_host_from_env

    try:
        build_images(args.which, base=args.base, progress=_progress, base_url=docker_host_from_env())
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
    from broker.settings import store_from_env

    try:
        # Only what the schema needs: an operator's shell has no DOCBROKER_AUTH_* to set.
        settings = store_from_env()
    except SettingsError as exc:
        raise SystemExit(f"docbroker: configuration error: {exc}") from None
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


async def _db(settings: StoreSettings, *, upgrade: bool) -> tuple[int, list[int]]:
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

    tenant = sub.add_parser(
        "tenant",
        help="provision a tenant (folders, secret, policy file); `tenant manifest NAME`: its "
        "Kubernetes PVCs (and Secret) as YAML",
    )
    tenant.add_argument("name")
    tenant.add_argument("manifest_of", nargs="?", metavar="NAME", help="with `manifest`: the tenant")
    tenant.add_argument("--secret", action="store_true", help="manifest: add the Secret (master key)")
    tenant.add_argument("--storage-class", help="manifest: the PVCs' storage class")
    tenant.add_argument("--sources-size", default="1Gi", help="manifest: the sources PVC's size")
    tenant.add_argument("--reports-size", default="1Gi", help="manifest: the reports PVC's size")
    tenant.set_defaults(func=cmd_tenant)

    sandbox = sub.add_parser("sandbox", help="tenants' sandboxes").add_subparsers(
        dest="sandbox_command", required=True
    )
    replace = sandbox.add_parser(
        "replace", help="remove a tenant's sandbox (any broker's); the next call starts a new one"
    )
    replace.add_argument("tenant")
    replace.set_defaults(func=cmd_sandbox_replace)

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
    for add_audit_command in AUDIT_COMMANDS:
        add_audit_command(audit)

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
    from broker.policy.tool import add_policy_commands  # the logic lives with the policy

    add_policy_commands(sub)
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
