"""Derive policies/seccomp-tcp.json from policies/seccomp.json: the same profile, plus TCP.

    python policies/seccomp_tcp.py            # rewrite seccomp-tcp.json
    python policies/seccomp_tcp.py --check    # exit 1 if it is stale

seccomp.json lets the server open unix sockets only (the Docker runtime serves MCP on a socket
in a per-tenant folder). On Kubernetes the server listens on the pod network, so this variant
also allows AF_INET and AF_INET6 *stream* sockets with the TCP protocol, and nothing else new:
UDP, raw and every other type of IP socket still fall to the default action (EPERM); other
families keep their EAFNOSUPPORT. The rules on socket(2) are disjoint (one family value each),
so no two of them can match one call. Everything else is seccomp.json's, rule for rule: the
file is generated, and tests/server/test_seccomp_tcp.py fails when it is stale.
"""

from __future__ import annotations

import copy
import json
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
SOURCE = HERE / "seccomp.json"
TARGET = HERE / "seccomp-tcp.json"

AF_UNIX, AF_INET, AF_INET6 = 1, 2, 10
SOCK_STREAM, SOCK_TYPE_MASK = 1, 0xF  # the type's low bits; SOCK_CLOEXEC/SOCK_NONBLOCK above
IPPROTO_TCP = 6
EAFNOSUPPORT = 97
_COMMENT = "TCP variant (policies/seccomp_tcp.py): "


def _arg(index: int, value: int, op: str = "SCMP_CMP_EQ", value_two: int = 0) -> dict[str, Any]:
    return {"index": index, "value": value, "valueTwo": value_two, "op": op}


def _tcp_rules() -> list[dict[str, Any]]:
    allow = [
        {
            "names": ["socket"],
            "action": "SCMP_ACT_ALLOW",
            "args": [
                _arg(0, family),
                _arg(1, SOCK_TYPE_MASK, "SCMP_CMP_MASKED_EQ", SOCK_STREAM),
                _arg(2, protocol),
            ],
            "comment": _COMMENT + "TCP over IPv4/IPv6 (protocol 0 or IPPROTO_TCP): the server "
            "listens on the pod network",
        }
        for family in (AF_INET, AF_INET6)
        for protocol in (0, IPPROTO_TCP)
    ]
    # Every family but unix, IPv4 and IPv6: EAFNOSUPPORT, as in seccomp.json.
    others = [_arg(0, f) for f in range(AF_INET6) if f not in (AF_UNIX, AF_INET)]
    others.append(_arg(0, AF_INET6, "SCMP_CMP_GT"))
    refuse = [
        {
            "names": ["socket"],
            "action": "SCMP_ACT_ERRNO",
            "errnoRet": EAFNOSUPPORT,
            "args": [arg],
            "comment": _COMMENT + "other families: EAFNOSUPPORT",
        }
        for arg in others
    ]
    return allow + refuse


def _is_other_families_rule(rule: dict[str, Any]) -> bool:
    return rule.get("names") == ["socket"] and rule.get("args") == [_arg(0, AF_UNIX, "SCMP_CMP_NE")]


def derive(profile: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(profile)
    rules = out["syscalls"]
    at = [i for i, rule in enumerate(rules) if _is_other_families_rule(rule)]
    if len(at) != 1:
        raise ValueError("seccomp.json no longer has exactly one 'socket: family != AF_UNIX' rule")
    rules[at[0] : at[0] + 1] = _tcp_rules()
    return out


def render(profile: dict[str, Any]) -> str:
    return json.dumps(profile, indent=1) + "\n"  # seccomp.json's own layout


def main(argv: list[str]) -> int:
    text = render(derive(json.loads(SOURCE.read_text())))
    if argv == ["--check"]:
        if TARGET.read_text() != text:
            sys.stderr.write("policies/seccomp-tcp.json is stale: run python policies/seccomp_tcp.py\n")
            return 1
        return 0
    TARGET.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
