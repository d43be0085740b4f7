"""The broker's one settings object, built once at start-up from `DOCBROKER_*` variables.

One module per group (`server`, `auth`, `oidc`, `webhook`, `approvals`, `audit`, `runtime`,
`kubernetes`, `supply`, `policy`, `tracing`, `limits`; `core` the deployment's folders and key),
each with its dataclass and its reader, and each variable's meaning in the read that fills its
field (`doc=`): docs/operations.md's reference is made from those reads (`docbroker reference`).

Every value is validated when the object is built and every default is named there, so a
misconfigured broker refuses to start with a message that names the variable; so does a
`DOCBROKER_*` variable that nothing reads (a typo), naming the closest setting (`known`).
Nothing reads the environment after start-up; the object is passed down explicitly. A command
that needs only a part (`docbroker db`, `image build`, `tenant manifest`) reads it with
`read_part` and the group's own reader, the very one `Settings.from_env` calls, so a command and
`serve` given one environment read one value (tests/broker/cli/test_settings_alike.py).
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

from broker.settings import core
from broker.settings.approvals import (
    APPROVALS_DB,
    ApprovalSettings,
    DatabaseSettings,
    StoreSettings,
    approval_settings,
    database_settings,
    one_approvals_store,
)
from broker.settings.audit import AuditFsync, AuditSettings, audit_settings, default_replica_id
from broker.settings.auth import ALLOWED_ALGORITHMS, MAX_LEEWAY_SECONDS, AuthSettings, auth_settings
from broker.settings.known import refuse_unknown
from broker.settings.kubernetes import (
    IMAGE_BY_DIGEST_RE,
    KUBE_QUANTITY_RE,
    SOURCES_ACCESS_MODES,
    KubernetesSettings,
    kubernetes_settings,
)
from broker.settings.limits import (
    EdgeSettings,
    LimitSettings,
    PreAuthSettings,
    edge_settings,
    limit_settings,
    preauth_settings,
)
from broker.settings.oidc import OidcSettings, oidc_settings
from broker.settings.policy import PolicySettings, policy_settings
from broker.settings.reader import (
    INSTANCE_RE,
    MIB,
    PREFIX,
    IPNetwork,
    Reader,
    SettingRead,
    SettingsError,
    origin_of,
)
from broker.settings.runtime import (
    DockerSettings,
    RuntimeKind,
    RuntimeSettings,
    docker_host,
    docker_image,
    instance,
    runtime_settings,
)
from broker.settings.server import ServerSettings, public_url, server_settings
from broker.settings.supply import ImageSupplySettings, image_supply
from broker.settings.tracing import TracingSettings, tracing_settings
from broker.settings.webhook import WebhookSettings, webhook_settings

__all__ = [
    "ALLOWED_ALGORITHMS",
    "APPROVALS_DB",
    "EVERY_FEATURE",
    "IMAGE_BY_DIGEST_RE",
    "INSTANCE_RE",
    "KUBE_QUANTITY_RE",
    "MAX_LEEWAY_SECONDS",
    "MIB",
    "PREFIX",
    "SOURCES_ACCESS_MODES",
    "ApprovalSettings",
    "AuditFsync",
    "AuditSettings",
    "AuthSettings",
    "DatabaseSettings",
    "DockerSettings",
    "EdgeSettings",
    "IPNetwork",
    "ImageSupplySettings",
    "KubernetesSettings",
    "LimitSettings",
    "OidcSettings",
    "PolicySettings",
    "PreAuthSettings",
    "Reader",
    "RuntimeKind",
    "RuntimeSettings",
    "ServerSettings",
    "SettingRead",
    "Settings",
    "SettingsError",
    "StoreSettings",
    "TracingSettings",
    "WebhookSettings",
    "default_replica_id",
    "docker_host_from_env",
    "docker_image_from_env",
    "every_read",
    "image_supply_from_env",
    "kubernetes_from_env",
    "master_key_file_from_env",
    "origin_of",
    "policies_dir_from_env",
    "public_url_from_env",
    "read_part",
    "store_from_env",
]


@dataclass(frozen=True)
class Settings:
    data_dir: Path
    policies_dir: Path
    master_key_file: Path
    server: ServerSettings
    auth: AuthSettings
    audit: AuditSettings
    runtime: RuntimeSettings
    approvals: ApprovalSettings
    limits: LimitSettings = field(default_factory=LimitSettings)
    policy: PolicySettings = field(default_factory=PolicySettings)
    edge: EdgeSettings = field(default_factory=EdgeSettings)
    preauth: PreAuthSettings = field(default_factory=PreAuthSettings)
    oidc: OidcSettings | None = None  # approvers sign in with the OpenID Provider (docs/identity.md)
    webhook: WebhookSettings | None = None  # a signed notice of each new pending approval
    tracing: TracingSettings = field(default_factory=TracingSettings)
    supply: ImageSupplySettings = field(default_factory=ImageSupplySettings)  # the image's records, trust
    database: DatabaseSettings = field(default_factory=DatabaseSettings)

    @property
    def replica_id(self) -> str:
        """This replica's id (DOCBROKER_REPLICA_ID): in its checkpoints, and for issue 17."""
        return self.audit.replica

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
        """`reads`, when given, receives every variable read, with its type, default and meaning:
        the generated reference (docs/operations.md) is made from it, so it cannot drift."""
        refuse_unknown(env, every_read)
        return _read(Reader(env, reads))


def _read(r: Reader) -> Settings:
    """Every group, each by its own reader, then the rules that span groups."""
    data_dir = core.data_dir(r)
    policies_dir = core.policies_dir(r)
    server = server_settings(r)
    auth = auth_settings(r)
    runtime = runtime_settings(r, policies_dir)
    edge = edge_settings(r)
    if edge.max_head_bytes < auth.max_header_bytes + 4096:
        # Or a token the auth layer accepts would be cut at the edge as a 431, not judged.
        raise SettingsError(
            f"{PREFIX}MAX_HEAD_BYTES must exceed {PREFIX}AUTH_MAX_HEADER_BYTES by at least 4096"
        )
    database = database_settings(r)
    one_approvals_store(database, replicas=server.replicas, runtime=runtime)
    supply = image_supply(r, data_dir)
    if runtime.kind is RuntimeKind.KUBERNETES and supply.trust_keys:
        # The node pulls the image there, not the broker: the keys would check nothing.
        raise SettingsError(
            f"{PREFIX}IMAGE_TRUST_KEYS does nothing with {PREFIX}RUNTIME=kubernetes: unset it and "
            "verify signatures at admission (docs/supply-chain-kubernetes.md)"
        )
    return Settings(
        data_dir=data_dir,
        policies_dir=policies_dir,
        master_key_file=core.master_key_file(r, data_dir),
        server=server,
        auth=auth,
        audit=audit_settings(r, data_dir),
        runtime=runtime,
        approvals=approval_settings(r),
        limits=limit_settings(r),
        policy=policy_settings(r),
        edge=edge,
        preauth=preauth_settings(r),
        oidc=oidc_settings(r, server.public_url),
        webhook=webhook_settings(r),
        tracing=tracing_settings(r),
        supply=supply,
        database=database,
    )


# An environment with every feature on, so that reading it reads every variable: the names a
# start accepts and the reference's rows come from it. The folders are named so that defaults
# derived from them read as `DATA_DIR/...` rather than as this machine's paths.
EVERY_FEATURE = {
    "DOCBROKER_AUTH_ISSUER": "https://issuer.invalid",
    "DOCBROKER_AUTH_AUDIENCE": "docbroker",
    "DOCBROKER_AUTH_JWKS_FILE": "/jwks.json",
    "DOCBROKER_DATA_DIR": "/DATA_DIR",
    "DOCBROKER_POLICIES_DIR": "/POLICIES_DIR",
    "DOCBROKER_PUBLIC_URL": "http://127.0.0.1:8080",  # its default; loopback is enough for OIDC
    "DOCBROKER_OIDC_ISSUER": "https://idp.invalid",
    "DOCBROKER_OIDC_CLIENT_ID": "docbroker",
    "DOCBROKER_WEBHOOK_URL": "https://hooks.invalid/x",
    "DOCBROKER_WEBHOOK_SECRET_FILE": "/webhook.secret",
}


@functools.cache
def _every_read() -> tuple[SettingRead, ...]:
    reads: list[SettingRead] = []
    _read(Reader(EVERY_FEATURE, reads))
    return tuple(reads)


def every_read() -> list[SettingRead]:
    """Every variable the settings read, as read from `EVERY_FEATURE`."""
    return list(_every_read())


T = TypeVar("T")


def read_part(part: Callable[[Reader], T], env: Mapping[str, str] = os.environ) -> T:
    """One group, read by its own reader as `Settings.from_env` reads it, for a command that
    needs no more: an operator's shell has no DOCBROKER_AUTH_* to set. A variable nothing
    reads is refused here too, as `serve` refuses it."""
    refuse_unknown(env, every_read)
    return part(Reader(env))


# The parts the commands read, each one line over `read_part` (their names are imported).
def kubernetes_from_env(
    env: Mapping[str, str] = os.environ, *, by_digest: bool = True
) -> tuple[KubernetesSettings, str]:
    """The Kubernetes settings and DOCBROKER_INSTANCE (`docbroker tenant manifest`). `by_digest`
    False: for a command that makes no Pod (the manifest: volumes and a Secret)."""
    return read_part(lambda r: (kubernetes_settings(r, by_digest=by_digest), instance(r)), env)


def store_from_env(env: Mapping[str, str] = os.environ) -> StoreSettings:
    """The data dir and the database alone, for `docbroker db` (no auth or runtime settings)."""
    return read_part(lambda r: StoreSettings(core.data_dir(r), database_settings(r)), env)


def master_key_file_from_env(env: Mapping[str, str] = os.environ) -> Path:
    """DOCBROKER_MASTER_KEY_FILE, or its default in the data dir (`docbroker tenant manifest`)."""
    return read_part(lambda r: core.master_key_file(r, core.data_dir(r)), env)


def public_url_from_env(env: Mapping[str, str] = os.environ) -> str:
    """Where the client commands (`docbroker approvals`, `client-config`) reach a broker."""
    return read_part(public_url, env)


def policies_dir_from_env(env: Mapping[str, str] = os.environ) -> Path:
    """The folder `serve` loads, which `docbroker policy validate|test|explain` check."""
    return read_part(core.policies_dir, env)


def docker_host_from_env(env: Mapping[str, str] = os.environ) -> str | None:
    """DOCBROKER_DOCKER_HOST alone (`docbroker image build`); None: Docker's own default."""
    return read_part(docker_host, env)


def docker_image_from_env(env: Mapping[str, str] = os.environ) -> str:
    """DOCBROKER_DOCKER_IMAGE alone: the image `docbroker image verify` checks by default."""
    return read_part(docker_image, env)


def image_supply_from_env(env: Mapping[str, str] = os.environ) -> ImageSupplySettings:
    """DOCBROKER_IMAGE_RECORDS and DOCBROKER_IMAGE_TRUST_KEYS (`docbroker image build|verify`)."""
    return read_part(lambda r: image_supply(r, core.data_dir(r)), env)
