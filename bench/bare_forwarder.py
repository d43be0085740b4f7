"""A reference point for broker_overhead.py: the least a Python MCP proxy can do on this host.

uvicorn (uvloop + httptools, one write per response, as the broker runs) and the broker's own sandbox client
(`broker.upstream`), forwarding each POST body to one unix socket and the answer
back. No authentication, no policy, no checks, no audit: nothing the broker is for. Its
added latency and throughput are the floor under the broker's on the same machine, measured
in the same run, so a target can be read against what the machine allows at all.

    python bench/bare_forwarder.py --socket /path/to/mcp.sock --port 8123

Never a way to serve tenants: it trusts whatever the socket says.
"""

from __future__ import annotations

import argparse
from typing import Any

import uvicorn
import uvloop

from broker.gateway.forwarding import request_headers
from broker.types import Endpoint
from broker.upstream import Upstream
from server.http_protocol import OneWriteHttpToolsProtocol


def make_app(socket_path: str) -> Any:
    client = Upstream(
        Endpoint(url="http://localhost/mcp", uds=socket_path), connect_timeout=2.0, read_timeout=30.0
    )

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        chunks = []
        while True:
            message = await receive()
            chunks.append(message.get("body", b""))
            if not message.get("more_body"):
                break
        headers = request_headers((k.decode("latin-1"), v.decode("latin-1")) for k, v in scope["headers"])
        response = await client.send(scope["method"], headers, b"".join(chunks))
        try:
            body = await response.read(16 * 1024 * 1024)
        finally:
            await response.aclose()
        content_type = response.headers.get("content-type", "application/json").encode("latin-1")
        await send(
            {
                "type": "http.response.start",
                "status": response.status_code,
                "headers": [(b"content-type", content_type), (b"content-length", b"%d" % len(body))],
            }
        )
        await send({"type": "http.response.body", "body": body})

    return app


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--socket", required=True, help="the sandbox's unix socket")
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args()
    config = uvicorn.Config(
        make_app(args.socket),
        host="127.0.0.1",
        port=args.port,
        log_level="warning",
        access_log=False,
        http=OneWriteHttpToolsProtocol,  # as the broker runs
        lifespan="off",
    )
    uvloop.run(uvicorn.Server(config).serve())


if __name__ == "__main__":
    main()
