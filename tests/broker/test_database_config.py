"""PostgreSQL without TLS (issue 24, item 13): a `DOCBROKER_DATABASE_URL` that reaches its
server over the network must ask for `sslmode=verify-full`, or the broker refuses to start.

Approvals, the reports awaiting them and their decisions cross that connection: without TLS
anyone on the path reads and rewrites them; with `require` or `verify-ca` a machine in the
path (or any holder of a certificate from the same CA) can still pose as the server. A unix
socket never leaves the host and needs none. `DOCBROKER_DATABASE_ALLOW_INSECURE_TRANSPORT=1`
is the explicit way to accept the risk (a lab whose database is on the node).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from broker.settings import RuntimeKind, Settings, SettingsError
from broker.testing import make_broker
from tests.broker.support import serve_once

BASE = {
    "DOCBROKER_AUTH_ISSUER": "https://issuer.example",
    "DOCBROKER_AUTH_AUDIENCE": "docbroker",
    "DOCBROKER_AUTH_JWKS_URL": "https://issuer.example/jwks.json",
}
NETWORK = "postgresql://docbroker:s3cret@db.example.com:5432/docbroker"
INSECURE_MODES = ("disable", "allow", "prefer", "require", "verify-ca")


@pytest.mark.parametrize(
    "env",
    [
        {"DOCBROKER_DATABASE_URL": NETWORK},
        *({"DOCBROKER_DATABASE_URL": f"{NETWORK}?sslmode={mode}"} for mode in INSECURE_MODES),
        # loopback TCP is still TCP: any local user may listen there first
        {"DOCBROKER_DATABASE_URL": "postgresql://docbroker:s3cret@[::1]:5432/docbroker"},
        {"DOCBROKER_DATABASE_URL": "postgresql://docbroker:s3cret@/docbroker?hostaddr=10.0.0.5"},
        {"DOCBROKER_DATABASE_URL": "postgresql://docbroker:s3cret@/docbroker?host=/run/pg,db.example.com"},
        # What the URL leaves out, libpq takes from its own variables and a service file.
        {"DOCBROKER_DATABASE_URL": "postgresql://docbroker:s3cret@/docbroker", "PGHOST": "db.example.com"},
        {"DOCBROKER_DATABASE_URL": "postgresql://docbroker:s3cret@/docbroker?service=prod"},
        {"DOCBROKER_DATABASE_URL": NETWORK, "DOCBROKER_DATABASE_ALLOW_INSECURE_TRANSPORT": "maybe"},
    ],
)
def test_a_database_over_the_network_without_verify_full_is_refused(env: dict[str, str]) -> None:
    with pytest.raises(SettingsError) as caught:
        Settings.from_env(BASE | env)
    message = str(caught.value)
    assert "DOCBROKER_DATABASE_" in message
    assert "s3cret" not in message and "example.com" not in message and "10.0.0.5" not in message


@pytest.mark.parametrize(
    "env",
    [
        {"DOCBROKER_DATABASE_URL": f"{NETWORK}?sslmode=verify-full&sslrootcert=/etc/ssl/db-ca.pem"},
        {"DOCBROKER_DATABASE_URL": NETWORK, "PGSSLMODE": "verify-full"},
        {"DOCBROKER_DATABASE_URL": "postgresql://docbroker@/docbroker"},  # the default socket
        {"DOCBROKER_DATABASE_URL": "postgresql://docbroker@/docbroker?host=/run/postgresql"},
        {"DOCBROKER_DATABASE_URL": "postgresql://docbroker@%2Frun%2Fpostgresql/docbroker"},
        {"DOCBROKER_DATABASE_URL": "postgresql://docbroker@/docbroker?host=@pg-abstract"},
        {"DOCBROKER_DATABASE_URL": NETWORK, "DOCBROKER_DATABASE_ALLOW_INSECURE_TRANSPORT": "1"},
    ],
)
def test_a_socket_verify_full_or_the_explicit_setting_is_accepted(env: dict[str, str]) -> None:
    assert Settings.from_env(BASE | env).database.url == env["DOCBROKER_DATABASE_URL"]


def test_the_broker_refuses_to_start_on_a_plain_tcp_database_in_one_line(tmp_path: Path) -> None:
    broker = make_broker(tmp_path, env={"DOCBROKER_DATABASE_URL": NETWORK})
    done = serve_once(broker)
    assert done.returncode != 0
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
    assert "DOCBROKER_DATABASE_ALLOW_INSECURE_TRANSPORT" in lines[0]
    assert "s3cret" not in done.stderr and "example.com" not in done.stderr


# SQLite is one broker's file (issue 38): replicas each with their own would each keep
# their own approvals, and a broker Pod's data dir goes with the Pod.
KUBE = {"DOCBROKER_RUNTIME": "kubernetes", "DOCBROKER_KUBE_SERVER_IMAGE": "s@sha256:" + "a" * 64,
        "DOCBROKER_KUBE_KEEPER_IMAGE": "k@sha256:" + "b" * 64}  # fmt: skip
SOCKET_DB = {"DOCBROKER_DATABASE_URL": "postgresql://docbroker@/docbroker"}


@pytest.mark.parametrize(
    ("env", "named"),
    [
        ({"DOCBROKER_REPLICAS": "2"}, "DOCBROKER_REPLICAS"),
        (KUBE, "DOCBROKER_RUNTIME"),
        (KUBE | {"DOCBROKER_REPLICAS": "3"}, "DOCBROKER_REPLICAS"),
    ],
)
def test_sqlite_is_refused_with_replicas_or_in_a_broker_pod(env: dict[str, str], named: str) -> None:
    with pytest.raises(SettingsError, match="DOCBROKER_DATABASE_URL") as err:
        Settings.from_env(BASE | env)
    assert named in str(err.value)
    assert Settings.from_env(BASE | env | SOCKET_DB).database.url is not None  # PostgreSQL: fine


def test_sqlite_stays_for_one_broker_and_for_a_host_broker_on_a_kubeconfig() -> None:
    assert Settings.from_env(BASE).server.replicas == 1
    # A broker process on a host with a kubeconfig (development, the lab's host broker) keeps
    # its data dir across restarts like any host broker.
    on_host = Settings.from_env(BASE | KUBE | {"DOCBROKER_KUBECONFIG": "/etc/docbroker/kubeconfig"})
    assert on_host.runtime.kind is RuntimeKind.KUBERNETES and on_host.database.url is None


def test_the_broker_refuses_sqlite_with_two_replicas_in_one_line(tmp_path: Path) -> None:
    done = serve_once(make_broker(tmp_path, env={"DOCBROKER_REPLICAS": "2"}))
    assert done.returncode != 0
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
    assert "DOCBROKER_REPLICAS" in lines[0] and "DOCBROKER_DATABASE_URL" in lines[0]
