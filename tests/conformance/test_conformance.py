"""The official MCP conformance suite (npm `@modelcontextprotocol/conformance`, tests/conformance/
runner.py) against the document-tools server alone and against the broker in front of it.

The scenarios are those that apply to a server of three document tools (docs/architecture.md,
"Conformance" lists the others and why they do not apply). Each must pass both ways: every
check a success or a note, none a failure or a warning.

The runner sends no `Authorization` and has no option to add one. It reaches the broker
through an authenticating reverse proxy (tests/broker/forwarding_proxy.py with
`authorization`: it adds the tenant's bearer to a request that has none), as a deployment can
put an ingress that injects a service credential in front of a client that cannot send one.
The proxy passes every other header unchanged, so the hostile `Host`/`Origin` of
`dns-rebinding-protection` reach the broker, which must refuse them itself; the broker's public
URL is the proxy's, as behind any ingress. The broker runs its sandboxes with the local
runtime: the server process is the same `python -m server` the image runs, and what is tested
here is the broker's protocol surface, not the sandbox.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from broker.testing import ROOT, Broker, free_port, make_broker
from tests.broker.forwarding_proxy import ForwardingProxy
from tests.conformance import runner
from tests.server.test_bearer import stop, wait_serving

SCENARIOS = (
    "server-initialize",
    "ping",
    "tools-list",
    "dns-rebinding-protection",
    "server-sse-multiple-streams",
)


@dataclass(frozen=True)
class Front:
    broker: Broker
    proxy: ForwardingProxy


@pytest.fixture(scope="module", autouse=True)
def installed() -> None:
    runner.require_installed()


@pytest.fixture(scope="module")
def server_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """`python -m server --http` alone on loopback, one tenant's folders, no bearer."""
    base = tmp_path_factory.mktemp("server")
    for folder in ("sources", "reports"):
        (base / "docs" / folder).mkdir(parents=True)
    secret = base / "approval.key"
    secret.write_text("conformance-approval-secret-" + "0123456789abcdef" * 2 + "\n")
    secret.chmod(0o600)
    port, log = free_port(), base / "server.log"
    env = {
        "PATH": "/usr/bin:/bin",
        "PYTHONPATH": str(ROOT),
        "DOCS_ROOT": str(base / "docs"),
        "DOCS_SCOPE": "acme",
        "DOCS_SECRET_FILE": str(secret),
    }
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "server", "--http", f"127.0.0.1:{port}"],
            cwd=ROOT,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        wait_serving(proc, port, log)
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        stop(proc)


@pytest.fixture(scope="module")
def front(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Front]:
    """A broker (local runtime) behind an authenticating proxy that adds acme's bearer."""
    # Five runners at once, three concurrent POSTs each, would meet the default max_concurrent
    # (8), and their clients' standing GET streams, kept between scenarios, the default
    # max_streams (8): a broker-first 429 is not what is tested here.
    limits = "[limits]\nrate_per_minute = 100000\nburst = 10000\nmax_concurrent = 64\nmax_streams = 64\n"
    broker = make_broker(tmp_path_factory.mktemp("broker"), limits=limits)
    upstream = ("127.0.0.1", int(broker.env["DOCBROKER_PORT"]))
    with ForwardingProxy("127.0.0.1", upstream, authorization=f"Bearer {broker.token()}") as proxy:
        broker.env["DOCBROKER_PUBLIC_URL"] = proxy.url
        broker.start()
        try:
            yield Front(broker, proxy)
        finally:
            broker.stop()


@pytest.fixture(scope="module")
def server_runs(server_url: str, tmp_path_factory: pytest.TempPathFactory) -> dict[str, runner.Run]:
    return runner.run_all(server_url, SCENARIOS, tmp_path_factory.mktemp("server-runs"))


@pytest.fixture(scope="module")
def broker_runs(front: Front, tmp_path_factory: pytest.TempPathFactory) -> dict[str, runner.Run]:
    return runner.run_all(f"{front.proxy.url}/mcp", SCENARIOS, tmp_path_factory.mktemp("broker-runs"))


def assert_passed(scenario: str, result: runner.Run) -> None:
    assert result.checks, f"{scenario}: the runner wrote no checks:\n{result.output}"
    problems = result.problems()
    assert problems == [], f"{scenario}: {problems}\n{result.output}"
    assert result.returncode == 0, result.output
    assert any(c["status"] == "SUCCESS" for c in result.checks), result.checks


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_the_server_alone_passes(server_runs: dict[str, runner.Run], scenario: str) -> None:
    assert_passed(scenario, server_runs[scenario])


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_the_broker_passes(front: Front, broker_runs: dict[str, runner.Run], scenario: str) -> None:
    assert_passed(scenario, broker_runs[scenario])
    # Every request went through the front and got its bearer (the runner sends none).
    assert front.proxy.injected == front.proxy.forwarded > 0
    if scenario == "dns-rebinding-protection":
        # The hostile Host/Origin were refused by the broker itself (the proxy refuses nothing),
        # and audited; no other scenario sends an Origin.
        refused = [e for e in front.broker.audit_events() if e.get("reason") == "origin_not_allowed"]
        assert [(e["outcome"], e["status"]) for e in refused] == [("denied", 403)]
        broker = front.broker
        assert "evil.example.com" not in broker.audit_file.read_text() + broker.logs()
