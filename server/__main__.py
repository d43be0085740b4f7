"""`python -m server`: start the document-tools server on one transport.

    python -m server                         # stdio (protocol frames on stdout, logs on stderr)
    python -m server --http 127.0.0.1:8000   # Streamable HTTP on TCP, path /mcp
    python -m server --socket /run/docs/mcp.sock   # Streamable HTTP on a unix socket

Configuration comes from DOCS_ROOT, DOCS_SCOPE and DOCS_SECRET_FILE.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from typing import Any

from server.config import ConfigError, ServerConfig
from server.workspace import WorkspaceError


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m server", description="docbroker document-tools MCP server"
    )
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--http", metavar="HOST:PORT", help="serve Streamable HTTP on TCP")
    where.add_argument("--socket", metavar="PATH", help="serve Streamable HTTP on a unix socket")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = _parse_args(argv)
    # stderr only: in stdio mode stdout carries protocol frames and nothing else.
    logging.basicConfig(
        stream=sys.stderr, level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s"
    )
    # The SDK logs session ids and request details at INFO; a session id is a credential.
    logging.getLogger("mcp").setLevel(logging.WARNING)
    try:
        config = ServerConfig.from_env()
        from server.app import build_server, http_app  # imports the SDK: ~0.5 s, after cheap checks

        server, _workspace = build_server(config)
    except (ConfigError, WorkspaceError) as exc:
        sys.stderr.write(f"docbroker server: configuration error: {exc}\n")
        return 2

    if args.http is None and args.socket is None:
        server.run("stdio")
        return 0

    import uvicorn

    from server.http_protocol import OneWriteHttpToolsProtocol

    app = http_app(server, unix_socket=args.socket is not None)
    # No Server or Date header: the only reader is the broker (or a test client), and neither
    # says anything a caller needs.
    options: dict[str, Any] = {
        "log_level": "warning",
        "access_log": False,
        "lifespan": "on",
        "http": OneWriteHttpToolsProtocol,  # httptools, each whole answer in one write
        "server_header": False,
        "date_header": False,
    }
    if args.socket:
        if os.path.lexists(args.socket):
            os.unlink(args.socket)  # a stale socket from a crashed run
        options["uds"] = args.socket
    else:
        host, _, port = args.http.rpartition(":")
        if not host or not port.isdigit():
            sys.stderr.write("docbroker server: --http takes HOST:PORT\n")
            return 2
        options.update(host=host.strip("[]"), port=int(port))
    uvicorn.run(app, **options)
    return 0


if __name__ == "__main__":
    sys.exit(main())
