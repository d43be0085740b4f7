"""Approvals: how long they stay open and are kept, and the store they live in (SQLite in the
data dir, or a PostgreSQL shared by replicas)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from broker.settings.reader import PREFIX, Reader, SettingsError
from broker.settings.runtime import RuntimeKind, RuntimeSettings

APPROVALS_DB = "approvals.sqlite3"  # in the data dir, without DOCBROKER_DATABASE_URL


@dataclass(frozen=True)
class ApprovalSettings:
    ttl_seconds: int = 900  # how long a pending approval stays open for a human
    token_ttl_seconds: int = 120  # lifetime of a minted token (server accepts at most 300)
    require_distinct_approver: bool = False
    # How long a closed record (expired, denied past its expiry, consumed) is kept for the
    # operators' history before the periodic purge deletes it; open ones are never purged.
    retention_seconds: int = 30 * 86_400


def approval_settings(r: Reader) -> ApprovalSettings:
    return ApprovalSettings(
        ttl_seconds=r.integer(
            "APPROVAL_TTL", 900, low=30, high=7 * 86_400, doc="seconds a pending approval stays open"
        ),
        token_ttl_seconds=r.integer(
            "APPROVAL_TOKEN_TTL",
            120,
            low=10,
            high=300,
            doc=(
                "seconds a minted approval token is valid for the sandbox (10-300; the server accepts at "
                "most 300)"
            ),
        ),
        require_distinct_approver=r.flag(
            "APPROVAL_REQUIRE_DISTINCT_APPROVER", False, doc="approver must differ from requester"
        ),
        retention_seconds=r.integer(
            "APPROVAL_RETENTION",
            30 * 86_400,
            low=60,
            high=3650 * 86_400,
            doc=(
                "seconds a closed approval record is kept (from its expiry, or from its use for a "
                "consumed one) before the purge, at start-up and every 10 minutes, deletes it; each purge "
                "is one audited `approval.purged` line with a `count`; open records are never purged"
            ),
        ),
    )


@dataclass(frozen=True)
class DatabaseSettings:
    """The shared approvals database (PostgreSQL) of replicas; None: SQLite in the data dir.

    The URL may carry a password: it is never logged, audited or shown (`repr=False`), and
    errors about it name the variable only.
    """

    url: str | None = field(default=None, repr=False)
    pool_min: int = 1
    pool_max: int = 10
    # How long an approval operation waits for a connection, and the server-side bound on
    # every statement: past either, the operation fails closed (503) instead of hanging.
    pool_timeout_seconds: float = 2.0
    statement_timeout_seconds: float = 2.0
    # A connection over the network without `sslmode=verify-full` (DOCBROKER_DATABASE_ALLOW_
    # INSECURE_TRANSPORT): approvals and their reports cross it, readable and forgeable.
    allow_insecure_transport: bool = False
    # The libpq variables (PGHOST, PGSSLMODE, …) the connection will also obey: a URL without
    # a host or an sslmode takes them from there (`from_env` passes the broker's own).
    libpq_env: Mapping[str, str] = field(default_factory=dict, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.pool_min > self.pool_max:
            raise SettingsError(f"{PREFIX}DATABASE_POOL_MIN must not exceed {PREFIX}DATABASE_POOL_MAX")
        if self.url is not None:
            if not self.url.startswith(("postgresql://", "postgres://")):
                raise SettingsError(f"{PREFIX}DATABASE_URL must be a postgresql:// URL")
            import psycopg  # only when configured: SQLite brokers never load it
            from psycopg.conninfo import conninfo_to_dict

            try:
                params = conninfo_to_dict(self.url)
            except psycopg.Error:
                raise SettingsError(f"{PREFIX}DATABASE_URL is not a valid PostgreSQL URL") from None
            if not self.allow_insecure_transport and not _verified_or_local(params, self.libpq_env):
                raise SettingsError(
                    f"{PREFIX}DATABASE_URL names a server over the network without sslmode=verify-full "
                    f"(set {PREFIX}DATABASE_ALLOW_INSECURE_TRANSPORT=1 to accept that)"
                )


def database_settings(r: Reader) -> DatabaseSettings:
    return DatabaseSettings(
        url=r.optional(
            "DATABASE_URL",
            doc=(
                "a `postgresql://` URL: approvals in PostgreSQL, shared by replicas (see below). Over the "
                "network it must say `sslmode=verify-full` (a unix socket needs nothing); else the broker "
                "refuses to start. It may hold a password: it is never logged, audited or printed. "
                "Required with `DOCBROKER_REPLICAS` above 1 and for a broker Pod (the Kubernetes runtime "
                "without `DOCBROKER_KUBECONFIG`): without it the broker refuses to start"
            ),
        ),
        pool_min=r.integer(
            "DATABASE_POOL_MIN",
            1,
            low=0,
            high=100,
            doc="connections each broker keeps to PostgreSQL, at least",
        ),
        pool_max=r.integer(
            "DATABASE_POOL_MAX",
            10,
            low=1,
            high=100,
            doc="connections each broker keeps to PostgreSQL, at most",
        ),
        pool_timeout_seconds=r.number(
            "DATABASE_POOL_TIMEOUT",
            2.0,
            low=0.1,
            high=60,
            doc=(
                "seconds an approval operation waits for a connection; past it the operation fails closed "
                "(503)"
            ),
        ),
        statement_timeout_seconds=r.number(
            "DATABASE_STATEMENT_TIMEOUT",
            2.0,
            low=0.1,
            high=60,
            doc=(
                "seconds any statement may run (PostgreSQL's `statement_timeout`, lock waits included); "
                "past it, 503"
            ),
        ),
        allow_insecure_transport=r.flag(
            "DATABASE_ALLOW_INSECURE_TRANSPORT",
            False,
            doc=(
                "accept a `DOCBROKER_DATABASE_URL` that reaches its server over the network with an "
                "`sslmode` below `verify-full` (none, `require`, `verify-ca`): approvals and reports then "
                "cross it readable, or to a server that is not checked"
            ),
        ),
        libpq_env=r.libpq(),
    )


@dataclass(frozen=True)
class StoreSettings:
    """Where approvals live: all `docbroker db` needs (`store_from_env`)."""

    data_dir: Path
    database: DatabaseSettings

    @property
    def approvals_db(self) -> Path:
        return self.data_dir / APPROVALS_DB


def one_approvals_store(database: DatabaseSettings, *, replicas: int, runtime: RuntimeSettings) -> None:
    """SQLite is one broker's file: replicas each on their own would each keep their own
    approvals (one proposes, another never sees it), and a broker Pod's data dir goes with the
    Pod. Refused at start rather than found out when an approval goes missing (issue 38). A
    broker Pod is the Kubernetes runtime on the in-cluster config (no DOCBROKER_KUBECONFIG); one
    on a host with a kubeconfig keeps its file like any host broker."""
    if database.url is not None:
        return
    if replicas > 1:
        raise SettingsError(
            f"{PREFIX}REPLICAS above 1 needs {PREFIX}DATABASE_URL (PostgreSQL): "
            "with SQLite each replica would keep approvals of its own"
        )
    if runtime.kind is RuntimeKind.KUBERNETES and runtime.kubernetes.kubeconfig is None:
        raise SettingsError(
            f"{PREFIX}RUNTIME=kubernetes in a Pod needs {PREFIX}DATABASE_URL (PostgreSQL): "
            "SQLite in the Pod's data dir is lost with the Pod and not shared with other replicas"
        )


def _verified_or_local(params: Mapping[str, object], libpq_env: Mapping[str, str]) -> bool:
    """Whether libpq will reach the server only over a unix socket, or over TLS that checks
    both the certificate chain and the host name (`verify-full`; `require` and `verify-ca`
    let a machine in the path, or any holder of a certificate from the same CA, pose as it).

    What the URL leaves out libpq takes from PGHOST, PGHOSTADDR, PGSSLMODE and a PGSERVICE
    file; a service file is not read here, so with one only the URL's own values count."""

    def value(key: str, variable: str) -> str | None:
        found = params.get(key) or libpq_env.get(variable) or None
        return str(found) if found is not None else None

    host, hostaddr = value("host", "PGHOST"), value("hostaddr", "PGHOSTADDR")
    if hostaddr is None and (host is not None or value("service", "PGSERVICE") is None):
        # A host that is a directory (or an abstract socket's @name) is a unix socket; an empty
        # entry is libpq's default, the socket too.
        if all(h == "" or h.startswith(("/", "@")) for h in (host or "").split(",")):
            return True
    return value("sslmode", "PGSSLMODE") == "verify-full"
