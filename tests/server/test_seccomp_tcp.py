"""policies/seccomp-tcp.json is generated from seccomp.json and adds TCP, nothing else.

The live probes of both profiles are in tests/docker/ (test_docker_isolation.py and its TCP
twin, test_docker_isolation_tcp.py); here the file itself is checked.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
UNIX = json.loads((REPO / "policies" / "seccomp.json").read_text())
TCP = json.loads((REPO / "policies" / "seccomp-tcp.json").read_text())


def test_the_committed_file_is_what_the_generator_writes() -> None:
    check = subprocess.run(
        [sys.executable, str(REPO / "policies" / "seccomp_tcp.py"), "--check"], capture_output=True, text=True
    )
    assert check.returncode == 0, check.stderr


def socket_rules(profile: dict[str, Any]) -> list[dict[str, Any]]:
    return [rule for rule in profile["syscalls"] if "socket" in rule["names"]]


def test_everything_but_socket_is_seccomp_json_rule_for_rule() -> None:
    assert {k: v for k, v in TCP.items() if k != "syscalls"} == {
        k: v for k, v in UNIX.items() if k != "syscalls"
    }
    others = [rule for rule in TCP["syscalls"] if "socket" not in rule["names"]]
    assert others == [rule for rule in UNIX["syscalls"] if "socket" not in rule["names"]]
    assert all(rule["names"] == ["socket"] for rule in socket_rules(TCP))  # socket rules stand alone


def evaluate(profile: dict[str, Any], family: int, kind: int, protocol: int) -> tuple[str, int | None]:
    """What the profile answers socket(family, kind, protocol): every matching rule, as the
    kernel sees it. More than one match would make the outcome depend on libseccomp's order."""
    args = (family, kind, protocol)
    ops = {
        "SCMP_CMP_EQ": lambda a, v, _: a == v,
        "SCMP_CMP_NE": lambda a, v, _: a != v,
        "SCMP_CMP_GT": lambda a, v, _: a > v,
        "SCMP_CMP_MASKED_EQ": lambda a, mask, value: a & mask == value,
    }
    matches = [
        (rule["action"], rule.get("errnoRet"))
        for rule in socket_rules(profile)
        if all(ops[arg["op"]](args[arg["index"]], arg["value"], arg["valueTwo"]) for arg in rule["args"])
    ]
    assert len(matches) <= 1, (family, kind, protocol, matches)
    return matches[0] if matches else (profile["defaultAction"], profile["defaultErrnoRet"])


ALLOW = ("SCMP_ACT_ALLOW", None)
EAFNOSUPPORT = ("SCMP_ACT_ERRNO", 97)
EPERM = ("SCMP_ACT_ERRNO", 1)
SOCK_STREAM, SOCK_DGRAM, SOCK_RAW, SOCK_SEQPACKET = 1, 2, 3, 5
SOCK_NONBLOCK, SOCK_CLOEXEC = 0o4000, 0o2000000


@pytest.mark.parametrize("family", range(64))
def test_only_tcp_is_new(family: int) -> None:
    for kind in (
        SOCK_STREAM,
        SOCK_DGRAM,
        SOCK_RAW,
        SOCK_SEQPACKET,
        SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC,
    ):
        for protocol in (0, 1, 6, 17, 132, 255):
            unix, tcp = evaluate(UNIX, family, kind, protocol), evaluate(TCP, family, kind, protocol)
            is_tcp = family in (2, 10) and kind & 0xF == SOCK_STREAM and protocol in (0, 6)
            if is_tcp:
                assert (unix, tcp) == (EAFNOSUPPORT, ALLOW)
            elif family in (2, 10):
                assert (unix, tcp) == (EAFNOSUPPORT, EPERM)  # refused still (by the default action)
            else:
                assert tcp == unix  # AF_UNIX allowed, every other family EAFNOSUPPORT, as before


def test_the_generator_refuses_a_profile_it_does_not_understand() -> None:
    sys.path.insert(0, str(REPO / "policies"))
    try:
        import seccomp_tcp
    finally:
        sys.path.remove(str(REPO / "policies"))
    changed = json.loads(json.dumps(UNIX))
    changed["syscalls"] = [rule for rule in changed["syscalls"] if rule.get("errnoRet") != 97]
    with pytest.raises(ValueError, match="family != AF_UNIX"):
        seccomp_tcp.derive(changed)
