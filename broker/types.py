"""Shared names of the broker: who is calling, what a sandbox is, the states things are in.

Interfaces live here; implementations sit beside them in their own packages.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, NewType

# The drop-box (DESIGN §7) lets the sandbox's uid create files and nothing else: write+search,
# no read (cannot list), sticky (cannot remove others' files). Rootless containers run under a
# sub-uid, so "others" is the class that applies to them; in a tenant Pod the folder is the
# keeper's and the server is "others" too. Docker's tenant folders and the Pod's keeper use it.
DROPBOX_MODE = 0o1733

# A tenant's id: a DNS label (server.contracts.TENANT_RE), made one only where it is checked
# (a verified token, a tenant folder, a name the engine gave) and passed on as such.
TenantId = NewType("TenantId", str)


class OAuthScope(StrEnum):
    """An OAuth scope a bearer token grants (never the ASGI `scope` of a request)."""

    DOCS_READ = "docs:read"
    DOCS_WRITE = "docs:write"
    REPORTS_APPROVE = "reports:approve"


@dataclass(frozen=True)
class Person:
    """Who someone is for the broker (DESIGN §12): the issuer that vouches for them, and its
    id for them (the configured person claim, `sub` unless the operator names another). Two
    issuers may give the same id to two people; one person's bearer token and page sign-in
    are one Person only when both name them alike (same issuer, same person claim).

    An issuer of "" is unknown: a requester recorded before issuers were (migration 6). It
    stands for any issuer wherever a wrong guess would let someone through (self-approval)."""

    issuer: str
    id: str

    def may_be(self, other: Person) -> bool:
        """The same person, or possibly so (an unknown issuer on either side)."""
        return self.id == other.id and (self.issuer == other.issuer or "" in (self.issuer, other.issuer))


@dataclass(frozen=True)
class Principal:
    """An authenticated caller: a verified bearer token's (`broker.auth`), or a signed-in
    approver's session (`broker.web`)."""

    tenant: TenantId
    subject: str  # the person's id at `issuer` (the person claim; `sub` by default)
    scopes: frozenset[OAuthScope]
    # The groups or roles the token's groups claim names (DESIGN §14): policy decides on them.
    groups: frozenset[str] = frozenset()
    issuer: str = ""  # who vouches for `subject` ("" only where no token is: policy tests)

    def has(self, scope: OAuthScope) -> bool:
        return scope in self.scopes

    @property
    def person(self) -> Person:
        return Person(self.issuer, self.subject)

    @property
    def entity_id(self) -> str:
        """The Cedar principal's id: `<tenant>/<subject>#<issuer>`. Two people are never one
        entity: an issuer holds no `#` (OpenID issuers have no fragment; settings refuse one),
        so the last `#` splits it off whatever the subject holds."""
        base = f"{self.tenant}/{self.subject}"
        return f"{base}#{self.issuer}" if self.issuer else base


class SandboxState(StrEnum):
    STARTING = "starting"
    RUNNING = "running"
    STOPPED = "stopped"
    FAILED = "failed"


@dataclass(frozen=True)
class Endpoint:
    """Where a sandbox serves MCP Streamable HTTP.

    `uds` set: connect to that unix socket and send `url` (host `localhost`).
    `uds` None: connect to `url` over TCP (the Kubernetes pod network).
    `token`: bearer for the MCP port, sent when set (the tenant's sandbox key).
    `keeper_url`: the tenant's reports keeper, when reports go through one (Kubernetes).
    """

    url: str
    uds: str | None = None
    token: str | None = field(default=None, repr=False)  # a credential: never in a repr or log
    keeper_url: str | None = None


@dataclass(frozen=True)
class SandboxSpec:
    """Everything a backend needs to create one tenant's sandbox. Paths are on the broker's host."""

    tenant: TenantId
    docs_root: str  # holds sources/ (mount read-only) and reports/ (the drop-box: create-only)
    secret_file: str  # the tenant's approval secret, mounted read-only as a file
    run_dir: str  # per-tenant folder that holds the MCP unix socket

    @property
    def sources_dir(self) -> str:
        return f"{self.docs_root}/sources"

    @property
    def dropbox_dir(self) -> str:
        """The sandbox's reports/: it creates files here, the broker moves them out at once."""
        return f"{self.docs_root}/reports"

    @property
    def socket_path(self) -> str:
        return f"{self.run_dir}/mcp.sock"


@dataclass
class SandboxInfo:
    """What the lifecycle knows of one running sandbox."""

    tenant: TenantId
    state: SandboxState
    endpoint: Endpoint | None
    backend_id: str  # container id, pod name, or process id
    started_at: float
    last_used: float
    details: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class RunningSandbox:
    """A sandbox as a caller holds it during a lease: always running, always reachable."""

    tenant: TenantId
    backend_id: str
    endpoint: Endpoint


class DaemonMode(StrEnum):
    """How the sandbox engine isolates the broker's host from a container escape."""

    ROOTLESS = "rootless"
    USERNS_REMAP = "userns-remap"
    ROOTFUL = "rootful"
    NOT_APPLICABLE = "n/a"  # local processes, Kubernetes


class ApprovalState(StrEnum):
    PENDING = "pending"
    APPROVED = "approved"
    DENIED = "denied"
    CONSUMED = "consumed"
    EXPIRED = "expired"


class Outcome(StrEnum):
    """Terminal outcome of a request, as the audit log records it (DESIGN §6)."""

    OK = "ok"
    REJECTED = "rejected"
    FAILED = "failed"
    RESULT_UNKNOWN = "result_unknown"
    WAITING_APPROVAL = "waiting_approval"
    DENIED = "denied"
    ERROR = "error"
