"""A real OpenID Provider (npm oidc-provider, tests/oidc/provider.mjs) and a broker that
signs approvers in with it, for the sign-in tests (issue 26).

The provider is installed by `./dev setup` (.ci/oidc-provider.sh) into
/var/cache/docbroker/oidc-provider-<version>; not installed, the tests fail, they never skip.

`Browser` is a minimal cookie-keeping HTTP client for the flow without Chromium: the broker's
cookies are `__Host-`/Secure, which a cookie jar would not send over the tests' plain-HTTP
loopback, so they are kept here by name, exactly as a browser on a secure origin keeps them.
"""

from __future__ import annotations

import contextlib
import html
import re
import secrets
import selectors
import subprocess
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx2
from authlib.integrations.httpx_client import AsyncOAuth2Client

from broker.testing import Broker, free_port, make_broker, structured
from tests.broker.support import UNLIMITED, open_mcp, unique, write_policies

VERSION = "9.13.3"
MODULES = Path(f"/var/cache/docbroker/oidc-provider-{VERSION}/node_modules")
NODE = Path("/usr/bin/node")
SCRIPT = Path(__file__).with_name("provider.mjs")
CLIENT_ID = "docbroker"
SESSION_COOKIE = "__Host-docbroker-session"
SIGNIN_COOKIE = "__Host-docbroker-signin"
RESOURCE = "urn:docbroker"  # the broker, as a resource the provider issues access tokens for
TENANT_MAP = "acme-approvers=acme,globex-approvers=globex,strict-approvers=strict"


@dataclass
class Provider:
    issuer: str
    secret: str
    proc: subprocess.Popen[bytes]
    log: Path

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def start_provider(
    tmp: Path, broker_urls: list[str], secret: str | None = None, *, pairwise: bool = False
) -> Provider:
    """The provider, listening (it prints "listening" once it serves discovery); `pairwise`:
    docbroker's id_tokens name people by a `sub` of that application's own (as Entra ID's do)."""
    assert NODE.exists() and (MODULES / "oidc-provider").is_dir(), "run ./dev setup (.ci/oidc-provider.sh)"
    port = free_port()
    issuer = f"http://127.0.0.1:{port}"
    secret = secret or secrets.token_urlsafe(32)
    env = {
        "PATH": "/usr/bin:/bin",
        "OIDC_MODULES": str(MODULES),
        "OIDC_PORT": str(port),
        "OIDC_ISSUER": issuer,
        "OIDC_REDIRECT_URIS": ",".join(f"{u}/approvals/callback" for u in broker_urls),
        "OIDC_LOGOUT_URIS": ",".join(f"{u}/approvals" for u in broker_urls),
        "OIDC_CLIENT_SECRET": secret,
        "OIDC_PAIRWISE": "1" if pairwise else "0",
    }
    log = tmp / f"provider-{port}.log"
    proc = subprocess.Popen(
        [str(NODE), str(SCRIPT)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=log.open("wb"),
        stdin=subprocess.DEVNULL,
    )
    assert proc.stdout is not None
    with selectors.DefaultSelector() as sel:
        sel.register(proc.stdout, selectors.EVENT_READ)
        ready = sel.select(timeout=30) and proc.stdout.readline().strip() == b"listening"
    if not ready:
        proc.kill()
        raise RuntimeError(f"the OpenID Provider did not start:\n{log.read_text()[-2000:]}")
    return Provider(issuer, secret, proc, log)


def oidc_env(provider: Provider, secret_file: Path, **extra: str) -> dict[str, str]:
    secret_file.write_text(provider.secret + "\n")
    secret_file.chmod(0o600)
    return {
        "DOCBROKER_OIDC_ISSUER": provider.issuer,
        "DOCBROKER_OIDC_CLIENT_ID": CLIENT_ID,
        "DOCBROKER_OIDC_CLIENT_SECRET_FILE": str(secret_file),
        "DOCBROKER_OIDC_SCOPES": "openid groups",
        "DOCBROKER_OIDC_TENANT_CLAIM": "groups",
        "DOCBROKER_OIDC_TENANT_MAP": TENANT_MAP,
        "DOCBROKER_OIDC_APPROVER_CLAIM": "groups",
        "DOCBROKER_OIDC_APPROVER_VALUE": "docbroker-approvers",
        **extra,
    }


@contextlib.contextmanager
def provider_and_broker(
    tmp: Path,
    *,
    tenant_tokens: bool = False,
    pairwise: bool = False,
    cedar: dict[str, str] | None = None,
    **extra: str,
) -> Iterator[tuple[Provider, Broker]]:
    """A provider and a broker (acme and globex, unlimited) that signs approvers in with it;
    with `tenant_tokens`, tenants' access tokens are the provider's too (its jwks_uri);
    `cedar`: policy files (name → text) added to the broker's policies folder."""
    broker = make_broker(tmp / "broker", tenants=("acme", "globex", "strict"))
    write_policies(
        broker,
        {
            "acme": UNLIMITED,
            "globex": UNLIMITED,
            "strict": UNLIMITED + "[approvals]\nrequire_distinct_approver = true\n",
        },
    )
    for name, text in (cedar or {}).items():
        (Path(broker.env["DOCBROKER_POLICIES_DIR"]) / name).write_text(text)
    provider = start_provider(tmp, [broker.url], pairwise=pairwise)
    try:
        broker.env.update(oidc_env(provider, tmp / "oidc-client.secret", **extra))
        if tenant_tokens:
            broker.env.update(
                {
                    "DOCBROKER_AUTH_ISSUER": provider.issuer,
                    "DOCBROKER_AUTH_AUDIENCE": RESOURCE,
                    "DOCBROKER_AUTH_JWKS_URL": f"{provider.issuer}/jwks",
                    "DOCBROKER_AUTH_JWKS_FILE": "",
                }
            )
        broker.start()
        try:
            yield provider, broker
        finally:
            broker.stop()
    finally:
        provider.stop()


def set_cookies(response: httpx2.Response) -> dict[str, dict[str, str]]:
    """name → {"value": …, attribute (lower-case) → value or ""} of every Set-Cookie."""
    found: dict[str, dict[str, str]] = {}
    for header in response.headers.get_list("set-cookie"):
        first, *attributes = [part.strip() for part in header.split(";")]
        name, _, value = first.partition("=")
        entry = {"value": value.strip('"')}
        for attribute in attributes:
            key, _, val = attribute.partition("=")
            entry[key.lower()] = val
        found[name] = entry
    return found


@dataclass
class Browser:
    """The broker's cookies by name (as a browser on a secure origin would send them), and
    the provider's in a jar of its own."""

    broker: Broker
    cookies: dict[str, str] = field(default_factory=dict)
    idp: httpx2.Client = field(default_factory=lambda: httpx2.Client(timeout=30))

    def close(self) -> None:
        self.idp.close()

    def request(self, method: str, path_or_url: str, **kwargs: Any) -> httpx2.Response:
        url = path_or_url if path_or_url.startswith("http") else self.broker.url + path_or_url
        headers = dict(kwargs.pop("headers", {}))
        if self.cookies:
            headers["cookie"] = "; ".join(f"{k}={v}" for k, v in self.cookies.items())
        response = httpx2.request(method, url, headers=headers, timeout=30, **kwargs)
        for name, entry in set_cookies(response).items():
            if entry.get("max-age") == "0":
                self.cookies.pop(name, None)
            else:
                self.cookies[name] = entry["value"]
        return response

    def start(self, return_to: str | None = None) -> str:
        """Begin a sign-in at the broker: the provider's authorization URL."""
        query = f"?return_to={urllib.parse.quote(return_to)}" if return_to is not None else ""
        response = self.request("GET", f"/approvals/login{query}")
        assert response.status_code == 302, response.text
        return response.headers["location"]

    def authenticate(self, authorization_url: str, login: str) -> str:
        """Log in at the provider as `login` (its dev form): the callback URL it sends back to."""
        response = self.idp.get(authorization_url)
        for _ in range(10):
            location = response.headers.get("location", "")
            if response.status_code in (302, 303) and location.startswith(self.broker.url):
                return location
            if response.status_code in (302, 303):
                response = self.idp.get(urllib.parse.urljoin(str(response.url), location))
                continue
            match = re.search(r'<form[^>]*action="([^"]+)"', response.text)
            assert response.status_code == 200 and match, response.text[:500]
            action = urllib.parse.urljoin(str(response.url), html.unescape(match.group(1)))
            response = self.idp.post(action, data={"prompt": "login", "login": login, "password": "x"})
        raise AssertionError("the provider never sent the browser back to the broker")

    def sign_in(self, login: str, return_to: str | None = None) -> httpx2.Response:
        """The whole flow: the broker's answer to the callback."""
        callback = self.authenticate(self.start(return_to), login)
        return self.request("GET", callback)

    def session(self) -> dict[str, Any]:
        response = self.request("GET", "/approvals/session")
        assert response.status_code == 200, response.text
        body: dict[str, Any] = response.json()
        return body

    def post(self, path: str, csrf: str | None) -> httpx2.Response:
        return self.request("POST", path, headers={"x-csrf-token": csrf} if csrf is not None else {})


async def pending_approval(broker: Broker, tenant: str = "acme", subject: str = "alice") -> str:
    """A save proposed by an MCP client that cannot be asked in-band: its approval id."""
    name = unique("oidc")
    async with open_mcp(broker, broker.token(tenant=tenant, subject=subject)) as client:
        result = structured(await client.call_tool("save_report", {"filename": name, "content": "numbers\n"}))
    assert result["status"] == "waiting_approval", result
    return str(result["data"]["approval_id"])


def state_of(broker: Broker, approval_id: str, tenant: str = "acme") -> str:
    token = broker.token(tenant=tenant, subject="operator", scope="reports:approve")
    response = httpx2.get(
        f"{broker.url}/v1/approvals/{approval_id}", headers={"authorization": f"Bearer {token}"}
    )
    assert response.status_code == 200, response.text
    return str(response.json()["state"])


async def person_token(
    provider: Provider, broker: Broker, login: str, scope: str = "docs:read docs:write"
) -> str:
    """`login`'s access token for the broker, from their MCP client's sign-in at the provider
    (authorization code + PKCE, a public client, the broker as the resource)."""
    redirect = f"{broker.url}/approvals/callback"  # registered for the tests' clients
    async with AsyncOAuth2Client(
        "mcp-client", scope=f"openid {scope}", redirect_uri=redirect,
        code_challenge_method="S256", token_endpoint_auth_method="none",
    ) as oauth:  # fmt: skip
        verifier = secrets.token_urlsafe(48)
        url, _ = oauth.create_authorization_url(
            f"{provider.issuer}/auth", code_verifier=verifier, resource=RESOURCE, nonce="n"
        )
        browser = Browser(broker)
        callback = browser.authenticate(url, login)
        code = dict(urllib.parse.parse_qsl(urllib.parse.urlsplit(callback).query))["code"]
        token = await oauth.fetch_token(
            f"{provider.issuer}/token", code=code, code_verifier=verifier, resource=RESOURCE
        )
    return str(token["access_token"])


async def service_token(provider: Provider, client_id: str, resource: str = RESOURCE) -> str:
    async with AsyncOAuth2Client(client_id, provider.secret, scope="docs:read docs:write") as client:
        token: dict[str, Any] = await client.fetch_token(
            f"{provider.issuer}/token", grant_type="client_credentials", resource=resource
        )
    return str(token["access_token"])
