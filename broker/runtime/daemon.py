"""What a Docker daemon can promise a sandbox, read from `docker info`.

Two questions decide how much a container escape would cost and whether a tenant can starve
the host:

- **Isolation mode.** Rootless: the daemon and every container run under an unprivileged
  host user, so root in a container is that user on the host. userns-remap: containers run
  under sub-ids but the daemon is root. Rootful: container uid 0 is host uid 0.
- **Limits.** Memory, CPU and pids limits need cgroups. A rootless daemon on cgroup v1 has
  none (`CgroupDriver: none`): Docker accepts the limits and silently does not apply them.
  We report that instead of hiding it (DESIGN §7).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from broker.types import DaemonMode


@dataclass(frozen=True)
class DaemonFacts:
    mode: DaemonMode
    version: str
    cgroup_version: str
    cgroup_driver: str
    seccomp: bool
    memory_limit: bool
    cpu_limit: bool
    pids_limit: bool
    warnings: tuple[str, ...]

    @property
    def limits_enforced(self) -> bool:
        return self.memory_limit and self.cpu_limit and self.pids_limit

    def as_dict(self) -> dict[str, Any]:
        return {
            "mode": self.mode.value,
            "engine_version": self.version,
            "cgroup_version": self.cgroup_version,
            "cgroup_driver": self.cgroup_driver,
            "seccomp": self.seccomp,
            "limits_enforced": {"memory": self.memory_limit, "cpu": self.cpu_limit, "pids": self.pids_limit},
        }


def _security_names(info: Mapping[str, Any]) -> set[str]:
    """`SecurityOptions` entries look like "name=seccomp,profile=default" or "name=rootless"."""
    names = set()
    for option in info.get("SecurityOptions") or []:
        for part in str(option).split(","):
            key, _, value = part.partition("=")
            if key == "name":
                names.add(value)
    return names


def daemon_facts(info: Mapping[str, Any], version: str = "") -> DaemonFacts:
    names = _security_names(info)
    if "rootless" in names:
        mode = DaemonMode.ROOTLESS
    elif "userns" in names:
        mode = DaemonMode.USERNS_REMAP
    else:
        mode = DaemonMode.ROOTFUL
    driver = str(info.get("CgroupDriver") or "")
    # No cgroup driver means no cgroups at all: every limit is accepted and ignored.
    cgroups = driver not in ("", "none")
    return DaemonFacts(
        mode=mode,
        version=version or str(info.get("ServerVersion") or ""),
        cgroup_version=str(info.get("CgroupVersion") or ""),
        cgroup_driver=driver or "none",
        seccomp="seccomp" in names,
        memory_limit=cgroups and bool(info.get("MemoryLimit")),
        cpu_limit=cgroups and bool(info.get("CpuCfsQuota")),
        pids_limit=cgroups and bool(info.get("PidsLimit")),
        warnings=tuple(str(w) for w in info.get("Warnings") or []),
    )
