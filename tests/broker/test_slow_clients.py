"""Slow and idle clients, from the attacker's side: no connection is held for free (slowloris).

A broker of its own with a 1 s read deadline and room for 8 connections. Raw sockets, since
an HTTP client library would not send a head a byte at a time or promise a body it never sends.
"""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator

import pytest
from harness import Broker, running_broker
from support import events_since, last_seq, modern_body, modern_headers, terminal, wait_for

from broker.settings import Settings, SettingsError

READ_TIMEOUT = 1.0
MAX_CONNECTIONS = 8
CUT_WITHIN = READ_TIMEOUT + 1.5  # the deadline, plus scheduling slack on a busy 2-core CI


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Broker]:
    env = {"DOCBROKER_READ_TIMEOUT": str(READ_TIMEOUT), "DOCBROKER_MAX_CONNECTIONS": str(MAX_CONNECTIONS)}
    with running_broker(tmp_path_factory.mktemp("slow-clients"), env=env) as b:
        yield b


def connect(broker: Broker) -> socket.socket:
    host, port = broker.url.removeprefix("http://").split(":")
    sock = socket.create_connection((host, int(port)), timeout=10)
    return sock


def read_until_closed(sock: socket.socket, limit: float = 10.0) -> bytes:
    """Everything the broker sends until it closes the connection (fails after `limit` s)."""
    sock.settimeout(limit)
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
    return data


def status_of(response: bytes) -> int:
    return int(response.split(b" ", 2)[1])


def request_bytes(broker: Broker, method: str, path: str, body: bytes = b"", **headers: str) -> bytes:
    head = f"{method} {path} HTTP/1.1\r\nhost: {broker.url.removeprefix('http://')}\r\n"
    head += "".join(f"{k.replace('_', '-')}: {v}\r\n" for k, v in headers.items())
    if body:
        head += f"content-length: {len(body)}\r\n"
    return head.encode() + b"\r\n" + body


def read_timeouts(broker: Broker) -> float:
    """The broker's `docbroker_read_timeouts_total`, as /metrics shows it."""
    with connect(broker) as sock:
        sock.sendall(request_bytes(broker, "GET", "/metrics", connection="close"))
        text = read_until_closed(sock).decode()
    [line] = [x for x in text.splitlines() if x.startswith("docbroker_read_timeouts_total ")]
    return float(line.split()[1])


def test_a_silent_connection_gets_408_and_is_closed_at_the_deadline(broker: Broker) -> None:
    cuts = read_timeouts(broker)
    with connect(broker) as sock:
        started = time.monotonic()
        response = read_until_closed(sock)
        elapsed = time.monotonic() - started
    assert status_of(response) == 408
    assert json.loads(response.split(b"\r\n\r\n", 1)[1]) == {
        "error": "request_timeout",
        "error_description": "the request was not received in time",
    }
    assert READ_TIMEOUT * 0.9 <= elapsed < CUT_WITHIN
    assert read_timeouts(broker) == cuts + 1  # operators see the cuts: no audit line without an identity


def test_a_head_sent_a_byte_at_a_time_is_cut_at_the_deadline_not_renewed_per_byte(broker: Broker) -> None:
    head = request_bytes(broker, "GET", "/healthz")
    with connect(broker) as sock:
        started = time.monotonic()
        sock.settimeout(0.15)
        response = b""
        for byte in head[:-2]:  # never the final CRLF: the head is never complete
            try:
                sock.sendall(bytes([byte]))
                response += sock.recv(65536)
            except TimeoutError:
                continue
            except (BrokenPipeError, ConnectionResetError):
                break
            if response:
                break
        response += read_until_closed(sock)
        elapsed = time.monotonic() - started
    assert status_of(response) == 408
    assert elapsed < CUT_WITHIN


def test_a_body_promised_and_never_sent_is_cut_and_audited_as_a_read_timeout(broker: Broker) -> None:
    before = last_seq(broker)
    head = request_bytes(
        broker,
        "POST",
        "/mcp",
        authorization=f"Bearer {broker.token()}",
        content_type="application/json",
        content_length="4096",
    )
    with connect(broker) as sock:
        sock.sendall(head + b'{"jsonrpc": "2.0", ')
        started = time.monotonic()
        response = read_until_closed(sock)
        elapsed = time.monotonic() - started
    assert status_of(response) == 408
    assert elapsed < CUT_WITHIN
    assert wait_for(lambda: bool(terminal(events_since(broker, before))), timeout=5)
    [event] = terminal(events_since(broker, before))
    assert (event["event"], event["outcome"], event["reason"]) == ("mcp.request", "error", "read_timeout")
    assert event["tenant"] == "acme" and event["status"] == 408


def test_a_slow_request_that_arrives_in_time_is_served_however_long_the_answer_takes(broker: Broker) -> None:
    # tools/list starts the tenant's sandbox (a few seconds, well past the read deadline): the
    # deadline covers reading the request only, never the answer.
    body = json.dumps(modern_body("tools/list")).encode()
    request = request_bytes(
        broker,
        "POST",
        "/mcp",
        body,
        authorization=f"Bearer {broker.token(tenant='globex')}",
        connection="close",
        **{k.replace("-", "_"): v for k, v in modern_headers("tools/list").items()},
    )
    with connect(broker) as sock:
        third = len(request) // 3
        for piece in (request[:third], request[third : 2 * third], request[2 * third :]):
            sock.sendall(piece)
            time.sleep(READ_TIMEOUT / 5)
        response = read_until_closed(sock, limit=60)
    assert status_of(response) == 200, response[:300]
    payload = response.split(b"\r\n\r\n", 1)[1]
    assert b'"search_documents"' in payload


def test_the_deadline_is_per_request_so_a_kept_alive_connection_lives_on(broker: Broker) -> None:
    with connect(broker) as sock:
        for _ in range(3):  # 3 requests over ~2.4 s: longer than one read deadline in all
            sock.sendall(request_bytes(broker, "GET", "/healthz"))
            sock.settimeout(5)
            answer = sock.recv(65536)
            assert status_of(answer) == 200, answer
            time.sleep(READ_TIMEOUT * 0.8)


def test_past_the_connection_cap_requests_get_503_until_the_idle_ones_are_cut(broker: Broker) -> None:
    idle = [connect(broker) for _ in range(MAX_CONNECTIONS)]
    try:
        with connect(broker) as sock:
            sock.sendall(request_bytes(broker, "GET", "/healthz", connection="close"))
            assert status_of(read_until_closed(sock)) == 503
        for s in idle:  # the deadline frees every slot the attacker held
            assert status_of(read_until_closed(s)) == 408
    finally:
        for s in idle:
            s.close()
    with connect(broker) as sock:
        sock.sendall(request_bytes(broker, "GET", "/healthz", connection="close"))
        assert status_of(read_until_closed(sock)) == 200


def test_the_broker_log_names_no_client_value(broker: Broker) -> None:
    # After the tests above (same module broker): the edge's cuts leave no traceback and no
    # request line, header or token in the broker's own log.
    logs = broker.logs()
    assert "Traceback" not in logs
    assert "Bearer" not in logs and "/healthz" not in logs and "/mcp" not in logs


SETTINGS_BASE = {
    "DOCBROKER_AUTH_ISSUER": "https://issuer.example",
    "DOCBROKER_AUTH_AUDIENCE": "docbroker",
    "DOCBROKER_AUTH_JWKS_URL": "https://issuer.example/jwks.json",
}


def test_the_edge_limits_have_defaults_and_are_read_from_the_environment() -> None:
    default = Settings.from_env(SETTINGS_BASE)
    assert (default.read_timeout_seconds, default.max_connections) == (15.0, 1000)
    env = SETTINGS_BASE | {"DOCBROKER_READ_TIMEOUT": "2.5", "DOCBROKER_MAX_CONNECTIONS": "64"}
    chosen = Settings.from_env(env)
    assert (chosen.read_timeout_seconds, chosen.max_connections) == (2.5, 64)


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("DOCBROKER_READ_TIMEOUT", "0.01"),  # would cut every request
        ("DOCBROKER_READ_TIMEOUT", "601"),  # would let a slow client hold its connection
        ("DOCBROKER_READ_TIMEOUT", "soon"),
        ("DOCBROKER_MAX_CONNECTIONS", "3"),
        ("DOCBROKER_MAX_CONNECTIONS", "-1"),
        ("DOCBROKER_MAX_CONNECTIONS", "many"),
    ],
)
def test_out_of_range_edge_limits_are_refused_naming_the_variable_only(name: str, value: str) -> None:
    with pytest.raises(SettingsError) as caught:
        Settings.from_env(SETTINGS_BASE | {name: value})
    assert name in str(caught.value) and value not in str(caught.value).replace(name, "")
