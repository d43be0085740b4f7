"""`Origin` is validated on every surface (DNS rebinding; required by the MCP transport spec).

A page on another origin can make a browser reach a broker on localhost or an intranet
through a rebinding DNS name; the browser still sends the page's `Origin`. A request that
carries an Origin not on the allow-list (the public URL's own, plus
`DOCBROKER_ALLOWED_ORIGINS`) is refused with 403 and audited, without the value; a request
without one (MCP clients, curl) passes.
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx2
import pytest

from broker.settings import Settings, SettingsError
from broker.testing import ROOT, Broker, running_broker
from tests.broker.support import events_since, last_seq, modern_body, modern_headers, open_http


def evil_origin() -> str:
    return f"http://rebind-{secrets.token_hex(6)}.attacker.example"


def post_tools_list(http: httpx2.Client, **headers: str) -> httpx2.Response:
    return http.post(
        "/mcp", json=modern_body("tools/list"), headers={**modern_headers("tools/list"), **headers}
    )


SURFACES = {
    "mcp": lambda http, origin: post_tools_list(http, origin=origin),
    "approvals": lambda http, origin: http.get("/v1/approvals", headers={"origin": origin}),
    "approvals-decide": lambda http, origin: http.post(
        f"/v1/approvals/{'0' * 32}/approve", headers={"origin": origin}
    ),
    "approvals_page": lambda http, origin: http.get("/approvals", headers={"origin": origin}),
}
AUDITED_AS = {
    "mcp": "mcp",
    "approvals": "approvals",
    "approvals-decide": "approvals",
    "approvals_page": "approvals_page",
}


@pytest.mark.parametrize("surface", SURFACES)
def test_a_foreign_origin_is_refused_and_audited_without_its_value(broker: Broker, surface: str) -> None:
    origin = evil_origin()
    before = last_seq(broker)
    with open_http(broker, broker.token()) as http:
        reply = SURFACES[surface](http, origin)
    assert reply.status_code == 403, reply.text
    if surface == "mcp":
        assert reply.json() == {
            "jsonrpc": "2.0", "id": None, "error": {"code": -32003, "message": "Origin not allowed"}
        }  # fmt: skip
    else:
        assert reply.json() == {"error": "origin_not_allowed"}
    [event] = [e for e in events_since(broker, before) if e["event"] == "auth.denied"]
    assert (event["reason"], event["outcome"], event["status"]) == ("origin_not_allowed", "denied", 403)
    assert event["method"] == AUDITED_AS[surface]
    host = origin.removeprefix("http://").split(".")[0]
    assert host not in broker.audit_file.read_text() and host not in broker.logs()


@pytest.mark.parametrize("surface", SURFACES)
def test_the_brokers_own_origin_is_accepted(broker: Broker, surface: str) -> None:
    with open_http(broker, broker.token()) as http:
        reply = SURFACES[surface](http, broker.url)
    assert reply.status_code == (404 if surface == "approvals-decide" else 200), reply.text


@pytest.mark.parametrize(
    "origin", ["null", "http://127.0.0.1", "https://127.0.0.1:{port}", "http://localhost:{port}"]
)
def test_near_misses_and_the_opaque_origin_are_refused(broker: Broker, origin: str) -> None:
    # "null" is what a sandboxed iframe or a file: page sends; the others differ from the
    # public URL's origin in port, scheme or host name.
    origin = origin.format(port=broker.url.rsplit(":", 1)[1])
    with open_http(broker, broker.token()) as http:
        assert post_tools_list(http, origin=origin).status_code == 403


def test_two_origin_headers_must_both_be_allowed(broker: Broker) -> None:
    with open_http(broker, broker.token()) as http:
        reply = http.post(
            "/mcp",
            content=json.dumps(modern_body("tools/list")),
            headers=[
                *modern_headers("tools/list").items(),
                ("origin", broker.url),
                ("origin", evil_origin()),
            ],
        )
    assert reply.status_code == 403


@pytest.fixture(scope="module")
def listed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Broker]:
    env = {"DOCBROKER_ALLOWED_ORIGINS": "https://Console.Example, http://tools.example:8443"}
    with running_broker(tmp_path_factory.mktemp("origins"), env=env) as b:
        yield b


@pytest.mark.parametrize(
    ("origin", "status"),
    [
        ("https://console.example", 200),  # as a browser serialises it: lower case
        ("http://tools.example:8443", 200),
        ("http://tools.example", 403),
        ("https://evil.example", 403),
    ],
)
def test_listed_origins_are_accepted_beside_the_brokers_own(listed: Broker, origin: str, status: int) -> None:
    with open_http(listed, listed.token()) as http:
        assert post_tools_list(http, origin=origin).status_code == status
        assert post_tools_list(http, origin=listed.url).status_code == 200


SETTINGS_BASE = {
    "DOCBROKER_AUTH_ISSUER": "https://issuer.example",
    "DOCBROKER_AUTH_AUDIENCE": "docbroker",
    "DOCBROKER_AUTH_JWKS_URL": "https://issuer.example/jwks.json",
}


def test_the_default_allow_list_is_the_public_urls_origin() -> None:
    assert Settings.from_env(SETTINGS_BASE).server.allowed_origins == ("http://127.0.0.1:8080",)
    env = SETTINGS_BASE | {"DOCBROKER_PUBLIC_URL": "https://Broker.Example:443/docbroker/"}
    assert Settings.from_env(env).server.allowed_origins == ("https://broker.example",)


@pytest.mark.parametrize(
    "value", ["*", "null", "https://a.example/path", "ftp://a.example", "https://a.example:99999",
              "https://user@a.example", "a.example", "https://a.example,,https://b.example"],
)  # fmt: skip
def test_bad_allowed_origins_are_refused_naming_the_variable_only(value: str) -> None:
    with pytest.raises(SettingsError) as caught:
        Settings.from_env(SETTINGS_BASE | {"DOCBROKER_ALLOWED_ORIGINS": value})
    message = str(caught.value)
    assert "DOCBROKER_ALLOWED_ORIGINS" in message and value not in message


def test_a_bad_allow_list_stops_the_broker_at_start_with_a_clear_message(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DOCBROKER_")}
    env |= SETTINGS_BASE | {
        "DOCBROKER_ALLOWED_ORIGINS": "https://ok.example, not an origin",
        "PYTHONPATH": str(ROOT),
    }
    env["DOCBROKER_DATA_DIR"] = str(tmp_path)
    done = subprocess.run(
        [sys.executable, "-m", "broker", "serve"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode != 0
    assert "DOCBROKER_ALLOWED_ORIGINS" in done.stderr
    assert "Traceback" not in done.stderr and "not an origin" not in done.stderr
