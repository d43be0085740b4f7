"""`python -m server`: start the document-tools server on one transport.

    python -m server                         # stdio (protocol frames on stdout, logs on stderr)
    python -m server --http 127.0.0.1:8000   # Streamable HTTP on TCP, path /mcp
    python -m server --socket /run/docs/mcp.sock   # Streamable HTTP on a unix socket
    python -m server --socket /run/docs/mcp.sock --bind /run/docs/bind.sock   # pooled

Configuration comes from DOCS_ROOT, DOCS_SCOPE and DOCS_SECRET_FILE, or, pooled, from the
broker's binding (`server/binding.py`): the server warms up first, then waits to be bound to
a tenant, locks itself to that tenant's folders with Landlock, and only then serves.
Over HTTP, DOCS_SANDBOX_KEY_FILE makes every request need the broker's bearer (required for
`--http` off loopback) and DOCS_ALLOWED_HOSTS replaces the Host allow-list (`server/config.py`).
The TCP socket is opened before uvicorn starts (`server/listen.py`): a socket that cannot be
opened is an error on stderr and exit 1, never a server listening on nothing.
"""

from __future__ import annotations

import argparse
import gc
import logging
import os
import secrets
import socket
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from server.config import ConfigError, HttpConfig, ServerConfig
from server.listen import parse_host_port, tcp_listener, why
from server.workspace import Workspace, WorkspaceError

if TYPE_CHECKING:
    from mcp.server.mcpserver import MCPServer


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m server", description="docbroker document-tools MCP server"
    )
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--http", metavar="HOST:PORT", help="serve Streamable HTTP on TCP")
    where.add_argument("--socket", metavar="PATH", help="serve Streamable HTTP on a unix socket")
    parser.add_argument(
        "--bind", metavar="PATH", help="pooled: warm up, then wait on this unix socket for a tenant"
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = _parse_args(argv)
    # stderr only: in stdio mode stdout carries protocol frames and nothing else.
    logging.basicConfig(
        stream=sys.stderr, level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s"
    )
    # The SDK logs session ids and request details at INFO; a session id is a credential.
    logging.getLogger("mcp").setLevel(logging.WARNING)
    if args.bind is not None and args.socket is None:
        sys.stderr.write("docbroker server: --bind needs --socket\n")
        return 2
    listen = parse_host_port(args.http) if args.http is not None else None
    if args.http is not None and listen is None:
        sys.stderr.write("docbroker server: --http takes HOST:PORT\n")
        return 2
    try:
        http = HttpConfig.from_env() if args.http or args.socket else None
        if http is not None and listen is not None:
            http.check_listener(listen[0])
        if args.bind:
            server, bound_socket = _bound_server(args.bind, args.socket)
        else:
            server, bound_socket = _configured_server(), None
    except (ConfigError, WorkspaceError) as exc:
        sys.stderr.write(f"docbroker server: configuration error: {exc}\n")
        return 2

    if http is None:
        server.run("stdio")
        return 0
    sockets: list[socket.socket] | None = [bound_socket] if bound_socket is not None else None
    if listen is not None:
        try:
            sockets = [tcp_listener(*listen)]
        except OSError as exc:
            sys.stderr.write(f"docbroker server: cannot listen on {args.http}: {why(exc)}\n")
            return 1

    import uvicorn

    from server.app import http_app
    from server.http_protocol import OneWriteHttpToolsProtocol
    from server.quiet import QuietServer

    app = http_app(
        server,
        unix_socket=args.socket is not None,
        sandbox_key=http.sandbox_key,
        allowed_hosts=http.allowed_hosts,
    )
    # No Server or Date header: the only reader is the broker (or a test client), and neither
    # says anything a caller needs.
    options: dict[str, Any] = {
        "log_level": "warning",
        "access_log": False,
        "lifespan": "on",
        "http": OneWriteHttpToolsProtocol,  # httptools, each whole answer in one write
        "server_header": False,
        "date_header": False,
        # Named, not "auto": the sandbox serves no websockets, and "auto" would look for a
        # websockets library (and uvloop, below) at start: imports after a pooled sandbox's
        # binding. The image has no uvloop; elsewhere (the local runtime) "auto" stays.
        "ws": "none",
        "loop": "asyncio" if args.bind else "auto",
    }
    if args.socket and bound_socket is None:
        if os.path.lexists(args.socket):
            os.unlink(args.socket)  # a stale socket from a crashed run
        options["uds"] = args.socket
    serving = QuietServer(uvicorn.Config(app, **options))
    serving.run(sockets=sockets)
    if not serving.started:
        sys.stderr.write("docbroker server: the HTTP server did not start\n")
        return 1
    return 0


def _configured_server() -> MCPServer[Any]:
    config = ServerConfig.from_env()
    from server.app import build_server  # imports the SDK: ~1 s, after cheap checks

    return build_server(config.tenant, config.secret, Workspace(config.docs_root))


def _bound_server(bind_path: str, socket_path: str) -> tuple[MCPServer[Any], socket.socket]:
    """Warm up, wait for the broker's binding, lock down, and build the tenant's server; the
    MCP socket is already listening when the broker hears the binding was taken."""
    # Everything serving needs is imported now, before any tenant waits for it: a first call
    # then costs the sandbox ~6 ms of CPU instead of ~17 (anyio's backend alone is most of it),
    # which twenty first calls at once on two cores pay twenty times over.
    # tests/server/test_binding.py checks that nothing is imported after the warm-up.
    import encodings.ascii  # noqa: F401 - landlock.py reads /proc/self/status as ascii

    import anyio._backends._asyncio  # noqa: F401
    import uvicorn.lifespan.on
    import uvicorn.loops.asyncio  # noqa: F401

    import server.http_protocol
    import server.quiet  # noqa: F401
    from server import binding, landlock
    from server.app import build_server

    _rehearse(build_server)
    # The warm-up's garbage collected now, while no tenant waits: serving begins by freezing
    # the heap (server/quiet.py), which would otherwise keep it, and a full collection at
    # that point cost a first call ~35 ms (bench/burst.py).
    gc.collect()
    run_dir = os.path.dirname(socket_path) or "."
    try:
        listener = binding.listen(bind_path)
        bound, serving = binding.accept_binding(listener, run_dir=run_dir, serve_at=socket_path)
    except (binding.BindingError, landlock.LandlockError) as exc:
        raise ConfigError(f"binding refused: {exc}") from None
    assert serving is not None
    workspace = Workspace.from_fds(bound.sources_fd, bound.reports_fd)
    return build_server(bound.tenant, bound.secret, workspace), serving


def _rehearse(build: Callable[[str, str, Workspace], MCPServer[Any]]) -> None:
    """Build a server and its app as a bound one is built, and drop them: what that path
    imports or sets up on first use (the SDK's logging set-up, for one) is done before a tenant
    waits. No tenant's anything: a made-up tenant and secret, and the image's root as a folder
    nothing reads (no tool runs)."""
    from server.app import http_app

    root = os.open("/", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    workspace = Workspace.from_fds(root, os.dup(root))
    try:
        http_app(build("warm-up", secrets.token_hex(32), workspace), unix_socket=True)
    finally:
        workspace.close()


if __name__ == "__main__":
    sys.exit(main())
