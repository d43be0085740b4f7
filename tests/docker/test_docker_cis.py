"""CIS Docker Benchmark v1.6.0, section 5 (container runtime), checked on a live sandbox.

Each test is named after the check it covers. Checks about the host or daemon (sections 1-4)
and those that do not apply to a broker-managed container are left out: 5.1 (swarm), 5.2/5.3
(AppArmor/SELinux: not on these hosts; seccomp + no-new-privs + cap_drop are used instead),
5.27 (health check: the broker probes the socket itself), 5.28 (image pulls: images are
built locally).
"""

from __future__ import annotations

import asyncio
import io
import json
import os
import tarfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import docker.errors
import pytest

from broker.runtime import docker as docker_runtime
from broker.types import DaemonMode
from tests.docker.conftest import Daemon, Layout, connect, remove_instance, unique_tenant, wait_ready

pytestmark = pytest.mark.docker

SENSITIVE = ("/", "/boot", "/dev", "/etc", "/lib", "/proc", "/sys", "/usr", "/var/run", "/run")


@pytest.fixture(scope="module")
def sandbox(daemon: Daemon) -> Iterator[dict[str, Any]]:
    layout = Layout(daemon)
    backend = connect(daemon)
    tenant = layout.tenant(unique_tenant("cis"), {"doc.md": "cis\n"})

    async def start() -> str:
        info = await backend.create(tenant.spec)
        await wait_ready(info)
        return info.backend_id

    container_id = asyncio.run(start())
    client = daemon.client()
    container = client.containers.get(container_id)
    yield {"attrs": container.attrs, "container": container, "backend": backend, "layout": layout}
    remove_instance(daemon, backend._instance)
    client.close()
    asyncio.run(backend.close())
    layout.cleanup()


def host_config(sandbox: dict[str, Any]) -> dict[str, Any]:
    return sandbox["attrs"]["HostConfig"]


def test_cis_5_4_linux_kernel_capabilities_are_restricted(sandbox: dict[str, Any]) -> None:
    hc = host_config(sandbox)
    assert not hc.get("CapAdd")
    assert hc["CapDrop"] == ["ALL"]


def test_cis_5_5_privileged_containers_are_not_used(sandbox: dict[str, Any]) -> None:
    assert host_config(sandbox)["Privileged"] is False


def test_cis_5_6_sensitive_host_system_directories_are_not_mounted(sandbox: dict[str, Any]) -> None:
    mounts = sandbox["attrs"]["Mounts"]
    root = str(sandbox["layout"].root)
    for mount in mounts:
        source = mount["Source"]
        assert source.startswith(root + "/"), source  # only the tenant's own data
        for sensitive in SENSITIVE:
            inside = sensitive != "/" and source.startswith(sensitive + "/")
            assert source != sensitive and not inside, source
    writable = sorted(m["Destination"] for m in mounts if m["RW"])
    assert writable == ["/run/docs", "/srv/docs/reports"]


def test_cis_5_7_sshd_is_not_run_within_containers(sandbox: dict[str, Any]) -> None:
    container = sandbox["container"]
    # From the host's /proc (`docker top` needs cgroups, which a rootless daemon may lack).
    pid = container.attrs["State"]["Pid"]
    cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    assert b"server" in cmdline and not any(b"sshd" in part for part in cmdline)
    tasks = os.listdir(f"/proc/{pid}/task")
    children = [Path(f"/proc/{pid}/task/{tid}/children").read_text().split() for tid in tasks]
    assert not any(children)  # the server alone: no child processes at all
    with pytest.raises(docker.errors.NotFound):
        container.get_archive("/usr/sbin/sshd")


def test_cis_5_8_and_5_9_no_ports_are_mapped_or_open(sandbox: dict[str, Any]) -> None:
    assert not host_config(sandbox).get("PortBindings")
    assert not sandbox["attrs"]["NetworkSettings"].get("Ports")
    assert not sandbox["attrs"]["Config"].get("ExposedPorts")


def test_cis_5_10_host_network_namespace_is_not_shared(sandbox: dict[str, Any]) -> None:
    assert host_config(sandbox)["NetworkMode"] == "none"


def test_cis_5_11_memory_usage_is_limited(sandbox: dict[str, Any], daemon: Daemon) -> None:
    hc = host_config(sandbox)
    assert hc["Memory"] == daemon.settings().memory_bytes
    assert hc["MemorySwap"] == hc["Memory"]  # no swap on top


def test_cis_5_12_cpu_priority_is_set(sandbox: dict[str, Any], daemon: Daemon) -> None:
    assert host_config(sandbox)["NanoCpus"] == daemon.settings().nano_cpus


def test_cis_5_13_root_filesystem_is_read_only(sandbox: dict[str, Any]) -> None:
    hc = host_config(sandbox)
    assert hc["ReadonlyRootfs"] is True
    assert "noexec" in hc["Tmpfs"]["/tmp"] and "nosuid" in hc["Tmpfs"]["/tmp"]


def test_cis_5_14_no_incoming_traffic_on_any_host_interface(sandbox: dict[str, Any]) -> None:
    assert not host_config(sandbox).get("PortBindings")
    assert host_config(sandbox)["PublishAllPorts"] is False


def test_cis_5_15_restart_policy_is_not_always(sandbox: dict[str, Any]) -> None:
    policy = host_config(sandbox)["RestartPolicy"]
    assert policy["Name"] in ("no", "")  # the broker restarts sandboxes, counted and audited
    assert policy.get("MaximumRetryCount", 0) <= 5


def test_cis_5_16_host_process_namespace_is_not_shared(sandbox: dict[str, Any]) -> None:
    assert host_config(sandbox)["PidMode"] in ("", "private")


def test_cis_5_17_host_ipc_namespace_is_not_shared(sandbox: dict[str, Any]) -> None:
    assert host_config(sandbox)["IpcMode"] == "none"


def test_cis_5_18_host_devices_are_not_exposed(sandbox: dict[str, Any]) -> None:
    hc = host_config(sandbox)
    assert not hc.get("Devices")
    assert not hc.get("DeviceRequests")
    assert not hc.get("DeviceCgroupRules")


def test_cis_5_19_default_ulimit_is_overridden(sandbox: dict[str, Any], daemon: Daemon) -> None:
    nofile = daemon.settings().nofile
    assert {"Name": "nofile", "Soft": nofile, "Hard": nofile} in host_config(sandbox)["Ulimits"]


def test_cis_5_20_mount_propagation_is_not_shared(sandbox: dict[str, Any]) -> None:
    for mount in sandbox["attrs"]["Mounts"]:
        assert mount.get("Propagation", "") not in ("shared", "rshared"), mount


def test_cis_5_21_host_uts_namespace_is_not_shared(sandbox: dict[str, Any]) -> None:
    assert host_config(sandbox)["UTSMode"] != "host"


def test_cis_5_22_seccomp_profile_is_not_disabled(sandbox: dict[str, Any]) -> None:
    options = host_config(sandbox)["SecurityOpt"]
    seccomp = [o for o in options if o.startswith("seccomp")]
    assert len(seccomp) == 1 and "unconfined" not in seccomp[0]
    profile = json.loads(seccomp[0].split("=", 1)[1])
    repo = Path(docker_runtime.__file__).resolve().parents[3]
    ours = json.loads((repo / "policies" / "seccomp.json").read_text())
    assert profile == ours
    assert profile["defaultAction"] == "SCMP_ACT_ERRNO"


def test_cis_5_23_and_5_24_no_exec_sessions_privileged_or_as_root(sandbox: dict[str, Any]) -> None:
    # The backend never execs into a sandbox (it has no exec code path at all), so no exec
    # session can be privileged or run as root; the container's own user is not root.
    assert not sandbox["attrs"].get("ExecIDs")
    source = "".join(p.read_text() for p in Path(docker_runtime.__file__).parent.glob("*.py"))
    assert "exec_run" not in source and "exec_create" not in source
    rootless = sandbox["backend"].mode() is DaemonMode.ROOTLESS
    # never root, and never root's group outside rootless (there gid 0 is the broker user's own)
    assert sandbox["attrs"]["Config"]["User"] == ("10001:0" if rootless else "10001:10001")


def test_cis_5_25_cgroup_usage_is_confirmed(sandbox: dict[str, Any]) -> None:
    assert host_config(sandbox)["CgroupParent"] == ""


def test_cis_5_26_container_cannot_acquire_additional_privileges(sandbox: dict[str, Any]) -> None:
    assert "no-new-privileges:true" in host_config(sandbox)["SecurityOpt"]


def test_cis_5_29_pids_cgroup_limit_is_used(sandbox: dict[str, Any], daemon: Daemon) -> None:
    assert host_config(sandbox)["PidsLimit"] == daemon.settings().pids_limit


def test_cis_5_30_default_bridge_docker0_is_not_used(sandbox: dict[str, Any]) -> None:
    assert list(sandbox["attrs"]["NetworkSettings"]["Networks"]) == ["none"]


def test_cis_5_31_host_user_namespace_is_not_shared(sandbox: dict[str, Any]) -> None:
    assert host_config(sandbox)["UsernsMode"] != "host"


def test_cis_5_32_docker_socket_is_not_mounted(sandbox: dict[str, Any]) -> None:
    for mount in sandbox["attrs"]["Mounts"]:
        assert "docker.sock" not in mount["Source"] and "docker.sock" not in mount["Destination"]
    with pytest.raises(docker.errors.NotFound):
        sandbox["container"].get_archive("/var/run/docker.sock")


def test_image_has_no_setuid_binaries(sandbox: dict[str, Any]) -> None:
    """CIS 4.8 (image): setuid/setgid binaries removed — inert under no-new-privs, but gone."""
    stream, _ = sandbox["container"].get_archive("/usr/bin")
    data = io.BytesIO(b"".join(stream))
    with tarfile.open(fileobj=data) as tar:
        setid = [m.name for m in tar.getmembers() if m.isfile() and m.mode & 0o6000]
    assert setid == []
