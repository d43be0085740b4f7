"""Landlock: a pooled sandbox locks itself to one tenant's folders before it serves anyone.

A pooled sandbox (see `server/binding.py`) gets its tenant's folders as descriptors passed by
the broker, not as bind mounts. A passed directory descriptor lives in the host's file tree,
so `openat(fd, "..")` walks out of it. Landlock (Linux 5.13+, unprivileged) closes that: once
`restrict()` returns, this process and any thread or child it makes can only

- read and execute beneath the container's own root (the image, /proc, the run dir),
- read beneath the tenant's sources,
- create and write new files beneath the tenant's drop-box,
- create its MCP socket in the run dir,

and nothing else: no write, truncate, link, rename or remove anywhere, no TCP bind or connect,
no signals or abstract sockets outside itself. The host directories above the passed folders
are outside every rule, so a walk up from them is refused whatever their modes say.

Landlock applies to the calling thread only, so `restrict()` refuses to run while another
thread exists. The kernel call fails closed: an unsupported kernel raises `LandlockError`.
"""

from __future__ import annotations

import ctypes
import os
import threading
from dataclasses import dataclass

from server.syscalls import prctl, raw_syscall

# System call numbers: the same on x86_64 and aarch64 (the "generic" table).
_SYS_CREATE_RULESET = 444
_SYS_ADD_RULE = 445
_SYS_RESTRICT_SELF = 446
_CREATE_RULESET_VERSION = 1 << 0
_RULE_PATH_BENEATH = 1
_PR_SET_NO_NEW_PRIVS = 38

# Filesystem rights (include/uapi/linux/landlock.h) and the ABI version that added each.
EXECUTE = 1 << 0
WRITE_FILE = 1 << 1
READ_FILE = 1 << 2
READ_DIR = 1 << 3
REMOVE_DIR = 1 << 4
REMOVE_FILE = 1 << 5
MAKE_CHAR = 1 << 6
MAKE_DIR = 1 << 7
MAKE_REG = 1 << 8
MAKE_SOCK = 1 << 9
MAKE_FIFO = 1 << 10
MAKE_BLOCK = 1 << 11
MAKE_SYM = 1 << 12
REFER = 1 << 13  # ABI 2
TRUNCATE = 1 << 14  # ABI 3
_FS_BY_ABI = {1: (1 << 13) - 1, 2: (1 << 14) - 1, 3: (1 << 15) - 1}
# IOCTL_DEV (ABI 5) stays unhandled: a device ioctl is no way out of a folder, and the server
# opens no device after it is confined.
_NET_TCP = 0b11  # bind and connect, ABI 4
_SCOPES = 0b11  # abstract unix sockets and signals, ABI 6
# 1 is the oldest kernel (5.13) with a usable sandbox; 2 adds REFER, without which a rename
# into or out of a folder could not be refused.
MIN_ABI = 2


class LandlockError(Exception):
    """The kernel cannot confine this process: the pooled sandbox must not serve anyone."""


class _RulesetAttr(ctypes.Structure):
    _fields_ = [
        ("handled_access_fs", ctypes.c_uint64),
        ("handled_access_net", ctypes.c_uint64),
        ("scoped", ctypes.c_uint64),
    ]


class _PathBeneathAttr(ctypes.Structure):
    _pack_ = 1  # the kernel's struct is packed: 12 bytes
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


@dataclass(frozen=True)
class Rule:
    """Rights granted beneath one directory, named by an open descriptor (any open mode)."""

    dir_fd: int
    access: int


def abi_version() -> int:
    """The kernel's Landlock ABI version; 0 when it has none (or seccomp hides it)."""
    result = raw_syscall(_SYS_CREATE_RULESET, None, ctypes.c_long(0), ctypes.c_long(_CREATE_RULESET_VERSION))
    return max(result, 0)


def restrict(rules: list[Rule]) -> int:
    """Confine this process to `rules` for good; returns the ABI version used.

    Everything the kernel's ABI can handle is handled: a right not granted by a rule is denied.
    """
    abi = abi_version()
    if abi < MIN_ABI:
        raise LandlockError(f"the kernel offers Landlock ABI {abi}; at least {MIN_ABI} is needed")
    if _thread_count() != 1:
        raise LandlockError("Landlock would not cover the other threads of this process")
    handled_fs = _FS_BY_ABI[min(abi, 3)]
    attr = _RulesetAttr(
        handled_access_fs=handled_fs,
        handled_access_net=_NET_TCP if abi >= 4 else 0,
        scoped=_SCOPES if abi >= 6 else 0,
    )
    # Older kernels reject fields they do not know unless they are cut off the struct.
    size = ctypes.sizeof(ctypes.c_uint64) * (3 if abi >= 6 else 2 if abi >= 4 else 1)
    ruleset = _checked(
        raw_syscall(_SYS_CREATE_RULESET, ctypes.byref(attr), ctypes.c_long(size), ctypes.c_long(0)),
        "create a ruleset",
    )
    try:
        for rule in rules:
            beneath = _PathBeneathAttr(allowed_access=rule.access & handled_fs, parent_fd=rule.dir_fd)
            _checked(
                raw_syscall(
                    _SYS_ADD_RULE,
                    ctypes.c_long(ruleset),
                    ctypes.c_long(_RULE_PATH_BENEATH),
                    ctypes.byref(beneath),
                    ctypes.c_long(0),
                ),
                "add a rule",
            )
        # Docker's no-new-privileges has set it already; the kernel insists on it either way.
        _checked(prctl(_PR_SET_NO_NEW_PRIVS, 1), "set no_new_privs")
        _checked(raw_syscall(_SYS_RESTRICT_SELF, ctypes.c_long(ruleset), ctypes.c_long(0)), "restrict itself")
    finally:
        os.close(ruleset)
    return abi


def _thread_count() -> int:
    """The kernel's count (native threads too), or Python's where /proc cannot be read."""
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("Threads:"):
                    return int(line.split()[1])
    except (OSError, ValueError):
        pass
    return threading.active_count()


def _checked(result: int, what: str) -> int:
    if result < 0:
        raise LandlockError(f"Landlock could not {what} ({os.strerror(-result)})")
    return result
