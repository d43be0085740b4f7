"""A Pod Security Standards "restricted" check (the v1.30 profile) of a pod spec, plus ours.

Pod Security Admission is what enforces the profile on a cluster, but the lab's 1.20 has none
and a CNI or an admission plugin may be missing anywhere: the broker checks every tenant Pod it
is about to create, and the tests check every pod template in `k8s/`. Input is the JSON form of
the API (camelCase keys, as `kubectl` prints it and as the `kubernetes` client's
`ApiClient().sanitize_for_serialization(pod)` returns it). Anything malformed is a violation,
never an exception: this function decides whether a Pod may be created.

Beyond the standard (DESIGN §7): a read-only root fs, explicit non-zero uid and gid (the host's
root group on a rootful engine is gid 0), cpu and memory limits, and for tenant Pods no service
account token, no service links, and every image named by digest (DESIGN §13: a tag can be
moved to another image on the registry or the node; `name@sha256:…` cannot). `pinned` asks the
last of any spec (the production overlay's Deployment).
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

# The restricted profile's volume types (everything else, hostPath first, is refused).
ALLOWED_VOLUMES = frozenset(
    {
        "configMap",
        "csi",
        "downwardAPI",
        "emptyDir",
        "ephemeral",
        "persistentVolumeClaim",
        "projected",
        "secret",
    }
)
# Keys of a volume entry that are not its source.
_VOLUME_META = frozenset({"name"})
ALLOWED_ADD_CAPABILITIES = frozenset({"NET_BIND_SERVICE"})
ALLOWED_SECCOMP = frozenset({"RuntimeDefault", "Localhost"})
ALLOWED_APPARMOR = frozenset({"RuntimeDefault", "Localhost"})
ALLOWED_SELINUX_TYPES = frozenset(
    {"", "container_t", "container_init_t", "container_kvm_t", "container_engine_t"}
)
# The baseline profile's safe sysctls (v1.30).
SAFE_SYSCTLS = frozenset(
    {
        "kernel.shm_rmid_forced",
        "net.ipv4.ip_local_port_range",
        "net.ipv4.ip_unprivileged_port_start",
        "net.ipv4.tcp_syncookies",
        "net.ipv4.ping_group_range",
        "net.ipv4.ip_local_reserved_ports",
        "net.ipv4.tcp_keepalive_time",
        "net.ipv4.tcp_fin_timeout",
        "net.ipv4.tcp_keepalive_intvl",
        "net.ipv4.tcp_keepalive_probes",
    }
)
APPARMOR_ANNOTATION = "container.apparmor.security.beta.kubernetes.io/"
CONTAINER_LISTS = ("initContainers", "containers", "ephemeralContainers")
IMAGE_BY_DIGEST = re.compile(r"[A-Za-z0-9][A-Za-z0-9._/:-]*@sha256:[0-9a-f]{64}")


@dataclass(frozen=True)
class Violation:
    rule: str  # a stable name, e.g. "hostPath", "capabilities.drop"
    where: str  # "pod", "volumes[data]", "containers[server]"
    message: str

    def __str__(self) -> str:
        return f"{self.where}: {self.rule}: {self.message}"


def check_pod_spec(
    spec: Mapping[str, Any],
    *,
    metadata: Mapping[str, Any] | None = None,
    tenant: bool = False,
    pinned: bool = False,
) -> list[Violation]:
    """Every way `spec` falls short of "restricted" and our extras; empty when it passes.

    `tenant`: the spec is a tenant's sandbox Pod, which must hold no API token and no
    service links (it has no business with the API or with other Services), and name every
    image by digest. `pinned`: every image by digest, for any spec."""
    if not isinstance(spec, Mapping):
        return [Violation("malformed", "pod", "the pod spec is not an object")]
    found = list(_pod_level(spec, tenant))
    found += _apparmor_annotations(_map(metadata))
    pod_ctx = _map(spec.get("securityContext"))
    containers = list(_containers(spec))
    if not any(lst == "containers" for lst, _, _ in containers):
        found.append(Violation("malformed", "pod", "the pod has no containers"))
    for lst, name, container in containers:
        where = f"{lst}[{name}]"
        if not isinstance(container, Mapping):
            found.append(Violation("malformed", where, "the container is not an object"))
            continue
        found += _container(container, pod_ctx, where, lst)
        if (tenant or pinned) and not IMAGE_BY_DIGEST.fullmatch(str(container.get("image", ""))):
            found.append(Violation("image", where, "the image must be named by digest (name@sha256:…)"))
    return found


def _pod_level(spec: Mapping[str, Any], tenant: bool) -> Iterator[Violation]:
    for key in ("hostNetwork", "hostPID", "hostIPC"):
        if spec.get(key) is True:
            yield Violation(key, "pod", f"{key} must not be true")
    ctx = spec.get("securityContext", {})
    if not isinstance(ctx, Mapping):
        yield Violation("malformed", "pod", "securityContext is not an object")
        ctx = {}
    yield from _volumes(spec.get("volumes", []))
    yield from _selinux(ctx.get("seLinuxOptions"), "pod")
    yield from _windows(ctx, "pod")
    for sysctl in _list(ctx.get("sysctls")):
        name = _map(sysctl).get("name")
        if name not in SAFE_SYSCTLS:
            yield Violation("sysctls", "pod", "only the baseline profile's safe sysctls are allowed")
    for gid_key in ("runAsGroup", "fsGroup"):
        if gid_key in ctx and not _positive_int(ctx[gid_key]):
            yield Violation(gid_key, "pod", f"{gid_key} must be a non-zero id")
    if any(not _positive_int(g) for g in _list(ctx.get("supplementalGroups"))):
        yield Violation("supplementalGroups", "pod", "supplementalGroups must not hold gid 0")
    if "runAsUser" in ctx and not _positive_int(ctx["runAsUser"]):
        yield Violation("runAsUser", "pod", "runAsUser must be a non-zero id")
    if spec.get("shareProcessNamespace") is True and tenant:
        yield Violation("shareProcessNamespace", "pod", "a tenant Pod's containers must not see each other")
    if tenant:
        if spec.get("automountServiceAccountToken") is not False:
            yield Violation("automountServiceAccountToken", "pod", "a tenant Pod must not mount an API token")
        if spec.get("enableServiceLinks") is not False:
            yield Violation("enableServiceLinks", "pod", "a tenant Pod must set enableServiceLinks false")


def _volumes(volumes: Any) -> Iterator[Violation]:
    if not isinstance(volumes, list):
        yield Violation("malformed", "pod", "volumes is not a list")
        return
    for volume in volumes:
        v = _map(volume)
        where = f"volumes[{v.get('name', '?')}]"
        sources = [k for k in v if k not in _VOLUME_META]
        if not sources:
            yield Violation("malformed", where, "the volume has no source")
        for source in sources:
            if source == "hostPath":
                yield Violation("hostPath", where, "hostPath volumes are not allowed")
            elif source not in ALLOWED_VOLUMES:
                yield Violation("volumeType", where, f"volume type {source} is not allowed")


def _containers(spec: Mapping[str, Any]) -> Iterator[tuple[str, str, Any]]:
    for lst in CONTAINER_LISTS:
        items = spec.get(lst, [])
        if not isinstance(items, list):
            yield lst, "?", None
            continue
        for item in items:
            yield lst, str(_map(item).get("name", "?")), item


def _container(c: Mapping[str, Any], pod_ctx: Mapping[str, Any], where: str, lst: str) -> list[Violation]:
    found: list[Violation] = []
    ctx = c.get("securityContext", {})
    if not isinstance(ctx, Mapping):
        return [Violation("malformed", where, "securityContext is not an object")]
    if ctx.get("privileged") is True:
        found.append(Violation("privileged", where, "privileged containers are not allowed"))
    if ctx.get("allowPrivilegeEscalation") is not False:
        found.append(Violation("allowPrivilegeEscalation", where, "allowPrivilegeEscalation must be false"))
    if ctx.get("procMount", "Default") != "Default":
        found.append(Violation("procMount", where, "procMount must be Default"))
    if ctx.get("readOnlyRootFilesystem") is not True:
        found.append(Violation("readOnlyRootFilesystem", where, "the root filesystem must be read-only"))
    caps = _map(ctx.get("capabilities"))
    if "ALL" not in _list(caps.get("drop")):
        found.append(Violation("capabilities.drop", where, "capabilities must drop ALL"))
    if any(cap not in ALLOWED_ADD_CAPABILITIES for cap in _list(caps.get("add"))):
        found.append(Violation("capabilities.add", where, "only NET_BIND_SERVICE may be added"))
    found += _effective_ids(ctx, pod_ctx, where)
    found += _seccomp(ctx, pod_ctx, where)
    found += _selinux(ctx.get("seLinuxOptions"), where)
    found += _windows(ctx, where)
    apparmor = _map(ctx.get("appArmorProfile")) or _map(pod_ctx.get("appArmorProfile"))
    if apparmor and apparmor.get("type") not in ALLOWED_APPARMOR:
        found.append(Violation("appArmor", where, "the AppArmor profile must be RuntimeDefault or Localhost"))
    for port in _list(c.get("ports")):
        if _map(port).get("hostPort", 0) not in (0, None):
            found.append(Violation("hostPort", where, "host ports are not allowed"))
    if lst != "ephemeralContainers":  # ephemeral containers take no resources
        limits = _map(_map(c.get("resources")).get("limits"))
        # A limit of 0 is none: the kubelet then sets no CFS quota and no memory cap.
        if not _positive_quantity(limits.get("cpu")) or not _positive_quantity(limits.get("memory")):
            found.append(Violation("limits", where, "cpu and memory limits must be set, above zero"))
    return found


def _effective_ids(ctx: Mapping[str, Any], pod_ctx: Mapping[str, Any], where: str) -> Iterator[Violation]:
    """The container's own setting, else the pod's: what the container actually runs with."""
    non_root = ctx.get("runAsNonRoot", pod_ctx.get("runAsNonRoot"))
    if non_root is not True:
        yield Violation("runAsNonRoot", where, "runAsNonRoot must be true")
    uid = ctx.get("runAsUser", pod_ctx.get("runAsUser"))
    if not _positive_int(uid):
        yield Violation("runAsUser", where, "runAsUser must be set to a non-zero id")
    gid = ctx.get("runAsGroup", pod_ctx.get("runAsGroup"))
    if not _positive_int(gid):
        yield Violation("runAsGroup", where, "runAsGroup must be set to a non-zero id")


def _seccomp(ctx: Mapping[str, Any], pod_ctx: Mapping[str, Any], where: str) -> Iterator[Violation]:
    profile = _map(ctx.get("seccompProfile")) or _map(pod_ctx.get("seccompProfile"))
    kind = profile.get("type")
    if kind not in ALLOWED_SECCOMP:
        yield Violation("seccomp", where, "the seccomp profile must be RuntimeDefault or Localhost")
    elif kind == "Localhost" and not profile.get("localhostProfile"):
        yield Violation("seccomp", where, "a Localhost seccomp profile must name its file")


def _selinux(options: Any, where: str) -> Iterator[Violation]:
    opts = _map(options)
    if opts.get("type", "") not in ALLOWED_SELINUX_TYPES:
        yield Violation("seLinux", where, "the SELinux type is not one the baseline profile allows")
    if opts.get("user") or opts.get("role"):
        yield Violation("seLinux", where, "SELinux user and role must not be set")


def _windows(ctx: Mapping[str, Any], where: str) -> Iterator[Violation]:
    if _map(ctx.get("windowsOptions")).get("hostProcess") is True:
        yield Violation("hostProcess", where, "Windows host process containers are not allowed")


def _apparmor_annotations(metadata: Mapping[str, Any]) -> Iterator[Violation]:
    for key, value in _map(metadata.get("annotations")).items():
        if str(key).startswith(APPARMOR_ANNOTATION) and not (
            value == "runtime/default" or str(value).startswith("localhost/")
        ):
            yield Violation("appArmor", "pod", "AppArmor must be runtime/default or localhost/*")


# A Kubernetes quantity: a decimal number, then an exponent, a decimal SI or a binary suffix.
_QUANTITY = re.compile(r"\+?([0-9]+(?:\.[0-9]*)?|\.[0-9]+)([eE][-+]?[0-9]+|[numkMGTPE]|[KMGTPE]i)?")


def _positive_quantity(value: Any) -> bool:
    """A quantity above zero (as a string, or a number in the JSON form)."""
    if isinstance(value, bool):
        return False
    if isinstance(value, int | float):
        return value > 0
    if not isinstance(value, str):
        return False
    match = _QUANTITY.fullmatch(value)
    return match is not None and float(match.group(1)) > 0


def _positive_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def _map(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []
