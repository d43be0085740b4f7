"""Binding a pooled sandbox to one tenant: the broker passes the tenant's folders as descriptors.

A sandbox's start-up is almost all Python importing the MCP SDK (~1 s). A pooled sandbox
does that before any tenant needs it, with no tenant files mounted, then waits on a unix
socket in its run dir. When a tenant's first call comes, the broker connects and sends one
message:

    {"v": 1, "scope": "<tenant>"}   + SCM_RIGHTS [sources dir, drop-box dir, secret file]

The socket sits in the slot's run dir, inside the broker's private data dir: only the broker
(and root) can reach it. The sandbox checks the descriptors, reads the secret, locks itself to
those folders with Landlock (`server/landlock.py`), and only then answers `{"ok": true}`; any
failure, Landlock's included, answers `{"ok": false, "error": ...}` so the broker can start
that tenant's sandbox cold instead. The socket is closed for good either way: one binding per
life, and a refused binding ends the sandbox. Its MCP socket opens after the lock-down, so
nothing the tenant sends is ever handled by an unconfined process; it is listening before the
answer goes, so the broker needs no wait (and no Docker inspect) for it after the answer.

Both sides live here so the wire format is written once.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import stat
import time
from dataclasses import dataclass

from server import landlock
from server.config import ConfigError, secret_from_fd
from server.contracts import TENANT_RE
from server.syscalls import prctl

VERSION = 1
MAX_MESSAGE_BYTES = 512
FD_COUNT = 3  # sources, drop-box, secret: in this order
_PR_SET_DUMPABLE = 4


class BindingError(Exception):
    """A binding was refused; the message names the problem, never a value."""


@dataclass(frozen=True)
class Binding:
    tenant: str  # the message's "scope" key (the wire format above)
    sources_fd: int
    reports_fd: int
    secret: str

    def __repr__(self) -> str:  # the secret must never reach a log through a repr
        return f"Binding(tenant={self.tenant!r}, sources_fd={self.sources_fd}, reports_fd={self.reports_fd})"


# --- the sandbox's side -------------------------------------------------------------------------


def listen(path: str) -> socket.socket:
    """The binding socket. Listen only once warm: an accepting socket is how the broker knows."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(path)
    sock.listen(16)  # room for the broker's readiness probes queued beside the binding
    return sock


def accept_binding(
    listener: socket.socket, *, run_dir: str, serve_at: str | None = None, read_timeout: float = 5.0
) -> tuple[Binding, socket.socket | None]:
    """Wait for the broker, take one binding, confine this process to it, answer, and close.

    With `serve_at`, the MCP socket is bound and listening there (returned with the binding)
    after the lock-down and before the answer: the broker's wait for the MCP socket ends at
    the answer, with no polls and no Docker inspects meanwhile, and the first request waits in
    the socket's backlog while the server is built, instead of the broker retrying a connect.

    A connection closed without a byte is a readiness probe (the broker's `_uds_accepts`):
    it is not a binding, and the wait goes on.
    """
    with listener:
        while True:
            conn, _ = listener.accept()
            with conn:
                conn.settimeout(read_timeout)
                try:
                    binding = _receive(conn)
                    confine(binding, run_dir=run_dir)
                    serving = serve_socket(serve_at) if serve_at is not None else None
                except _Probe:
                    continue
                except (BindingError, landlock.LandlockError) as exc:
                    _answer(conn, {"ok": False, "error": str(exc)})
                    raise
                _answer(conn, {"ok": True})
                return binding, serving


def serve_socket(path: str, backlog: int = 2048) -> socket.socket:
    """The MCP unix socket, listening (uvicorn serves it once started), made as uvicorn makes
    its own `uds` (a stale one replaced, chmod 0666). Raises BindingError when it cannot be
    made: the sandbox must not serve."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        if os.path.lexists(path):  # asked first: in the sandbox unlink is refused (seccomp)
            os.unlink(path)
        sock.bind(path)
        # As uvicorn does for `uds`: in the sandbox seccomp makes this call a no-op, and the
        # image's umask (007) gives the broker's group access (deploy/umask.pth).
        os.chmod(path, 0o666)  # noqa: S103
        sock.listen(backlog)
    except OSError as exc:
        sock.close()
        raise BindingError("the MCP socket cannot be opened") from exc
    return sock


class _Probe(BindingError):
    pass


def _receive(conn: socket.socket) -> Binding:
    fds: list[int] = []
    try:
        try:
            message, fds, flags, _ = socket.recv_fds(
                conn, MAX_MESSAGE_BYTES + 1, FD_COUNT, socket.MSG_CMSG_CLOEXEC
            )
        except OSError as exc:  # a timeout included
            raise BindingError("the binding message did not arrive") from exc
        if not message and not fds:
            raise _Probe("closed without a message")
        if flags & (socket.MSG_CTRUNC | socket.MSG_TRUNC) or len(message) > MAX_MESSAGE_BYTES:
            raise BindingError("the binding message is too large or carries too many descriptors")
        if len(fds) != FD_COUNT:
            raise BindingError(f"the binding must carry exactly {FD_COUNT} descriptors")
        tenant = _tenant(message)
        sources_fd, reports_fd, secret_fd = fds
        for fd, what in ((sources_fd, "sources"), (reports_fd, "drop-box")):
            if not stat.S_ISDIR(os.fstat(fd).st_mode):
                raise BindingError(f"the {what} descriptor is not a directory")
        try:
            secret = secret_from_fd(secret_fd, "the secret descriptor")
        except ConfigError as exc:
            raise BindingError(str(exc)) from None
        os.close(secret_fd)
        return Binding(tenant=tenant, sources_fd=sources_fd, reports_fd=reports_fd, secret=secret)
    except BaseException:
        for fd in fds:
            with contextlib.suppress(OSError):
                os.close(fd)
        raise


def _tenant(message: bytes) -> str:
    try:
        decoded = json.loads(message)
    except ValueError:
        raise BindingError("the binding message is not JSON") from None
    if not isinstance(decoded, dict) or decoded.get("v") != VERSION or set(decoded) != {"v", "scope"}:
        raise BindingError(f"the binding message must be {{'v': {VERSION}, 'scope': ...}}")
    tenant = decoded["scope"]
    if not isinstance(tenant, str) or not TENANT_RE.fullmatch(tenant):
        raise BindingError("the binding's tenant must be a DNS label")
    return tenant


def _answer(conn: socket.socket, answer: dict[str, object]) -> None:
    with contextlib.suppress(OSError):
        conn.sendall(json.dumps(answer).encode())


def confine(bound: Binding, *, run_dir: str) -> None:
    """Lock this process to the bound tenant for good (Landlock), before it serves anyone.

    Raises landlock.LandlockError when it cannot (no Landlock, no run dir): the sandbox must
    then not serve.
    """
    # Not dumpable: another process of the same uid (a `docker exec`) cannot reach this one's
    # descriptors through /proc/<pid>/fd, where this process's Landlock domain does not apply.
    prctl(_PR_SET_DUMPABLE, 0)
    flags = os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC
    try:
        root_fd = os.open("/", flags)
    except OSError as exc:
        raise landlock.LandlockError("the root folder cannot be opened") from exc
    try:
        run_fd = os.open(run_dir, flags)
    except OSError as exc:
        os.close(root_fd)
        raise landlock.LandlockError("the run dir cannot be opened") from exc
    try:
        landlock.restrict(
            [
                # The image (Python imports lazily), /proc, the run dir: read-only, as before.
                landlock.Rule(root_fd, landlock.READ_FILE | landlock.READ_DIR | landlock.EXECUTE),
                landlock.Rule(bound.sources_fd, landlock.READ_FILE | landlock.READ_DIR),
                landlock.Rule(bound.reports_fd, landlock.MAKE_REG | landlock.WRITE_FILE),
                landlock.Rule(run_fd, landlock.MAKE_SOCK),  # uvicorn binds mcp.sock next
            ]
        )
    finally:
        os.close(root_fd)
        os.close(run_fd)


# --- the broker's side --------------------------------------------------------------------------


def _connect(sock: socket.socket, path: str, *, deadline: float) -> None:
    """A unix connect with a timeout set fails at once (EAGAIN) on a full backlog: try again."""
    while True:
        try:
            sock.connect(path)
            return
        except BlockingIOError:
            if time.monotonic() >= deadline:
                raise
            time.sleep(0.005)


def send_binding(
    socket_path: str, *, tenant: str, sources_dir: str, dropbox_dir: str, secret_file: str, timeout: float
) -> None:
    """Bind the pooled sandbox listening at `socket_path` to a tenant (blocking).

    Raises BindingError when the sandbox refuses or does not answer within `timeout`.
    """
    flags = os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
    opened: list[int] = []
    try:
        try:
            opened.append(os.open(sources_dir, os.O_RDONLY | flags))
            # O_PATH: the sandbox gets a name to create files under, not a way to list them.
            opened.append(os.open(dropbox_dir, os.O_PATH | flags))
            opened.append(os.open(secret_file, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC))
        except OSError as exc:
            raise BindingError("the tenant's folders cannot be opened; provision the tenant first") from exc
        message = json.dumps({"v": VERSION, "scope": tenant}).encode()
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(timeout)
            try:
                _connect(sock, socket_path, deadline=time.monotonic() + timeout)
                socket.send_fds(sock, [message], opened)
                answer = sock.recv(MAX_MESSAGE_BYTES)
            except OSError as exc:  # a timeout included
                raise BindingError("the pooled sandbox did not take the binding") from exc
    finally:
        for fd in opened:
            os.close(fd)
    try:
        decoded = json.loads(answer)
    except ValueError:
        raise BindingError("the pooled sandbox gave no answer") from None
    if not isinstance(decoded, dict) or decoded.get("ok") is not True:
        error = decoded.get("error") if isinstance(decoded, dict) else None
        # The sandbox's words reach the broker's log and /readyz: short printable text only.
        said = error if isinstance(error, str) and error.isprintable() and len(error) <= 200 else "?"
        raise BindingError(f"the pooled sandbox refused the binding: {said}")
