"""What makes a Docker sandbox a sandbox: its user, the seccomp profile, and the container
options every sandbox gets, cold or warm (the reasons are in broker/runtime/docker/__init__.py).

Kept apart from the lifecycle (backend.py) so the security options can be read, reviewed and
tested in one place.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from docker.types import LogConfig, Mount, Ulimit

from broker.runtime.base import BackendRefused
from broker.settings import DockerSettings
from broker.types import DaemonMode, SandboxSpec

SANDBOX_UID = 10001
SANDBOX_GID = 10001  # never 0 outside rootless: the host's root group there
DOCS_ROOT = "/srv/docs"
RUN_DIR = "/run/docs"
SECRET_PATH = "/run/secrets/approval.key"  # noqa: S105 - a path, not a secret

Mounts = list[tuple[str, str, bool]]  # (in the sandbox, on the host, read-only)


def load_seccomp_profile(path: Path) -> str:
    """The profile as compact JSON: Docker takes the contents, not a path, over its API."""
    try:
        profile = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise BackendRefused(f"seccomp profile {path} cannot be read as JSON") from exc
    if profile.get("defaultAction") in (None, "SCMP_ACT_ALLOW"):
        # An allow-by-default profile is a deny-list: refuse it rather than run weaker.
        raise BackendRefused(f"seccomp profile {path} must deny by default")
    return json.dumps(profile, separators=(",", ":"))


def sandbox_user(mode: DaemonMode) -> str:
    """The `uid:gid` a sandbox runs as under a daemon of this mode; the gid is 0 only rootless,
    where it maps to the broker user's own gid (see the package docstring)."""
    return f"{SANDBOX_UID}:0" if mode is DaemonMode.ROOTLESS else f"{SANDBOX_UID}:{SANDBOX_GID}"


def in_sandbox_group() -> bool:
    """Can this process read reports and reach sockets through the sandbox's group?"""
    return os.geteuid() == 0 or SANDBOX_GID == os.getegid() or SANDBOX_GID in os.getgroups()


def tenant_mounts(spec: SandboxSpec) -> Mounts:
    """A cold tenant sandbox's folders: sources read-only, the drop-box, the secret as one file."""
    return [
        (f"{DOCS_ROOT}/sources", spec.sources_dir, True),
        (f"{DOCS_ROOT}/reports", spec.dropbox_dir, False),
        (SECRET_PATH, spec.secret_file, True),
        (RUN_DIR, spec.run_dir, False),
    ]


def tenant_environment(tenant: str) -> dict[str, str]:
    return {
        "DOCS_ROOT": DOCS_ROOT,
        "DOCS_SCOPE": tenant,
        "DOCS_SECRET_FILE": SECRET_PATH,  # the path; the secret itself never enters the env
    }


def hardened_options(
    settings: DockerSettings,
    *,
    image: str,
    name: str,
    user: str,
    seccomp_json: str,
    labels: dict[str, str],
    environment: dict[str, str],
    mounts: Mounts,
) -> dict[str, Any]:
    """Every sandbox, cold or warm, gets exactly this hardening; only mounts and env differ.

    `image` is the digest (`sha256:…`) the configured name resolved to, never the name: a tag
    moved between the check and the create cannot change what runs (backend.py, `image()`)."""
    s = settings
    return {
        "image": image,
        "name": name,
        "user": user,
        "environment": environment,
        "labels": labels,
        "mounts": [Mount(target, source, type="bind", read_only=ro) for target, source, ro in mounts],
        "cap_drop": ["ALL"],
        "security_opt": ["no-new-privileges:true", f"seccomp={seccomp_json}"],
        "privileged": False,
        "read_only": True,
        "tmpfs": {"/tmp": f"rw,noexec,nosuid,nodev,size={s.tmpfs_bytes}"},  # noqa: S108 - in the sandbox
        "network_mode": "none",
        "ipc_mode": "none",  # no /dev/shm: the server shares no memory with anyone
        "mem_limit": s.memory_bytes,
        "memswap_limit": s.memory_bytes,  # equal: no swap on top of the memory limit
        "nano_cpus": s.nano_cpus,
        "pids_limit": s.pids_limit,
        "ulimits": [Ulimit(name="nofile", soft=s.nofile, hard=s.nofile)],
        "restart_policy": {"Name": "no"},  # the broker decides when to restart
        "log_config": LogConfig(type="json-file", config={"max-size": "1m", "max-file": "1"}),
        "stop_signal": "SIGTERM",
        "detach": True,
    }
