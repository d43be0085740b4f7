"""The broker's one settings object, built once at start-up from `DOCBROKER_*` variables.

Every value is validated when the object is built and every default is named here, so a
misconfigured broker refuses to start with a message that names the variable. Nothing reads
the environment after this module has run; the object is passed down explicitly. Commands
that need only a part (`docbroker db`, `image build`, `tenant manifest`) read that part here
too (`*_from_env` below), so an operator's shell needs no DOCBROKER_AUTH_* to run them; each
reads its part with the very function `Settings.from_env` reads it with (`_data_dir`,
`_policies_dir`, `_public_url`, ...), so a command and `serve` given one environment read one
value (tests/broker/cli/test_settings_alike.py runs both).
"""

from __future__ import annotations

import ipaddress
import os
import re
import shlex
import socket
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path

PREFIX = "DOCBROKER_"
MIB = 1024 * 1024

IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

ALLOWED_ALGORITHMS = ("RS256", "ES256", "EdDSA")
MAX_LEEWAY_SECONDS = 30


class SettingsError(ValueError):
    """A `DOCBROKER_*` variable is missing or invalid. The message names it, never its value."""


@dataclass(frozen=True)
class AuthSettings:
    issuer: str
    audience: str
    tenant_claim: str = "tenant"  # a claim name, or a dotted path into nested claims
    # (claim value, tenant) pairs: the tenant is the one the claim's values map to (exactly
    # one); empty: the claim's value is the tenant's name itself
    tenant_map: tuple[tuple[str, str], ...] = ()
    groups_claim: str = "groups"  # a list of group or role names the policy decides on (docs/policy.md)
    # The claim that names a person, as the page's sign-in names them too (DESIGN §12): `sub`
    # unless the provider's `sub` differs per application (Entra ID: `oid`).
    person_claim: str = "sub"
    jwks_url: str | None = None
    jwks_file: Path | None = None  # a JWKS document or a PEM public key
    algorithms: tuple[str, ...] = ALLOWED_ALGORITHMS
    dev_hs256_secret_file: Path | None = None  # HS256 dev mode: never together with public keys
    max_lifetime_seconds: int = 3600
    leeway_seconds: int = 10
    max_header_bytes: int = 8192
    jwks_cache_seconds: int = 300
    jwks_refresh_cooldown_seconds: int = 30
    jwks_fetch_timeout_seconds: float = 3.0

    @property
    def dev_mode(self) -> bool:
        return self.dev_hs256_secret_file is not None


class AuditFsync(StrEnum):
    """When the audit log's lines are forced to stable storage."""

    ALWAYS = "always"  # fsync before every emit returns: adds ~1-4 ms (measured) to each request
    INTERVAL = "interval"  # write(2) per event, fsync batched every `fsync_interval_seconds`


@dataclass(frozen=True)
class AuditSettings:
    """Where the audit log lives and how hard each line is pushed to disk.

    Every line is written to the kernel before `emit` returns (a broker crash loses nothing);
    with `INTERVAL` a power loss or kernel crash may lose the last `fsync_interval_seconds`.
    Per-line fsync costs 1-4 ms (measured), against a 1.5 ms p50 budget for all the broker adds.

    The defaults below are the environment's too (`Settings.from_env` reads them from here): a
    log built in code behaves as the broker's does. The files have none: they live in the data
    dir, and whether a log is signed is said by whoever builds it.
    """

    path: Path
    # Evidence beyond the chain (DESIGN §6). None: a plain chain, no checkpoints (the broker
    # always has a key: DOCBROKER_AUDIT_KEY_FILE defaults to one in the data dir).
    key_file: Path | None  # the replica's Ed25519 signing key, created 0600 on first start
    witness_file: Path | None  # a copy of every checkpoint and gap record, to ship elsewhere
    fsync: AuditFsync = AuditFsync.INTERVAL
    fsync_interval_seconds: float = 0.2
    replica: str = field(default_factory=lambda: default_replica_id())  # defined below
    checkpoint_every: int = 1000  # lines
    checkpoint_interval_seconds: float = 10.0  # and at least this often while lines are written
    rotate_bytes: int = 256 * MIB  # 0: never rotate
    # Rotated files kept in the data dir, the newest; older ones are removed after a rotation
    # (0: all kept). With rotate_bytes it bounds the log's disk: (keep_files + 1) * rotate_bytes.
    keep_files: int = 0
    stdout: bool = False  # every line also on stdout (JSON Lines for a log collector)

    def __post_init__(self) -> None:
        if not isinstance(self.fsync, AuditFsync):
            raise SettingsError(f"{PREFIX}AUDIT_FSYNC must be one of {', '.join(AuditFsync)}")
        if not 0.01 <= self.fsync_interval_seconds <= 10:
            raise SettingsError(f"{PREFIX}AUDIT_FSYNC_INTERVAL must be between 0.01 and 10")
        if not REPLICA_ID.fullmatch(self.replica):
            raise SettingsError(f"{PREFIX}REPLICA_ID must be 1-64 of A-Z a-z 0-9 _ . : -")
        if not 1 <= self.checkpoint_every <= 1_000_000:
            raise SettingsError(f"{PREFIX}AUDIT_CHECKPOINT_EVERY must be between 1 and 1000000")
        if not 0.1 <= self.checkpoint_interval_seconds <= 86_400:
            raise SettingsError(f"{PREFIX}AUDIT_CHECKPOINT_INTERVAL must be between 0.1 and 86400")
        if self.rotate_bytes and self.rotate_bytes < 1024 * 1024:
            raise SettingsError(f"{PREFIX}AUDIT_ROTATE_MB must be 0 (never) or at least 1")
        if self.keep_files and not self.rotate_bytes:
            raise SettingsError(f"{PREFIX}AUDIT_KEEP_FILES needs {PREFIX}AUDIT_ROTATE_MB above 0")


REPLICA_ID = re.compile(r"[A-Za-z0-9_.:-]{1,64}")
INSTANCE_RE = re.compile(r"[a-z0-9]([a-z0-9-]{0,30}[a-z0-9])?")


def default_replica_id() -> str:
    """The host name, reduced to the characters a replica id may hold (containers: unique each)."""
    name = re.sub(r"[^A-Za-z0-9_.:-]", "-", socket.gethostname())[:64]
    return name or "local"


@dataclass(frozen=True)
class DockerSettings:
    base_url: str | None = None  # None: DOCKER_HOST or the default socket
    image: str = "docbroker-server:latest"
    require_rootless: bool = False  # refuse a rootful daemon
    memory_bytes: int = 128 * 1024 * 1024
    nano_cpus: int = 1_000_000_000  # one core: start-up is CPU-bound (SDK import), 0.5 doubles it
    pids_limit: int = 64
    nofile: int = 256
    tmpfs_bytes: int = 8 * 1024 * 1024
    seccomp_profile: Path = Path("policies/seccomp.json")
    # Warm, tenant-less sandboxes kept ready so a first call skips the ~1 s SDK import
    # (broker/runtime/warm_pool.py). Each costs an idle sandbox's memory; 0 turns the pool off.
    pool_size: int = 1
    # How far the pool grows when new tenants arrive faster than one spare warms up
    # (broker/runtime/warm_pool_sizer.py); never below pool_size. Spares above pool_size go once no
    # new tenant came for the idle timeout.
    pool_max: int = 10
    # Each blocking call to the daemon, at most (docker-py's own default is 60 s, longer than
    # a whole sandbox start): a hung daemon fails a start, it does not hold it.
    api_timeout_seconds: float = 10.0


@dataclass(frozen=True)
class KubernetesSettings:
    """DOCBROKER_RUNTIME=kubernetes: one Pod per tenant (broker/runtime/kubernetes/)."""

    namespace: str = "docbroker-tenants"
    kubeconfig: Path | None = None  # None: the in-cluster config (the Pod's ServiceAccount)
    server_image: str = "docbroker-server:latest"
    keeper_image: str = "docbroker-broker:latest"
    image_pull_policy: str = "IfNotPresent"
    # "localhost/<profile path under the kubelet's seccomp root>" or "RuntimeDefault": the
    # latter is a fallback that /readyz and `doctor` report (reports lose seccomp's guard).
    seccomp: str = "RuntimeDefault"
    runtime_class: str | None = None  # e.g. gVisor's or Kata's RuntimeClass
    cpu_limit: str = "1"  # a quantity; start-up is CPU-bound (the SDK import)
    memory_limit: str = "128Mi"
    # The tenants' sources claims: ReadOnlyMany (pushed while the tenant's Pod serves) or
    # ReadWriteOnce (what EBS, Azure Disk, PD offer: the push and the tenant's Pod take turns,
    # and the broker starts no tenant Pod while its push runs).
    sources_access_mode: str = "ReadOnlyMany"


# An image named by its content, `[registry/]name[:tag]@sha256:<64 hex>`: a tag can be moved to
# another image by whoever can push to the registry or import on a node, the digest cannot.
IMAGE_BY_DIGEST_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._/:-]*@sha256:[0-9a-f]{64}")
KUBE_SECCOMP_RE = re.compile(r"RuntimeDefault|localhost/[A-Za-z0-9._/-]{1,200}")
KUBE_QUANTITY_RE = re.compile(r"[0-9]+(\.[0-9]+)?(m|Ki|Mi|Gi|k|M|G)?")
SOURCES_ACCESS_MODES = ("ReadOnlyMany", "ReadWriteOnce")
KUBE_CPU_RE = re.compile(r"[0-9]+(\.[0-9]+)?m?")  # cores or millicores: what the Pod spec computes with


# Descriptors a sandbox's server holds for itself (interpreter, listening socket, event loop,
# the files a tool has open) beside the broker's connections; measured ~20, kept generous.
SANDBOX_OWN_FILES = 64
CONTAINERD_NOFILE = 1024  # the open-file limit of a container in containerd's default spec


class RuntimeKind(StrEnum):
    """The engine sandboxes run on (DOCBROKER_RUNTIME)."""

    DOCKER = "docker"
    KUBERNETES = "kubernetes"
    LOCAL = "local"  # plain processes: insecure, development and tests


@dataclass(frozen=True)
class RuntimeSettings:
    kind: RuntimeKind = RuntimeKind.DOCKER
    # The deployment's name on the engine: its replicas share it (and so their sandboxes);
    # two deployments on one daemon keep apart by it.
    instance: str = "default"
    allow_insecure_local: bool = False
    # Local runtime only: the server command (`--socket PATH` is appended). For tests that put
    # a deliberately hostile server behind the real broker.
    local_command: tuple[str, ...] | None = None
    max_sandboxes: int = 100
    idle_timeout_seconds: float = 600.0
    start_timeout_seconds: float = 20.0
    call_timeout_seconds: float = 30.0
    breaker_threshold: int = 3  # consecutive sandbox failures that open the circuit
    breaker_cooldown_seconds: float = 30.0
    docker: DockerSettings = field(default_factory=DockerSettings)
    kubernetes: KubernetesSettings = field(default_factory=KubernetesSettings)

    @property
    def sandbox_connections(self) -> int:
        """Connections one broker opens to one sandbox at once, at most: below the open-file
        limit its server runs under, less what the server holds itself. Past that limit a
        sandbox cannot accept, and a call on a connection it never accepts waits out its
        deadline (seen with a tenant's `max_concurrent` of 1000 against 256 files)."""
        if self.kind is RuntimeKind.DOCKER:
            return max(8, self.docker.nofile - SANDBOX_OWN_FILES)
        return CONTAINERD_NOFILE - SANDBOX_OWN_FILES  # a Pod: containerd's default limit


@dataclass(frozen=True)
class ApprovalSettings:
    ttl_seconds: int = 900  # how long a pending approval stays open for a human
    token_ttl_seconds: int = 120  # lifetime of a minted token (server accepts at most 300)
    require_distinct_approver: bool = False
    # How long a closed record (expired, denied past its expiry, consumed) is kept for the
    # operators' history before the periodic purge deletes it; open ones are never purged.
    retention_seconds: int = 30 * 86_400


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


def _one_approvals_store(database: DatabaseSettings, *, replicas: int, runtime: RuntimeSettings) -> None:
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


APPROVALS_DB = "approvals.sqlite3"  # in the data dir, without DOCBROKER_DATABASE_URL


@dataclass(frozen=True)
class StoreSettings:
    """Where approvals live: all `docbroker db` needs (`store_from_env`)."""

    data_dir: Path
    database: DatabaseSettings

    @property
    def approvals_db(self) -> Path:
        return self.data_dir / APPROVALS_DB


@dataclass(frozen=True)
class EdgeSettings:
    """What a client must respect before any handler runs (`broker.http_edge`)."""

    read_timeout_seconds: float = 15.0  # a request's head and body must arrive within this
    max_head_bytes: int = 65_536  # request line and headers together; past it, 431
    max_connections: int = 1000  # open client connections; past it, requests get 503


@dataclass(frozen=True)
class PreAuthSettings:
    """How often a client address may fail authentication (`broker.auth.preauth`).

    Each address has a bucket of `burst` failures, refilled at `rate` per second; an empty
    bucket means 429 before any token work. Broker-wide, the first `burst` failures of each
    `interval_seconds` are audited one line each; the others, and every 429, are counted and
    written as one `auth.denied` line per reason at the end of the interval."""

    rate: float = 1.0  # failures per second an address earns back
    burst: int = 20
    interval_seconds: float = 60.0
    max_addresses: int = 4096  # addresses tracked; past it, the others share one bucket
    # Reverse proxies whose X-Forwarded-For names the client (DOCBROKER_TRUSTED_PROXIES); a
    # request from anywhere else is its peer's, whatever it claims.
    trusted_proxies: tuple[IPNetwork, ...] = ()


@dataclass(frozen=True)
class ImageSupplySettings:
    """Where `docbroker image build` keeps an image's SBOM and signed provenance, and the release
    public keys that provenance must be signed with (DESIGN §13, docs/supply-chain.md)."""

    records_dir: Path = Path("var/images")  # DOCBROKER_IMAGE_RECORDS; from the env: <DATA_DIR>/images
    trust_keys: tuple[Path, ...] = ()  # DOCBROKER_IMAGE_TRUST_KEYS: Ed25519 public keys (PEM)


@dataclass(frozen=True)
class Settings:
    data_dir: Path
    policies_dir: Path
    master_key_file: Path
    public_url: str
    host: str
    port: int
    auth: AuthSettings
    audit: AuditSettings
    runtime: RuntimeSettings
    approvals: ApprovalSettings
    max_body_bytes: int = 256 * 1024
    max_response_bytes: int = 32_000
    policy_reload_seconds: float = 2.0  # how often the policy files are checked for a change; 0: SIGHUP only
    edge: EdgeSettings = field(default_factory=EdgeSettings)
    session_ttl_seconds: int = 86_400  # a legacy session id's lifetime from its initialize
    preauth: PreAuthSettings = field(default_factory=PreAuthSettings)
    # Origins a request may carry (DNS rebinding): the public URL's own and any listed.
    allowed_origins: tuple[str, ...] = ()
    # How many replicas serve the deployment: each enforces its share of a tenant's limits.
    replicas: int = 1
    # The operators' bearer tokens for /metrics and /readyz's details (broker/auth/ops.py);
    # None: nobody reads them.
    ops_token_file: Path | None = None
    oidc: OidcSettings | None = None  # approvers sign in with the OpenID Provider (docs/identity.md)
    webhook: WebhookSettings | None = None  # a signed notice of each new pending approval
    # OpenTelemetry spans of /mcp requests, exported by OTLP/HTTP as the OTEL_* variables say
    # (broker/tracing.py, docs/tracing.md)
    tracing: bool = False
    supply: ImageSupplySettings = field(default_factory=ImageSupplySettings)  # the image's records, trust

    @property
    def replica_id(self) -> str:
        """This replica's id (DOCBROKER_REPLICA_ID): in its checkpoints, and for issue 17."""
        return self.audit.replica

    database: DatabaseSettings = field(default_factory=DatabaseSettings)

    @property
    def tenants_dir(self) -> Path:
        return self.data_dir / "tenants"

    @property
    def run_dir(self) -> Path:
        return self.data_dir / "run"

    @property
    def replicas_dir(self) -> Path:
        """What replicas on this host share: liveness locks, last use (broker/runtime/host_replicas.py)."""
        return self.run_dir / ".replicas"

    @property
    def pool_dir(self) -> Path:
        """The warm sandboxes' run dirs, beside the tenants' (".pool" is no DNS label)."""
        return self.run_dir / ".pool"

    @property
    def secrets_dir(self) -> Path:
        return self.data_dir / "secrets"

    @property
    def approvals_db(self) -> Path:
        return self.data_dir / APPROVALS_DB

    @classmethod
    def from_env(
        cls, env: Mapping[str, str] = os.environ, *, reads: list[SettingRead] | None = None
    ) -> Settings:
        """`reads`, when given, receives every variable read, with its type and default: the
        generated reference (docs/operations.md) is made from it, so it cannot drift."""
        r = _Reader(env, reads)
        data_dir = _data_dir(r)
        host = r.text("HOST", "127.0.0.1")
        port = r.integer("PORT", 8080, low=1, high=65535)
        auth = AuthSettings(
            issuer=r.required("AUTH_ISSUER"),
            audience=r.required("AUTH_AUDIENCE"),
            tenant_claim=r.text("AUTH_TENANT_CLAIM", "tenant"),
            groups_claim=r.text("AUTH_GROUPS_CLAIM", "groups"),
            person_claim=r.text("AUTH_PERSON_CLAIM", "sub"),
            tenant_map=_tenant_map(r.optional("AUTH_TENANT_MAP"), "AUTH_TENANT_MAP"),
            jwks_url=r.optional("AUTH_JWKS_URL"),
            jwks_file=r.path("AUTH_JWKS_FILE"),
            algorithms=r.algorithms("AUTH_ALGORITHMS"),
            dev_hs256_secret_file=r.path("AUTH_DEV_HS256_SECRET_FILE"),
            max_lifetime_seconds=r.integer("AUTH_MAX_LIFETIME", 3600, low=60, high=86_400),
            leeway_seconds=r.integer("AUTH_LEEWAY", 10, low=0, high=MAX_LEEWAY_SECONDS),
            max_header_bytes=r.integer("AUTH_MAX_HEADER_BYTES", 8192, low=1024, high=65_536),
        )
        if "#" in auth.issuer:  # a person's Cedar id ends with "#<issuer>" (broker.types.Principal)
            raise SettingsError(f"{PREFIX}AUTH_ISSUER must not hold '#'")
        sources = sum(x is not None for x in (auth.jwks_url, auth.jwks_file, auth.dev_hs256_secret_file))
        if sources != 1:
            raise SettingsError(
                f"{PREFIX}AUTH_JWKS_URL, {PREFIX}AUTH_JWKS_FILE and {PREFIX}AUTH_DEV_HS256_SECRET_FILE: "
                "set exactly one (HS256 dev mode is never mixed with public keys)"
            )
        start_timeout = r.number("START_TIMEOUT", 20.0, low=1, high=600)
        docker = DockerSettings(
            base_url=r.optional("DOCKER_HOST"),
            image=_docker_image(r),
            require_rootless=r.flag("DOCKER_REQUIRE_ROOTLESS", False),
            memory_bytes=r.integer("DOCKER_MEMORY_MB", 128, low=32, high=65_536) * 1024 * 1024,
            nano_cpus=int(r.number("DOCKER_CPUS", 1.0, low=0.05, high=64) * 1e9),
            pids_limit=r.integer("DOCKER_PIDS_LIMIT", 64, low=8, high=4096),
            nofile=r.integer("DOCKER_NOFILE", 256, low=32, high=65_536),
            pool_size=(pool_size := r.integer("DOCKER_POOL_SIZE", 1, low=0, high=32)),
            pool_max=max(pool_size, r.integer("DOCKER_POOL_MAX", 10, low=0, high=64)),
            # Never above the start timeout: one call must not outlast the start it serves.
            api_timeout_seconds=min(r.number("DOCKER_API_TIMEOUT", 10.0, low=1, high=120), start_timeout),
            # Beside the tenant policies unless named: one folder holds every policy file.
            seccomp_profile=Path(
                r.text("DOCKER_SECCOMP_PROFILE", str(_policies_dir(r) / "seccomp.json"))
            ).absolute(),
        )
        kind = RuntimeKind(r.choice("RUNTIME", RuntimeKind.DOCKER.value, tuple(k.value for k in RuntimeKind)))
        kubernetes = _kubernetes_settings(r, by_digest=kind is RuntimeKind.KUBERNETES)
        runtime = RuntimeSettings(
            kind=kind,
            instance=_instance(r),
            allow_insecure_local=r.flag("ALLOW_INSECURE_LOCAL_RUNTIME", False),
            local_command=tuple(shlex.split(r.text("LOCAL_SERVER_COMMAND", ""))) or None,
            max_sandboxes=r.integer("MAX_SANDBOXES", 100, low=1, high=10_000),
            idle_timeout_seconds=r.number("IDLE_TIMEOUT", 600.0, low=1, high=86_400),
            start_timeout_seconds=start_timeout,
            call_timeout_seconds=r.number("CALL_TIMEOUT", 30.0, low=0.1, high=600),
            breaker_threshold=r.integer("BREAKER_THRESHOLD", 3, low=1, high=1000),
            breaker_cooldown_seconds=r.number("BREAKER_COOLDOWN", 30.0, low=0.1, high=3600),
            docker=docker,
            kubernetes=kubernetes,
        )
        edge = EdgeSettings(
            read_timeout_seconds=r.number("READ_TIMEOUT", 15.0, low=0.5, high=600),
            max_head_bytes=r.integer("MAX_HEAD_BYTES", 65_536, low=16 * 1024, high=1024 * 1024),
            max_connections=r.integer("MAX_CONNECTIONS", 1000, low=8, high=1_000_000),
        )
        if edge.max_head_bytes < auth.max_header_bytes + 4096:
            # Or a token the auth layer accepts would be cut at the edge as a 431, not judged.
            raise SettingsError(
                f"{PREFIX}MAX_HEAD_BYTES must exceed {PREFIX}AUTH_MAX_HEADER_BYTES by at least 4096"
            )
        if runtime.kind is RuntimeKind.LOCAL and not runtime.allow_insecure_local:
            raise SettingsError(
                f"{PREFIX}RUNTIME=local runs tenant servers as plain processes without a sandbox; "
                f"set {PREFIX}ALLOW_INSECURE_LOCAL_RUNTIME=1 to accept that (development and tests only)"
            )
        replica = r.optional("REPLICA_ID")
        # Replicas sharing a data dir: each its own chain, key and witness, named by its id.
        own = f"-{replica}" if replica else ""
        public_url = _public_url(r)
        own_origin = origin_of(public_url)
        assert own_origin is not None  # _public_url refuses a URL without one
        replicas = r.integer("REPLICAS", 1, low=1, high=1000)
        database = _database_settings(r)
        _one_approvals_store(database, replicas=replicas, runtime=runtime)
        supply = _image_supply(r, data_dir)
        if runtime.kind is RuntimeKind.KUBERNETES and supply.trust_keys:
            # The node pulls the image there, not the broker: the keys would check nothing.
            raise SettingsError(
                f"{PREFIX}IMAGE_TRUST_KEYS does nothing with {PREFIX}RUNTIME=kubernetes: unset it and "
                "verify signatures at admission (docs/supply-chain-kubernetes.md)"
            )
        return cls(
            data_dir=data_dir,
            policies_dir=_policies_dir(r),
            policy_reload_seconds=r.number("POLICY_RELOAD", 2.0, low=0, high=3600),
            tracing=r.flag("TRACING", False),
            supply=supply,
            master_key_file=_master_key_file(r, data_dir),
            public_url=public_url,
            host=host,
            port=port,
            auth=auth,
            audit=AuditSettings(
                path=Path(r.text("AUDIT_LOG", str(data_dir / f"audit{own}.jsonl"))).absolute(),
                fsync=AuditFsync(r.choice("AUDIT_FSYNC", AuditSettings.fsync, tuple(AuditFsync))),
                fsync_interval_seconds=r.number(
                    "AUDIT_FSYNC_INTERVAL", AuditSettings.fsync_interval_seconds, low=0.01, high=10
                ),
                key_file=Path(r.text("AUDIT_KEY_FILE", str(data_dir / f"audit-signing{own}.key"))).absolute(),
                witness_file=Path(
                    r.text("AUDIT_WITNESS_FILE", str(data_dir / f"audit-witness{own}.jsonl"))
                ).absolute(),
                replica=replica or default_replica_id(),
                checkpoint_every=r.integer(
                    "AUDIT_CHECKPOINT_EVERY", AuditSettings.checkpoint_every, low=1, high=1_000_000
                ),
                checkpoint_interval_seconds=r.number(
                    "AUDIT_CHECKPOINT_INTERVAL",
                    AuditSettings.checkpoint_interval_seconds,
                    low=0.1,
                    high=86_400,
                ),
                rotate_bytes=MIB
                * r.integer("AUDIT_ROTATE_MB", AuditSettings.rotate_bytes // MIB, low=0, high=1024 * 1024),
                keep_files=r.integer("AUDIT_KEEP_FILES", AuditSettings.keep_files, low=0, high=100_000),
                stdout=r.flag("AUDIT_STDOUT", AuditSettings.stdout),
            ),
            runtime=runtime,
            approvals=ApprovalSettings(
                ttl_seconds=r.integer("APPROVAL_TTL", 900, low=30, high=7 * 86_400),
                token_ttl_seconds=r.integer("APPROVAL_TOKEN_TTL", 120, low=10, high=300),
                require_distinct_approver=r.flag("APPROVAL_REQUIRE_DISTINCT_APPROVER", False),
                retention_seconds=r.integer("APPROVAL_RETENTION", 30 * 86_400, low=60, high=3650 * 86_400),
            ),
            max_body_bytes=r.integer("MAX_BODY_BYTES", 256 * 1024, low=16 * 1024, high=16 * 1024 * 1024),
            max_response_bytes=r.integer("MAX_RESPONSE_BYTES", 32_000, low=4_000, high=16 * 1024 * 1024),
            edge=edge,
            session_ttl_seconds=r.integer("SESSION_TTL", 86_400, low=1, high=30 * 86_400),
            preauth=PreAuthSettings(
                rate=r.number("PREAUTH_RATE", 1.0, low=0.01, high=10_000),
                burst=r.integer("PREAUTH_BURST", 20, low=1, high=1_000_000),
                interval_seconds=r.number("PREAUTH_INTERVAL", 60.0, low=0.5, high=3600),
                max_addresses=r.integer("PREAUTH_MAX_ADDRESSES", 4096, low=16, high=1_000_000),
                trusted_proxies=r.networks("TRUSTED_PROXIES"),
            ),
            allowed_origins=r.origins("ALLOWED_ORIGINS", own_origin),
            replicas=replicas,
            ops_token_file=r.path("OPS_TOKEN_FILE"),
            database=database,
            oidc=_oidc_settings(r, public_url),
            webhook=_webhook_settings(r),
        )


def origin_of(url: str) -> str | None:
    """The origin of an http(s) URL as a browser serialises it in `Origin` (RFC 6454): the
    scheme and host in lower case, the port only when it is not the scheme's default."""
    try:
        parts = urllib.parse.urlsplit(url)
        port = parts.port
    except ValueError:
        return None
    scheme, host = parts.scheme.lower(), (parts.hostname or "")
    if scheme not in ("http", "https") or not host or "@" in parts.netloc:
        return None
    if ":" in host:
        host = f"[{host}]"
    default = 80 if scheme == "http" else 443
    return f"{scheme}://{host}" if port in (None, default) else f"{scheme}://{host}:{port}"


def kubernetes_from_env(
    env: Mapping[str, str] = os.environ, *, by_digest: bool = True
) -> tuple[KubernetesSettings, str]:
    """The Kubernetes settings and DOCBROKER_INSTANCE alone, for commands that need no more
    (`docbroker tenant manifest`): an operator's shell has no DOCBROKER_AUTH_* to set.
    `by_digest` False: for a command that makes no Pod (the manifest: volumes and a Secret)."""
    r = _Reader(env)
    instance = _instance(r)
    return _kubernetes_settings(r, by_digest=by_digest), instance


def store_from_env(env: Mapping[str, str] = os.environ) -> StoreSettings:
    """The data dir and the database alone, for `docbroker db` (no auth or runtime settings)."""
    r = _Reader(env)
    return StoreSettings(_data_dir(r), _database_settings(r))


def master_key_file_from_env(env: Mapping[str, str] = os.environ) -> Path:
    """DOCBROKER_MASTER_KEY_FILE, or its default in the data dir (`docbroker tenant manifest`)."""
    r = _Reader(env)
    return _master_key_file(r, _data_dir(r))


def public_url_from_env(env: Mapping[str, str] = os.environ) -> str:
    """DOCBROKER_PUBLIC_URL, or `http://HOST:PORT`, as the broker derives it: where the client
    commands (`docbroker approvals`, `client-config`) reach a broker."""
    return _public_url(_Reader(env))


def policies_dir_from_env(env: Mapping[str, str] = os.environ) -> Path:
    """DOCBROKER_POLICIES_DIR, or its default: the folder `serve` loads, which `docbroker
    policy validate|test|explain` check (an operator validates the set their broker runs)."""
    return _policies_dir(_Reader(env))


def docker_host_from_env(env: Mapping[str, str] = os.environ) -> str | None:
    """DOCBROKER_DOCKER_HOST alone (`docbroker image build`); None: Docker's own default."""
    return _Reader(env).optional("DOCKER_HOST")


def docker_image_from_env(env: Mapping[str, str] = os.environ) -> str:
    """DOCBROKER_DOCKER_IMAGE alone: the image `docbroker image verify` checks by default."""
    return _docker_image(_Reader(env))


def image_supply_from_env(env: Mapping[str, str] = os.environ) -> ImageSupplySettings:
    """DOCBROKER_IMAGE_RECORDS and DOCBROKER_IMAGE_TRUST_KEYS (`docbroker image build|verify`)."""
    r = _Reader(env)
    return _image_supply(r, _data_dir(r))


def _image_supply(r: _Reader, data_dir: Path) -> ImageSupplySettings:
    return ImageSupplySettings(
        records_dir=Path(r.text("IMAGE_RECORDS", str(data_dir / "images"))).absolute(),
        trust_keys=r.paths("IMAGE_TRUST_KEYS"),
    )


def _data_dir(r: _Reader) -> Path:
    return Path(r.text("DATA_DIR", "var")).absolute()


def _policies_dir(r: _Reader) -> Path:
    return Path(r.text("POLICIES_DIR", "policies")).absolute()


def _public_url(r: _Reader) -> str:
    host = r.text("HOST", "127.0.0.1")
    port = r.integer("PORT", 8080, low=1, high=65535)
    url = r.text("PUBLIC_URL", f"http://{host}:{port}").rstrip("/")
    if origin_of(url) is None:
        raise SettingsError(f"{PREFIX}PUBLIC_URL must be an http(s) URL")
    return url


def _instance(r: _Reader) -> str:
    instance = r.text("INSTANCE", "default")
    if not INSTANCE_RE.fullmatch(instance):
        raise SettingsError(f"{PREFIX}INSTANCE must be 1-32 of a-z 0-9 - (a DNS label's characters)")
    return instance


def _docker_image(r: _Reader) -> str:
    return r.text("DOCKER_IMAGE", "docbroker-server:latest")


def _master_key_file(r: _Reader, data_dir: Path) -> Path:
    return Path(r.text("MASTER_KEY_FILE", str(data_dir / "master.key"))).absolute()


def _database_settings(r: _Reader) -> DatabaseSettings:
    return DatabaseSettings(
        url=r.optional("DATABASE_URL"),
        pool_min=r.integer("DATABASE_POOL_MIN", 1, low=0, high=100),
        pool_max=r.integer("DATABASE_POOL_MAX", 10, low=1, high=100),
        pool_timeout_seconds=r.number("DATABASE_POOL_TIMEOUT", 2.0, low=0.1, high=60),
        statement_timeout_seconds=r.number("DATABASE_STATEMENT_TIMEOUT", 2.0, low=0.1, high=60),
        allow_insecure_transport=r.flag("DATABASE_ALLOW_INSECURE_TRANSPORT", False),
        libpq_env=r.libpq(),
    )


@dataclass(frozen=True)
class OidcSettings:
    """Sign-in to /approvals with the organisation's OpenID Provider (broker/web/signin.py).

    Who may approve for which tenant comes from the id_token's claims: `tenant_claim` (a claim
    name, or a dotted path into nested claims) holds values that `tenant_map` turns into tenants;
    when `approver_claim` is set, one of its values must also be `approver_value`.
    """

    issuer: str
    client_id: str
    client_secret_file: Path | None = None  # None: a public client (PKCE alone)
    scopes: str = "openid profile email"
    session_lifetime_seconds: int = 8 * 3600  # from sign-in, whatever the activity
    session_idle_seconds: int = 1800  # since the session's last request
    tenant_claim: str = "groups"
    tenant_map: tuple[tuple[str, str], ...] = ()  # (claim value, tenant), in the order given
    approver_claim: str | None = None
    approver_value: str = "docbroker-approvers"
    # The claim that names the person (as DOCBROKER_AUTH_PERSON_CLAIM does for tokens), and the
    # groups the policy decides on for a signed-in approver, as it does for a token's.
    person_claim: str = "sub"
    groups_claim: str = "groups"
    fetch_timeout_seconds: float = 5.0


_TENANT_LABEL = re.compile(r"[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?")


def _oidc_settings(r: _Reader, public_url: str) -> OidcSettings | None:
    issuer = r.optional("OIDC_ISSUER")
    if issuer is None:
        return None  # no provider: the page takes a pasted bearer token (dev, or behind a proxy)
    # The provider's discovery, keys and token endpoint are fetched from the issuer: over plain
    # http anyone on the path could hand the broker keys of their own and sign in as anyone.
    if origin_of(issuer) is None or not (issuer.startswith("https://") or _loopback(issuer)):
        raise SettingsError(f"{PREFIX}OIDC_ISSUER must be an https URL (http only on loopback)")
    # The session cookie is `__Host-` and Secure: it is set only over https (or on loopback).
    if "#" in issuer:  # OpenID issuers have no fragment; a person's Cedar id ends with "#<issuer>"
        raise SettingsError(f"{PREFIX}OIDC_ISSUER must not hold '#'")
    if not public_url.startswith("https://") and not _loopback(public_url):
        raise SettingsError(f"{PREFIX}OIDC_ISSUER needs an https {PREFIX}PUBLIC_URL")
    scopes = r.text("OIDC_SCOPES", "openid profile email")
    if "openid" not in scopes.split():
        raise SettingsError(f"{PREFIX}OIDC_SCOPES must include openid")
    lifetime = r.integer("OIDC_SESSION_LIFETIME", 8 * 3600, low=5, high=7 * 86_400)
    return OidcSettings(
        issuer=issuer,
        client_id=r.required("OIDC_CLIENT_ID"),
        client_secret_file=r.path("OIDC_CLIENT_SECRET_FILE"),
        scopes=scopes,
        session_lifetime_seconds=lifetime,
        session_idle_seconds=r.integer("OIDC_SESSION_IDLE", min(1800, lifetime), low=5, high=lifetime),
        tenant_claim=r.text("OIDC_TENANT_CLAIM", "groups"),
        tenant_map=_tenant_map(r.optional("OIDC_TENANT_MAP"), "OIDC_TENANT_MAP"),
        approver_claim=r.optional("OIDC_APPROVER_CLAIM"),
        approver_value=r.text("OIDC_APPROVER_VALUE", "docbroker-approvers"),
        person_claim=r.text("OIDC_PERSON_CLAIM", "sub"),
        groups_claim=r.text("OIDC_GROUPS_CLAIM", "groups"),
    )


@dataclass(frozen=True)
class WebhookSettings:
    """Notices of new pending approvals (broker/web/webhooks.py), signed as Standard Webhooks."""

    url: str = field(repr=False)  # may hold a token (Slack's and Teams' URLs do): never logged
    secret_file: Path
    template_file: Path | None = None  # None: the built-in payload (Slack and Teams accept it)
    queue_size: int = 100
    retries: int = 5
    backoff_seconds: float = 1.0  # before the first retry; doubled each time, at most 60
    timeout_seconds: float = 5.0


def _webhook_settings(r: _Reader) -> WebhookSettings | None:
    url = r.optional("WEBHOOK_URL")
    if url is None:
        return None
    parts = urllib.parse.urlsplit(url)
    if not (parts.scheme == "https" or (parts.scheme == "http" and _loopback(url))) or not parts.hostname:
        raise SettingsError(f"{PREFIX}WEBHOOK_URL must be an https URL")
    secret_file = r.path("WEBHOOK_SECRET_FILE")
    if secret_file is None:
        raise SettingsError(f"{PREFIX}WEBHOOK_SECRET_FILE is required with {PREFIX}WEBHOOK_URL")
    return WebhookSettings(
        url=url,
        secret_file=secret_file,
        template_file=r.path("WEBHOOK_TEMPLATE_FILE"),
        queue_size=r.integer("WEBHOOK_QUEUE", 100, low=1, high=100_000),
        retries=r.integer("WEBHOOK_RETRIES", 5, low=0, high=20),
        backoff_seconds=r.number("WEBHOOK_BACKOFF", 1.0, low=0.01, high=60),
        timeout_seconds=r.number("WEBHOOK_TIMEOUT", 5.0, low=0.1, high=60),
    )


def _tenant_map(raw: str | None, name: str) -> tuple[tuple[str, str], ...]:
    """`claim-value=tenant` pairs, by commas (a value may hold `=`: the tenant is after the last)."""
    if raw is None:
        return ()
    pairs = []
    for item in (x.strip() for x in raw.split(",")):
        value, _, tenant = item.rpartition("=")
        if not value or not _TENANT_LABEL.fullmatch(tenant):
            raise SettingsError(f"{PREFIX}{name} must list claim-value=tenant pairs, by commas")
        pairs.append((value, tenant))
    return tuple(pairs)


def _loopback(url: str) -> bool:
    """A broker on this machine only (dev, tests): browsers treat it as a secure context."""
    return urllib.parse.urlsplit(url).hostname in ("127.0.0.1", "localhost", "::1")


def _kubernetes_settings(r: _Reader, *, by_digest: bool) -> KubernetesSettings:
    """`by_digest`: the images must be named by digest (tenant Pods are about to be made from
    them); a broker on another runtime reads the variables without needing them."""
    k = KubernetesSettings(
        namespace=r.text("KUBE_NAMESPACE", "docbroker-tenants"),
        kubeconfig=r.path("KUBECONFIG"),
        server_image=r.text("KUBE_SERVER_IMAGE", "docbroker-server:latest"),
        keeper_image=r.text("KUBE_KEEPER_IMAGE", "docbroker-broker:latest"),
        image_pull_policy=r.choice(
            "KUBE_IMAGE_PULL_POLICY", "IfNotPresent", ("Always", "IfNotPresent", "Never")
        ),
        seccomp=r.text("KUBE_SECCOMP", "RuntimeDefault"),
        runtime_class=r.optional("KUBE_RUNTIME_CLASS"),
        cpu_limit=r.text("KUBE_CPU_LIMIT", "1"),
        memory_limit=r.text("KUBE_MEMORY_LIMIT", "128Mi"),
        sources_access_mode=r.choice("KUBE_SOURCES_ACCESS_MODE", "ReadOnlyMany", SOURCES_ACCESS_MODES),
    )
    if not INSTANCE_RE.fullmatch(k.namespace):
        raise SettingsError(f"{PREFIX}KUBE_NAMESPACE must be a DNS label")
    for name, image in (("KUBE_SERVER_IMAGE", k.server_image), ("KUBE_KEEPER_IMAGE", k.keeper_image)):
        if by_digest and not IMAGE_BY_DIGEST_RE.fullmatch(image):
            raise SettingsError(
                f"{PREFIX}{name} must name the image by digest, name@sha256:<64 hex>, never by a tag "
                "alone: after a push, `docker inspect --format '{{index .RepoDigests 0}}' IMAGE` prints it "
                "(docs/supply-chain-kubernetes.md)"
            )
    if not KUBE_SECCOMP_RE.fullmatch(k.seccomp) or ".." in k.seccomp:
        raise SettingsError(
            f"{PREFIX}KUBE_SECCOMP must be RuntimeDefault or localhost/<profile path on the node>"
        )
    if k.runtime_class is not None and not INSTANCE_RE.fullmatch(k.runtime_class):
        raise SettingsError(f"{PREFIX}KUBE_RUNTIME_CLASS must be a DNS label")
    if not KUBE_CPU_RE.fullmatch(k.cpu_limit):
        raise SettingsError(f"{PREFIX}KUBE_CPU_LIMIT must be a CPU quantity such as 1, 1.5 or 500m")
    if not KUBE_QUANTITY_RE.fullmatch(k.memory_limit):
        raise SettingsError(f"{PREFIX}KUBE_MEMORY_LIMIT must be a Kubernetes quantity such as 128Mi")
    return k


@dataclass(frozen=True)
class SettingRead:
    """One variable as the settings read it: its type, default and bounds (for the reference)."""

    name: str
    kind: str
    default: object = None
    low: float | None = None
    high: float | None = None
    choices: tuple[str, ...] = ()


class _Reader:
    """Typed access to `DOCBROKER_*` variables; every error names the variable only."""

    def __init__(self, env: Mapping[str, str], reads: list[SettingRead] | None = None) -> None:
        self._env = env
        self._reads = reads

    def _note(self, read: SettingRead) -> None:
        # The first, most specific reader names it (text() then calls optional()).
        if self._reads is not None and all(r.name != read.name for r in self._reads):
            self._reads.append(read)

    def optional(self, name: str) -> str | None:
        self._note(SettingRead(PREFIX + name, "text"))
        value = self._env.get(PREFIX + name, "").strip()
        return value or None

    def libpq(self) -> dict[str, str]:
        """The libpq variables that decide where and how a PostgreSQL connection goes."""
        names = ("PGHOST", "PGHOSTADDR", "PGSSLMODE", "PGSERVICE")
        return {name: self._env[name] for name in names if self._env.get(name, "").strip()}

    def text(self, name: str, default: str) -> str:
        self._note(SettingRead(PREFIX + name, "text", default))
        return self.optional(name) or default

    def required(self, name: str) -> str:
        self._note(SettingRead(PREFIX + name, "text (required)"))
        value = self.optional(name)
        if value is None:
            raise SettingsError(f"{PREFIX}{name} is required")
        return value

    def path(self, name: str) -> Path | None:
        self._note(SettingRead(PREFIX + name, "path"))
        value = self.optional(name)
        return Path(value).absolute() if value else None

    def paths(self, name: str) -> tuple[Path, ...]:
        """A comma-separated list of paths; empty when unset. Set to nothing (or commas only),
        it is refused: a list someone set and left empty (`KEYS=` from an unset shell variable)
        must not read as "none wanted" when it turns a check off."""
        self._note(SettingRead(PREFIX + name, "list of paths"))
        if PREFIX + name not in self._env:
            return ()
        items = [x.strip() for x in self._env[PREFIX + name].split(",")]
        if not any(items):
            raise SettingsError(f"{PREFIX}{name} is set but names no file: name one, or unset it")
        return tuple(Path(item).absolute() for item in items if item)

    def integer(self, name: str, default: int, *, low: int, high: int) -> int:
        self._note(SettingRead(PREFIX + name, "integer", default, low, high))
        raw = self.optional(name)
        if raw is None:
            return default
        try:
            value = int(raw)
        except ValueError:
            raise SettingsError(f"{PREFIX}{name} must be an integer") from None
        if not low <= value <= high:
            raise SettingsError(f"{PREFIX}{name} must be between {low} and {high}")
        return value

    def number(self, name: str, default: float, *, low: float, high: float) -> float:
        self._note(SettingRead(PREFIX + name, "number", default, low, high))
        raw = self.optional(name)
        if raw is None:
            return default
        try:
            value = float(raw)
        except ValueError:
            raise SettingsError(f"{PREFIX}{name} must be a number") from None
        if not low <= value <= high:
            raise SettingsError(f"{PREFIX}{name} must be between {low} and {high}")
        return value

    def flag(self, name: str, default: bool) -> bool:
        self._note(SettingRead(PREFIX + name, "flag", default))
        raw = self.optional(name)
        if raw is None:
            return default
        if raw.lower() in ("1", "true", "yes", "on"):
            return True
        if raw.lower() in ("0", "false", "no", "off"):
            return False
        raise SettingsError(f"{PREFIX}{name} must be true or false")

    def choice(self, name: str, default: str, choices: tuple[str, ...]) -> str:
        self._note(SettingRead(PREFIX + name, "choice", default, choices=choices))
        value = self.text(name, default)
        if value not in choices:
            raise SettingsError(f"{PREFIX}{name} must be one of {', '.join(choices)}")
        return value

    def origins(self, name: str, default: str) -> tuple[str, ...]:
        """`default` and a comma-separated list of origins (`scheme://host[:port]`), normalised."""
        self._note(SettingRead(PREFIX + name, "list of origins", default))
        raw = self.optional(name)
        origins = [default]  # the broker's own page is served from there: always allowed
        if raw is None:
            return (default,)
        for item in (x.strip() for x in raw.split(",")):
            origin = origin_of(item) if item else None
            # An origin has no path, query or fragment: one that does is a URL pasted by mistake.
            url_only = urllib.parse.urlsplit(item).path not in ("", "/") or "?" in item or "#" in item
            if origin is None or url_only:
                raise SettingsError(f"{PREFIX}{name} must list origins (https://host[:port]), by commas")
            origins.append(origin)
        return tuple(dict.fromkeys(origins))

    def networks(self, name: str) -> tuple[IPNetwork, ...]:
        """A comma-separated list of IP addresses and networks (`10.0.0.0/8`, `2001:db8::/32`)."""
        self._note(SettingRead(PREFIX + name, "list of networks", ""))
        raw = self.optional(name)
        if raw is None:
            return ()
        found: list[IPNetwork] = []
        for item in (x.strip() for x in raw.split(",")):
            try:
                network = ipaddress.ip_network(item)  # strict: host bits set is a typo, not a range
            except ValueError:
                raise SettingsError(f"{PREFIX}{name} must list IP addresses or networks, by commas") from None
            if network.prefixlen == 0:
                # Everyone a proxy: every client could name any address, and have a fresh budget each.
                raise SettingsError(f"{PREFIX}{name} must not trust every address")
            found.append(network)
        return tuple(dict.fromkeys(found))

    def algorithms(self, name: str) -> tuple[str, ...]:
        self._note(SettingRead(PREFIX + name, "list of algorithms", ",".join(ALLOWED_ALGORITHMS)))
        raw = self.optional(name)
        if raw is None:
            return ALLOWED_ALGORITHMS
        algs = tuple(a.strip() for a in raw.split(",") if a.strip())
        bad = [a for a in algs if a not in ALLOWED_ALGORITHMS]
        if not algs or bad:
            raise SettingsError(f"{PREFIX}{name} may list only {', '.join(ALLOWED_ALGORITHMS)}")
        return algs
