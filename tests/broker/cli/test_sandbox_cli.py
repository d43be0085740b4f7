"""`docbroker sandbox list|restart|logs` with the local runtime, beside the shared broker
(issue 29 item 1; the Docker side is tests/docker/test_docker_broker_replace.py): `list`
finds the sandbox whichever broker started it, `restart` removes it and the next call starts
a new one, `logs` says in one line that this runtime keeps none."""

from __future__ import annotations

from broker.testing import Broker
from tests.broker.cli.cli_helpers import cli, json_out, one_line_error
from tests.broker.support import READ_SCOPE, call_modern, gone, open_http, rpc_reply, server_pids, wait_for


def read(broker: Broker, tenant: str) -> None:
    with open_http(broker, broker.token(tenant=tenant, scope=READ_SCOPE)) as http:
        reply = rpc_reply(call_modern(http, "search_documents", {"query": "anything"}))
    assert "result" in reply, reply


def test_list_then_restart(broker: Broker) -> None:
    read(broker, "globex")
    [pid] = server_pids(broker, "globex")
    listed = json_out(cli(broker.env, "sandbox", "list", "--json"))
    rows = [row for row in listed["sandboxes"] if row["tenant"] == "globex"]
    assert listed["runtime"] == "local"
    assert rows == [{"tenant": "globex", "state": "running", "id": str(pid), "replica": rows[0]["replica"],
                     "warm": False}]  # fmt: skip
    assert "globex" in cli(broker.env, "sandbox", "list").stdout  # the table

    assert json_out(cli(broker.env, "sandbox", "restart", "globex", "--json")) == {
        "tenant": "globex",
        "removed": 1,
    }
    assert wait_for(lambda: gone(pid))
    read(broker, "globex")  # the broker starts a new one
    assert server_pids(broker, "globex") not in ([], [pid])


def test_logs_are_refused_in_one_line_where_the_runtime_keeps_none(broker: Broker) -> None:
    line = one_line_error(cli(broker.env, "sandbox", "logs", "acme"), 1)
    assert line == "docbroker sandbox logs: the local runtime keeps no sandbox logs for the broker to read"
    assert one_line_error(cli(broker.env, "sandbox", "logs", "acme", "--lines", "0"), 2)


def test_a_spinner_only_for_a_terminal(broker: Broker) -> None:
    import os
    import pty
    import subprocess
    import sys

    piped = cli(broker.env, "sandbox", "list")
    assert piped.returncode == 0 and piped.stderr == ""  # scripts and logs see no progress noise
    leader, follower = pty.openpty()
    proc = subprocess.Popen(
        [sys.executable, "-m", "broker", "sandbox", "list", "--json"],
        env=broker.env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=follower,
    )  # fmt: skip
    os.close(follower)
    seen = b""
    while True:
        try:
            chunk = os.read(leader, 4096)
        except OSError:  # EIO: the command closed the terminal
            break
        if not chunk:
            break
        seen += chunk
    stdout, _ = proc.communicate(timeout=60)
    os.close(leader)
    assert proc.returncode == 0 and b"asking the local sandbox engine" in seen
    assert b"\x1b" not in stdout  # the JSON on stdout is untouched
