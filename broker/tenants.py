"""Where each tenant's files live on the broker's host, and how a tenant is provisioned.

    <data_dir>/tenants/<tenant>/docs/sources   the tenant's documents (sandbox: read-only)
    <data_dir>/tenants/<tenant>/docs/reports   the drop-box (sandbox: create-only, emptied at once)
    <data_dir>/tenants/<tenant>/reports        the real reports store (never mounted in a sandbox)
    <data_dir>/tenants/<tenant>/quarantine     drops the broker did not accept (never mounted)
    <data_dir>/secrets/<tenant>.key            the tenant's derived approval secret
    <data_dir>/run/<tenant>/mcp.sock           the sandbox's MCP socket

A tenant is known when its policy file exists (policies/tenants/<tenant>.toml).
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path

from broker.master_key import tenant_secret
from broker.settings import Settings
from broker.types import DROPBOX_MODE, SandboxSpec, TenantId
from server.contracts import TENANT_RE


class Tenants:
    def __init__(self, settings: Settings, master_key: bytes) -> None:
        self._settings = settings
        self._master_key = master_key

    def docs_root(self, tenant: str) -> Path:
        return self._settings.tenants_dir / _checked(tenant) / "docs"

    def sources_dir(self, tenant: str) -> Path:
        return self.docs_root(tenant) / "sources"

    def dropbox_dir(self, tenant: str) -> Path:
        return self.docs_root(tenant) / "reports"

    def reports_dir(self, tenant: str) -> Path:
        return self._settings.tenants_dir / _checked(tenant) / "reports"

    def provisioned(self) -> list[str]:
        """The tenants that have folders on this host (known to a policy or not any more)."""
        root = self._settings.tenants_dir
        try:
            names = os.listdir(root)
        except FileNotFoundError:
            return []
        return sorted(n for n in names if TENANT_RE.fullmatch(n) and (root / n).is_dir())

    def secret(self, tenant: str) -> str:
        return tenant_secret(self._master_key, _checked(tenant))

    def provision(self, tenant: str) -> SandboxSpec:
        """Create (idempotently) the folders and secret file a sandbox needs, and describe them."""
        checked = _checked(tenant)
        # The data dir is the barrier against other users of the host. The tenant's folder and
        # docs/ are closed too: a warm sandbox holds its sources and drop-box as descriptors
        # (server/binding.py), and a walk up from them (`..`) must stop at the first folder,
        # whatever Landlock does. Sandboxes never need these folders by path.
        self._settings.data_dir.mkdir(parents=True, exist_ok=True)
        self._settings.data_dir.chmod(0o700)
        for folder in (self.sources_dir(tenant), self.reports_dir(tenant)):
            folder.mkdir(parents=True, exist_ok=True)
        for folder in (self.reports_dir(tenant), self.docs_root(tenant), self.docs_root(tenant).parent):
            folder.chmod(0o700)
        dropbox = self.dropbox_dir(tenant)
        dropbox.mkdir(exist_ok=True)
        dropbox.chmod(DROPBOX_MODE)
        run_dir = self._settings.run_dir / tenant
        run_dir.mkdir(parents=True, exist_ok=True)
        run_dir.chmod(0o1777)  # the sandbox's (sub-)uid creates its socket here; the data dir is private
        secret_file = self._write_secret(tenant)
        return SandboxSpec(
            tenant=checked,
            docs_root=str(self.docs_root(tenant)),
            secret_file=str(secret_file),
            run_dir=str(run_dir),
        )

    def _write_secret(self, tenant: str) -> Path:
        secrets_dir = self._settings.secrets_dir
        secrets_dir.mkdir(parents=True, exist_ok=True)
        secrets_dir.chmod(0o700)
        path = secrets_dir / f"{tenant}.key"
        # A temporary name of this writer's own: replicas sharing the data dir provision the
        # same tenant at the same moment, and one's rename must not take the other's file.
        tmp = secrets_dir / f".{tenant}.key.{os.getpid()}.{secrets.token_hex(4)}.tmp"
        # 0o444: a rootless sandbox reads it under a sub-uid; only this tenant's file is
        # mounted into this tenant's sandbox, and the folder (0o700) is closed to other users.
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o444)
        try:
            with os.fdopen(fd, "w", encoding="ascii") as f:
                f.write(self.secret(tenant))
            os.chmod(tmp, 0o444)
            os.replace(tmp, path)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        return path


def _checked(tenant: str) -> TenantId:
    if not TENANT_RE.fullmatch(tenant):
        raise ValueError("tenant id must be a DNS label")
    return TenantId(tenant)
