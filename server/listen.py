"""A TCP listening socket opened before uvicorn starts, so that failing to open one is loud.

asyncio's `create_server` skips an address family the kernel (or a seccomp profile) refuses
and serves on zero sockets without a word: a process that looks alive and answers nothing (the
lab's tenant Pod: Running, never Ready, empty log). Opening the socket here turns that into an
OSError the caller reports on stderr, with `why()` saying what it means. Used by the server
and by the reports keeper (`broker/keeper/`).
"""

from __future__ import annotations

import errno
import socket


def parse_host_port(value: str) -> tuple[str, int] | None:
    """`HOST:PORT` (IPv6 in brackets) → (host, port), or None if it is not one."""
    host, _, port = value.rpartition(":")
    if not host or not port.isdigit() or int(port) > 65535:
        return None
    return host.strip("[]"), int(port)


def tcp_listener(host: str, port: int) -> socket.socket:
    """A bound TCP socket (uvicorn listens on it), or the OSError that says why there is none."""
    family, kind, proto, _, address = socket.getaddrinfo(
        host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
    )[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
    except OSError:
        sock.close()
        raise
    return sock


def why(exc: OSError) -> str:
    if isinstance(exc, socket.gaierror):
        return "the host does not resolve"
    name = errno.errorcode.get(exc.errno or 0, "error")
    if exc.errno == errno.EAFNOSUPPORT:
        return (
            f"{name}: IP sockets are refused here (policies/seccomp.json allows only unix "
            "sockets; TCP mode needs policies/seccomp-tcp.json)"
        )
    return name
