"""`docbroker client-config --tenant T --client NAME`: a ready configuration for an MCP client.

Each client gets the broker's `/mcp` URL and the `Authorization: Bearer` header in its own
file format. The token is a placeholder each client fills in from its environment or a
prompt (`DOCBROKER_TOKEN`), or, with `--token-file`, the token itself — written to stdout
only, for the operator to redirect into the client's file; it is never logged or put in an
error line. The tenant is the token's (the broker reads it from the token); `--tenant` names
the server entry, so one client can hold several tenants.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from collections.abc import Callable

from broker.cli.base import Subparsers, UsageError
from broker.settings import SettingsError

TOKEN_VARIABLE = "DOCBROKER_TOKEN"  # noqa: S105 - the name of a variable, not a token


def register(sub: Subparsers) -> None:
    config = sub.add_parser(
        "client-config",
        help="print a ready MCP client configuration (URL and Authorization header) for a tenant",
        description="Clients: " + ", ".join(CLIENTS) + ". Without --token-file the token is a "
        f"placeholder the client fills from ${TOKEN_VARIABLE} (VS Code: a password prompt).",
    )
    config.add_argument("--tenant", required=True, help="the tenant (names the server entry)")
    config.add_argument("--client", required=True, choices=sorted(CLIENTS), metavar="NAME",
                        help="one of: " + ", ".join(sorted(CLIENTS)))  # fmt: skip
    config.add_argument("--url", help="the broker's base URL (default DOCBROKER_PUBLIC_URL)")
    config.add_argument("--token-file", metavar="FILE", help="put this token in (stdout only)")
    config.set_defaults(func=cmd_client_config)


class Target:
    """What one configuration needs: the server's name, its URL, and how the token appears
    (`env`: the client's own syntax for the variable, or the token itself)."""

    def __init__(self, name: str, url: str, token: str | None) -> None:
        self.name, self.url, self.token = name, url, token

    def bearer(self, placeholder: str) -> str:
        return f"Bearer {self.token if self.token is not None else placeholder}"

    @property
    def literal(self) -> bool:
        return self.token is not None


def _json(value: object) -> str:
    return json.dumps(value, indent=2) + "\n"


def claude_code(t: Target) -> str:
    # Claude Code's own command; `${VAR}` is left for the shell to expand when it runs.
    header = t.bearer("${" + TOKEN_VARIABLE + "}")
    url = shlex.quote(t.url)
    return f'claude mcp add --transport http {t.name} {url} --header "Authorization: {header}"\n'


def claude_desktop(t: Target) -> str:
    # Claude Desktop's config file starts local (stdio) servers: mcp-remote bridges to HTTP.
    # The header's value travels in env, as mcp-remote documents (Windows mangles spaces in args).
    return _json(
        {
            "mcpServers": {
                t.name: {
                    "command": "npx",
                    "args": ["-y", "mcp-remote", t.url, "--header", "Authorization:${AUTH_HEADER}"],
                    "env": {"AUTH_HEADER": t.bearer("<paste the token here>")},
                }
            }
        }
    )


def vscode(t: Target) -> str:
    # .vscode/mcp.json: a password prompt keeps the token out of the file.
    inputs = (
        []
        if t.literal
        else [
            {
                "type": "promptString",
                "id": "docbroker-token",
                "description": "docbroker token",
                "password": True,
            }
        ]
    )
    server = {
        "type": "http",
        "url": t.url,
        "headers": {"Authorization": t.bearer("${input:docbroker-token}")},
    }
    return _json({"inputs": inputs, "servers": {t.name: server}})


def cursor(t: Target) -> str:
    # ~/.cursor/mcp.json; Cursor expands ${env:NAME} in headers.
    server = {"url": t.url, "headers": {"Authorization": t.bearer("${env:" + TOKEN_VARIABLE + "}")}}
    return _json({"mcpServers": {t.name: server}})


def python_sdk(t: Target) -> str:
    token = repr(t.token) if t.token is not None else f"os.environ[{TOKEN_VARIABLE!r}]"
    return f"""import asyncio
import os

import httpx2
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

URL = {t.url!r}


async def main() -> None:
    headers = {{"Authorization": "Bearer " + {token}}}
    async with httpx2.AsyncClient(headers=headers, timeout=30) as http:
        async with Client(streamable_http_client(URL, http_client=http)) as client:
            tools = await client.list_tools()
            print([tool.name for tool in tools.tools])


asyncio.run(main())
"""


def typescript_sdk(t: Target) -> str:
    token = json.dumps(t.token) if t.token is not None else f"process.env.{TOKEN_VARIABLE}"
    return f"""import {{ Client }} from "@modelcontextprotocol/sdk/client/index.js";
import {{ StreamableHTTPClientTransport }} from "@modelcontextprotocol/sdk/client/streamableHttp.js";

const transport = new StreamableHTTPClientTransport(new URL({json.dumps(t.url)}), {{
  requestInit: {{ headers: {{ Authorization: `Bearer ${{{token}}}` }} }},
}});
const client = new Client({{ name: {json.dumps(t.name)}, version: "1.0.0" }});
await client.connect(transport);
console.log((await client.listTools()).tools.map((tool) => tool.name));
await client.close();
"""


CLIENTS: dict[str, Callable[[Target], str]] = {
    "claude-code": claude_code,
    "claude-desktop": claude_desktop,
    "vscode": vscode,
    "cursor": cursor,
    "python": python_sdk,
    "typescript": typescript_sdk,
}


def cmd_client_config(args: argparse.Namespace) -> int:
    from broker.cli.approvals import read_token
    from broker.settings import origin_of, public_url_from_env
    from server.contracts import TENANT_RE

    if not TENANT_RE.fullmatch(args.tenant):
        raise UsageError("not a tenant id (a DNS label)")
    if args.url is not None and origin_of(args.url) is None:
        raise UsageError("--url must be an http(s) URL")
    try:
        base = args.url.rstrip("/") if args.url else public_url_from_env()
    except SettingsError as exc:
        raise UsageError(f"configuration error: {exc}") from None
    token = read_token(args.token_file) if args.token_file else None
    target = Target(f"docbroker-{args.tenant}", base + "/mcp", token)
    sys.stdout.write(CLIENTS[args.client](target))
    return 0
