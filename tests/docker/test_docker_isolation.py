"""What a sandbox shows from the inside (DESIGN §7), probed in a live tenant container.

Each probe is Python run by the container's own interpreter through `docker exec`, which
runs under the container's user, capabilities, no-new-privs and seccomp filter: the same
walls a compromised server would face.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from broker.types import DaemonMode

if TYPE_CHECKING:
    from tests.docker.conftest import LiveSandbox

pytestmark = pytest.mark.docker

STATUS_PROBE = r"""
import json, os
status = dict(line.split(":\t", 1) for line in open("/proc/self/status").read().splitlines() if ":\t" in line)
print(json.dumps({
    "uid": os.getuid(), "euid": os.geteuid(), "gid": os.getgid(), "egid": os.getegid(),
    "groups": [int(g) for g in status.get("Groups", "").split()],
    "CapEff": status["CapEff"].strip(), "CapPrm": status["CapPrm"].strip(),
    "CapBnd": status["CapBnd"].strip(), "CapAmb": status["CapAmb"].strip(),
    "NoNewPrivs": status["NoNewPrivs"].strip(), "Seccomp": status["Seccomp"].strip(),
}))
"""

# errno of each attempt, or "ok"; never raises.
ATTEMPT = r"""
import ctypes, errno, json, os, socket, subprocess
def attempt(fn):
    try:
        fn()
        return "ok"
    except OSError as exc:
        return errno.errorcode.get(exc.errno, str(exc.errno))
    except Exception as exc:
        return type(exc).__name__
libc = ctypes.CDLL(None, use_errno=True)
def raw(nr, *args):
    def call():
        if libc.syscall(nr, *args) == -1:
            e = ctypes.get_errno()
            raise OSError(e, os.strerror(e))
    return call
"""


def assert_sandbox_group(live: LiveSandbox, facts: dict[str, object]) -> None:
    """DESIGN §7: on a rootful engine (and with userns-remap) the sandbox's gid is never 0, the
    host's root group there, and 0 is no supplementary group either. Rootless keeps gid 0: it is
    the broker user's own gid on the host (how the broker reads reports)."""
    if live.backend.mode() is DaemonMode.ROOTLESS:
        assert facts["gid"] == facts["egid"] == 0
        assert facts["groups"] in ([], [0])
    else:
        assert facts["gid"] == facts["egid"] == 10001
        assert facts["groups"] in ([], [10001])
        assert 0 not in facts["groups"]  # type: ignore[operator]


def test_process_identity_and_confinement(live: LiveSandbox) -> None:
    facts = live.probe(STATUS_PROBE)
    assert facts["uid"] == 10001 and facts["euid"] == 10001
    assert_sandbox_group(live, facts)
    for cap in ("CapEff", "CapPrm", "CapBnd", "CapAmb"):
        assert int(facts[cap], 16) == 0, cap
    assert facts["NoNewPrivs"] == "1"
    assert facts["Seccomp"] == "2"  # filter mode


def test_server_process_itself_is_confined(live: LiveSandbox) -> None:
    """PID 1 is the server: check its status, not only the exec'd probe's."""
    facts = live.probe(
        STATUS_PROBE.replace("/proc/self/status", "/proc/1/status")
        .replace(
            '"uid": os.getuid(), "euid": os.geteuid(), "gid": os.getgid(),',
            '"uid": int(status["Uid"].split()[0]), "euid": int(status["Uid"].split()[1]), '
            '"gid": int(status["Gid"].split()[0]), "egid": int(status["Gid"].split()[1]),',
        )
        .replace('"egid": os.getegid(),', "")
    )
    assert facts["uid"] == 10001 and facts["euid"] == 10001
    assert_sandbox_group(live, facts)  # the server itself, not only an exec'd probe
    assert int(facts["CapEff"], 16) == 0 and int(facts["CapBnd"], 16) == 0
    assert facts["NoNewPrivs"] == "1" and facts["Seccomp"] == "2"


# Imports what the server imports, with the server's flags, and lists every loaded module that
# has no optimised cache in the image.
BYTECODE_PROBE = r"""
import importlib, importlib.util, json, os, pkgutil, sys
import server
importlib.import_module("server.__main__")
for info in pkgutil.walk_packages(server.__path__, "server."):
    importlib.import_module(info.name)
files = {name: getattr(module, "__file__", None) or "" for name, module in list(sys.modules.items())}
sources = {name: path for name, path in files.items() if path.endswith(".py")}
missing = sorted(n for n, p in sources.items() if not os.path.exists(importlib.util.cache_from_source(p)))
print(json.dumps({"optimize": sys.flags.optimize, "sources": len(sources), "missing": missing}))
"""


def test_server_runs_optimized_from_build_time_bytecode(live: LiveSandbox) -> None:
    """PID 1 runs with -OO, and all it imports has opt-2 bytecode from the image build: the
    root fs is read-only, so a missing cache would mean compiling from source at every start."""
    pid1 = live.probe('import json; print(json.dumps({"argv": open("/proc/1/cmdline").read().split("\\0")}))')
    assert pid1["argv"][:4] == ["/opt/venv/bin/python", "-OO", "-m", "server"]
    facts = live.probe(BYTECODE_PROBE, flags=("-B", "-OO"))
    assert facts["optimize"] == 2
    assert facts["sources"] > 300  # the SDK, pydantic, starlette, uvicorn and the stdlib
    assert facts["missing"] == []


def test_filesystem_walls(live: LiveSandbox) -> None:
    facts = live.probe(
        ATTEMPT
        + r"""
def create(path):
    return lambda: os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
PACKAGE_MANAGERS = ("/usr/bin/apt-get", "/usr/bin/dpkg", "/opt/venv/bin/pip", "/usr/bin/pip3")
print(json.dumps({
    "rootfs_etc": attempt(create("/etc/evil")),
    "rootfs_venv": attempt(create("/opt/venv/evil.py")),
    "rootfs_root": attempt(create("/evil")),
    "sources_new": attempt(create("/srv/docs/sources/new.md")),
    "sources_overwrite": attempt(lambda: os.close(os.open("/srv/docs/sources/notes.md", os.O_WRONLY))),
    "secret_write": attempt(lambda: os.close(os.open("/run/secrets/approval.key", os.O_WRONLY))),
    "tmp_file": attempt(create("/tmp/scratch")),
    "chmod_tmp_600": attempt(lambda: os.chmod("/tmp/scratch", 0o600)),
    "chown_tmp": attempt(lambda: os.chown("/tmp/scratch", 10001, 10001)),
    "unlink_tmp": attempt(lambda: os.unlink("/tmp/scratch")),
    "docker_sock": os.path.exists("/var/run/docker.sock") or os.path.exists("/run/docker.sock"),
    "sshd": os.path.exists("/usr/sbin/sshd"),
    "shell": os.path.exists("/bin/sh") or os.path.exists("/usr/bin/bash"),
    "package_manager": any(os.path.exists(p) for p in PACKAGE_MANAGERS),
}))
"""
    )
    assert facts["rootfs_etc"] == "EROFS"
    assert facts["rootfs_venv"] == "EROFS"
    assert facts["rootfs_root"] == "EROFS"
    assert facts["sources_new"] == "EROFS"
    assert facts["sources_overwrite"] in ("EROFS", "EACCES")
    assert facts["secret_write"] in ("EROFS", "EACCES")
    assert facts["tmp_file"] == "ok"  # the one scratch place
    assert facts["chmod_tmp_600"] == "EPERM"  # seccomp, even on its own file
    assert facts["chown_tmp"] == "EPERM"
    assert facts["unlink_tmp"] == "EPERM"
    assert facts["docker_sock"] is False
    assert facts["sshd"] is False
    assert facts["shell"] is False
    assert facts["package_manager"] is False


def test_tmp_is_noexec(live: LiveSandbox) -> None:
    facts = live.probe(
        ATTEMPT
        + r"""
import shutil
# A copy of a real binary, executable bits set at creation (chmod is not allowed).
src = open("/usr/bin/true", "rb").read()
fd = os.open("/tmp/true", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o750)
os.write(fd, src); os.close(fd)
print(json.dumps({
    "mode": oct(os.stat("/tmp/true").st_mode & 0o777),
    "exec_tmp": attempt(lambda: subprocess.run(["/tmp/true"], check=True)),
    "exec_usr": attempt(lambda: subprocess.run(["/usr/bin/true"], check=True)),
}))
"""
    )
    assert facts["mode"] == "0o750"
    assert facts["exec_tmp"] == "EACCES"  # noexec mount
    assert facts["exec_usr"] == "ok"  # so it is the mount, not exec in general


def test_network_only_loopback(live: LiveSandbox) -> None:
    facts = live.probe(
        ATTEMPT
        + r"""
ifaces = [line.split(":")[0].strip() for line in open("/proc/net/dev").read().splitlines()[2:]]
print(json.dumps({
    "ifaces": ifaces,
    "inet": attempt(lambda: socket.socket(socket.AF_INET, socket.SOCK_STREAM).close()),
    "inet_dgram": attempt(lambda: socket.socket(socket.AF_INET, socket.SOCK_DGRAM).close()),
    "inet6": attempt(lambda: socket.socket(socket.AF_INET6, socket.SOCK_STREAM).close()),
    "netlink": attempt(lambda: socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, 0).close()),
    "packet": attempt(lambda: socket.socket(socket.AF_PACKET, socket.SOCK_RAW, 0).close()),
    "unix": attempt(lambda: socket.socket(socket.AF_UNIX, socket.SOCK_STREAM).close()),
}))
"""
    )
    assert facts["ifaces"] == ["lo"]
    for family in ("inet", "inet_dgram", "inet6", "netlink", "packet"):
        assert facts[family] == "EAFNOSUPPORT", family
    assert facts["unix"] == "ok"


def test_dangerous_syscalls_denied(live: LiveSandbox) -> None:
    facts = live.probe(
        ATTEMPT
        + r"""
import platform
x86 = platform.machine() == "x86_64"
NR = {  # x86_64, aarch64
    "unshare": (272, 97), "setns": (308, 268), "ptrace": (101, 117), "mount": (165, 40),
    "keyctl": (250, 219), "bpf": (321, 280), "userfaultfd": (323, 282), "perf_event_open": (298, 241),
    "personality": (135, 92), "io_uring_setup": (425, 425), "fchmodat2": (452, 452),
    "setuid": (105, 146), "chroot": (161, 51),
}
CLONE_NEWUSER = 0x10000000
args = {"unshare": (CLONE_NEWUSER,), "setns": (0, 0), "ptrace": (0, 0, 0, 0), "mount": (0, 0, 0, 0, 0),
        "keyctl": (0,), "bpf": (0, 0, 0), "userfaultfd": (0,), "perf_event_open": (0, 0, -1, -1, 0),
        "personality": (0xffffffff,), "io_uring_setup": (1, 0), "fchmodat2": (-100, b"/tmp", 0o777, 0),
        "setuid": (0,), "chroot": (b"/tmp",)}
out = {name: attempt(raw(nr[0] if x86 else nr[1], *args[name])) for name, nr in NR.items()}
# threads still work: clone3 gets ENOSYS, glibc falls back to the filtered clone(2)
import threading
t = threading.Thread(target=lambda: None); t.start(); t.join()
out["threads"] = "ok"
print(json.dumps(out))
"""
    )
    for name, result in facts.items():
        if name == "threads":
            assert result == "ok"
        else:
            assert result == "EPERM", (name, result)


def test_dropbox_is_create_only(live: LiveSandbox) -> None:
    """New files can be created; nothing there can be listed, read, changed or removed."""
    host_file = live.tenant.dropbox / "placed-by-host.md"
    host_file.write_text("a report already accepted\n")
    host_file.chmod(0o600)
    os.chown(host_file, live.daemon.owner_uid, live.daemon.owner_gid)
    facts = live.probe(
        ATTEMPT
        + r"""
D = "/srv/docs/reports/"
def create(name):
    def go():
        fd = os.open(D + name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o040)
        os.write(fd, b"sandbox bytes"); os.close(fd)
    return go
out = {"create": attempt(create("mine.md")), "list": attempt(lambda: os.listdir(D))}
for who in ("mine.md", "placed-by-host.md"):
    out[who] = {
        "read": attempt(lambda: os.close(os.open(D + who, os.O_RDONLY))),
        "write": attempt(lambda: os.close(os.open(D + who, os.O_WRONLY))),
        "truncate": attempt(lambda: os.close(os.open(D + who, os.O_WRONLY | os.O_TRUNC))),
        "recreate": attempt(create(who)),
        "unlink": attempt(lambda: os.unlink(D + who)),
        "rename": attempt(lambda: os.rename(D + who, D + "x.md")),
        "link": attempt(lambda: os.link(D + who, D + "y.md")),
        "chmod_600": attempt(lambda: os.chmod(D + who, 0o600)),
        "chmod_666": attempt(lambda: os.chmod(D + who, 0o666)),
    }
out["mine_mode_after"] = oct(os.stat(D + "mine.md").st_mode & 0o7777)
out["mine_read_after_chmod"] = attempt(lambda: os.close(os.open(D + "mine.md", os.O_RDONLY)))
print(json.dumps(out))
"""
    )
    assert facts["create"] == "ok"
    assert facts["list"] == "EACCES"
    for who in ("mine.md", "placed-by-host.md"):
        f = facts[who]
        assert f["read"] == "EACCES", who
        assert f["write"] == "EACCES", who
        assert f["truncate"] == "EACCES", who
        assert f["recreate"] == "EEXIST", who
        assert f["unlink"] == "EPERM", who
        assert f["rename"] == "EPERM", who
        assert f["link"] == "EPERM", who
        assert f["chmod_600"] == "EPERM", who
    # uvicorn's chmod(…, 0o666) is answered "ok" by the filter but changes nothing.
    assert facts["mine_mode_after"] == "0o40"
    assert facts["mine_read_after_chmod"] == "EACCES"
    # The host still has both files, intact.
    assert host_file.read_text() == "a report already accepted\n"
    assert (live.tenant.dropbox / "mine.md").read_bytes() == b"sandbox bytes"


def test_report_moved_out_is_gone_from_the_sandbox(live: LiveSandbox) -> None:
    """The drop-box design: once the broker moves a report, the sandbox has no path to it."""
    exit_code, out = live.run_python(
        "import os; fd = os.open('/srv/docs/reports/r.md', os.O_WRONLY|os.O_CREAT|os.O_EXCL, 0o040);"
        "os.write(fd, b'approved'); os.close(fd)"
    )
    assert exit_code == 0, out
    dropped = live.tenant.dropbox / "r.md"
    (live.tenant.reports / "r.md").write_bytes(dropped.read_bytes())
    dropped.unlink()  # what the broker does after the sha256 check
    facts = live.probe(
        ATTEMPT
        + r"""
print(json.dumps({
    "read": attempt(lambda: open("/srv/docs/reports/r.md", "rb").read()),
    "store_visible": any(os.path.exists(p) for p in ("/srv/reports", "/srv/docs/../reports/r.md")),
}))
"""
    )
    assert facts["read"] == "ENOENT"
    assert facts["store_visible"] is False


def test_cross_tenant_no_path(live_factory: Callable[..., LiveSandbox]) -> None:
    a = live_factory(files={"a.md": "tenant a\n"})
    b = live_factory(files={"b.md": "tenant b secret\n"})
    spec = b.tenant.spec
    b_paths = [spec.sources_dir, spec.dropbox_dir, spec.secret_file, spec.run_dir]
    facts = a.probe(
        ATTEMPT
        + f"""
paths = {b_paths!r}
mountinfo = open("/proc/self/mountinfo").read()
print(json.dumps({{
    "exists": [os.path.exists(p) for p in paths],
    "b_in_mounts": {b.tenant.spec.tenant!r} in mountinfo,
    "a_in_mounts": {a.tenant.spec.tenant!r} in mountinfo,
    "sources": sorted(os.listdir("/srv/docs/sources")),
    "secret_len": len(open("/run/secrets/approval.key").read().strip()),
}}))
"""
    )
    assert facts["exists"] == [False] * 4
    assert facts["b_in_mounts"] is False
    assert facts["a_in_mounts"] is True
    assert facts["sources"] == ["a.md"]
    assert facts["secret_len"] == 64
    # A's secret is A's: B's container holds a different one.
    assert a.tenant.secret != b.tenant.secret


def test_socket_and_reports_open_to_broker_user_only(live: LiveSandbox) -> None:
    sock = Path(live.tenant.spec.socket_path)
    mode = stat.S_IMODE(sock.lstat().st_mode)
    assert stat.S_ISSOCK(sock.lstat().st_mode)
    assert mode & 0o007 == 0, oct(mode)  # no access for other users of the host
    assert mode & 0o060 == 0o060, oct(mode)  # the broker's group may connect
