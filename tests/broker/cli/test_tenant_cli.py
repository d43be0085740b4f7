"""`docbroker tenant add|list|show|remove` on a real broker's host (issue 29 item 1): a tenant
added by the CLI is served after the restart the command asks for; `remove` stops its
sandbox, deletes its policy, sources and secret, keeps the audit log untouched, and deletes
reports only when told to — without a terminal to ask on it changes nothing."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from broker.testing import Broker, make_broker
from tests.broker.cli.cli_helpers import cli, json_out, one_line_error
from tests.broker.support import READ_SCOPE, call_modern, open_http, rpc_reply, server_pids, wait_for


@pytest.fixture
def host(tmp_path: Path) -> Iterator[Broker]:
    broker = make_broker(tmp_path, tenants=["acme"])
    try:
        yield broker
    finally:
        broker.stop()


def by_name(rows: list[dict[str, object]]) -> dict[object, dict[str, object]]:
    return {row["tenant"]: row for row in rows}


def test_add_list_show_remove(host: Broker) -> None:
    added = cli(host.env, "tenant", "add", "newco", "--json")
    assert json_out(added)["tenant"] == "newco"
    assert "restart the broker" in added.stderr
    policy = Path(host.env["DOCBROKER_POLICIES_DIR"]) / "tenants" / "newco.toml"
    assert policy.is_file()
    (host.sources("newco") / "plan.md").write_text("# Plan\nthe launch is in May\n")

    # Added before the start: served.
    host.start()
    with open_http(host, host.token(tenant="newco", scope=READ_SCOPE)) as http:
        reply = rpc_reply(call_modern(http, "read_document", {"path": "plan.md"}))
    assert "result" in reply and not reply["result"].get("isError"), reply
    assert server_pids(host, "newco")  # its sandbox runs
    (host.reports("newco") / "kept.md").write_text("a report someone approved\n")

    rows = by_name(json_out(cli(host.env, "tenant", "list", "--json"))["tenants"])
    assert rows["newco"] == {
        "tenant": "newco", "policy": True, "folders": True, "sources": 1, "reports": 1, "quarantined": None,
    }  # fmt: skip
    assert rows["acme"]["policy"] is True
    shown = json_out(cli(host.env, "tenant", "show", "newco", "--json"))
    assert shown["effective_policy"]["limits.rate_per_minute"] == 600  # default.toml's
    assert "plan.md" not in cli(host.env, "tenant", "show", "newco").stdout  # counts, never names

    audit_before = host.audit_file.read_bytes()
    assert b"newco" in audit_before

    # No terminal and no answer: a usage error, and nothing was done.
    refused = cli(host.env, "tenant", "remove", "newco")
    assert "--yes or --keep-reports" in one_line_error(refused, 2)
    assert policy.is_file() and server_pids(host, "newco")

    removed = json_out(cli(host.env, "tenant", "remove", "newco", "--keep-reports", "--json"))
    assert removed == {
        "tenant": "newco", "removed": True, "sandboxes_removed": 1, "reports": "kept", "audit": "kept",
    }  # fmt: skip
    assert wait_for(lambda: not server_pids(host, "newco"))
    assert not policy.exists() and not host.sources("newco").exists()
    assert not (host.data_dir / "secrets" / "newco.key").exists()
    assert (host.reports("newco") / "kept.md").is_file()
    assert host.audit_file.read_bytes().startswith(audit_before)  # the audit is the deployment's

    rows = by_name(json_out(cli(host.env, "tenant", "list", "--json"))["tenants"])
    assert rows["newco"]["policy"] is False and rows["newco"]["reports"] == 1

    assert json_out(cli(host.env, "tenant", "remove", "newco", "--yes", "--json"))["reports"] == "deleted"
    assert not (host.data_dir / "tenants" / "newco").exists()
    assert "newco" not in by_name(json_out(cli(host.env, "tenant", "list", "--json"))["tenants"])
    assert one_line_error(cli(host.env, "tenant", "remove", "newco"), 1).endswith("no such tenant")


def test_remove_asks_on_a_terminal(host: Broker) -> None:
    import pty
    import subprocess
    import sys

    assert cli(host.env, "tenant", "add", "asked").returncode == 0
    (host.reports("asked") / "r.md").write_text("report\n")
    leader, follower = pty.openpty()
    proc = subprocess.Popen(
        [sys.executable, "-m", "broker", "tenant", "remove", "asked"],
        env=host.env, stdin=follower, stdout=subprocess.PIPE, stderr=follower, text=True,
    )  # fmt: skip
    os.close(follower)
    asked = b""
    while b"[y/N]" not in asked:  # the question is on the terminal: answer it
        asked += os.read(leader, 1024)
    assert b"1 report(s)" in asked
    os.write(leader, b"n\n")
    assert proc.wait(timeout=60) == 0
    os.close(leader)
    assert (host.reports("asked") / "r.md").is_file()  # "no" keeps them
