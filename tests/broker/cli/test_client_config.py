"""`docbroker client-config` (issue 29 item 1): a ready configuration for each client, with
the broker's /mcp URL and the Authorization header; the token a placeholder, or from a file
to stdout only. The Python one is run against the real broker and lists its tools."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from broker.cli.client_config import CLIENTS
from broker.testing import ROOT, Broker
from tests.broker.cli.cli_helpers import cli, one_line_error, token_file
from tests.broker.support import READ_SCOPE

JSON_CLIENTS = {"claude-desktop", "vscode", "cursor"}


def config(broker: Broker, client: str, *extra: str) -> subprocess.CompletedProcess[str]:
    return cli(
        broker.env, "client-config", "--tenant", "acme", "--client", client, "--url", broker.url, *extra
    )


@pytest.mark.parametrize("client", sorted(CLIENTS))
def test_each_client_gets_the_url_and_a_placeholder(broker: Broker, client: str) -> None:
    result = config(broker, client)
    assert result.returncode == 0 and result.stderr == "", result.stderr
    assert f"{broker.url}/mcp" in result.stdout and "Bearer" in result.stdout
    assert "eyJ" not in result.stdout  # no token at all without --token-file
    if client in JSON_CLIENTS:
        document = json.loads(result.stdout)
        servers = document.get("mcpServers") or document["servers"]
        assert list(servers) == ["docbroker-acme"]


def test_vscode_and_cursor_in_their_own_formats(broker: Broker) -> None:
    vscode = json.loads(config(broker, "vscode").stdout)
    server = vscode["servers"]["docbroker-acme"]
    assert (
        server["type"] == "http" and server["headers"]["Authorization"] == "Bearer ${input:docbroker-token}"
    )
    assert vscode["inputs"][0]["password"] is True
    cursor = json.loads(config(broker, "cursor").stdout)["mcpServers"]["docbroker-acme"]
    assert cursor["headers"]["Authorization"] == "Bearer ${env:DOCBROKER_TOKEN}"


def test_a_token_from_a_file_goes_to_stdout_only(broker: Broker, tmp_path: Path) -> None:
    token = broker.token(tenant="acme", scope=READ_SCOPE)
    for client in sorted(CLIENTS):
        result = config(broker, client, "--token-file", str(token_file(tmp_path, token)))
        assert result.returncode == 0 and token in result.stdout and token not in result.stderr
    assert token not in Path(broker.log_file).read_text(errors="replace")


def test_the_python_configuration_runs_against_the_broker(broker: Broker, tmp_path: Path) -> None:
    script = tmp_path / "client.py"
    script.write_text(config(broker, "python").stdout)
    env = {
        "PATH": os.environ["PATH"],
        "PYTHONPATH": str(ROOT),
        "DOCBROKER_TOKEN": broker.token(tenant="acme", scope=READ_SCOPE),
    }
    ran = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=60)
    assert ran.returncode == 0, ran.stderr[-2000:]
    assert "search_documents" in ran.stdout


def test_bad_inputs_are_one_line_usage_errors(broker: Broker) -> None:
    bad_tenant = cli(broker.env, "client-config", "--tenant", "Not A Label", "--client", "cursor")
    assert one_line_error(bad_tenant, 2).endswith("not a tenant id (a DNS label)")
    assert cli(broker.env, "client-config", "--tenant", "acme", "--client", "emacs").returncode == 2
    bad_url = config(broker, "cursor", "--url", "ftp://x")
    assert bad_url.returncode == 2
