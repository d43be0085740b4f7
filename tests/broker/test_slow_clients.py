"""Slow, idle and header-flooding clients, from the attacker's side (`broker/http_edge.py`).

No connection is held for free (slowloris) and no head is buffered without bound. A broker of
its own with a 1 s read deadline, a 16 KiB head cap and room for 8 connections. Raw sockets,
since an HTTP client library would not send a head a byte at a time, promise a body it never
sends, or stream an endless header.
"""

from __future__ import annotations

import contextlib
import json
import secrets
import socket
import time
from collections.abc import Iterator

import pytest

from broker.settings import EdgeSettings, Settings, SettingsError
from broker.testing import Broker, running_broker
from tests.broker.support import events_since, last_seq, modern_body, modern_headers, terminal, wait_for

READ_TIMEOUT = 1.0
MAX_HEAD_BYTES = 16 * 1024
MAX_CONNECTIONS = 8
CUT_WITHIN = READ_TIMEOUT + 1.5  # the deadline, plus scheduling slack on a busy 2-core CI


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Broker]:
    env = {
        "DOCBROKER_READ_TIMEOUT": str(READ_TIMEOUT),
        "DOCBROKER_MAX_HEAD_BYTES": str(MAX_HEAD_BYTES),
        "DOCBROKER_MAX_CONNECTIONS": str(MAX_CONNECTIONS),
    }
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
    if method == "POST" and path.startswith("/mcp"):  # what an MCP client accepts (else the SDK's 406)
        headers.setdefault("accept", "application/json, text/event-stream")
    head += "".join(f"{k.replace('_', '-')}: {v}\r\n" for k, v in headers.items())
    if body:
        head += f"content-length: {len(body)}\r\n"
    return head.encode() + b"\r\n" + body


def cuts(broker: Broker, reason: str) -> float:
    """The broker's `docbroker_connections_cut_total` for `reason`, as /metrics shows it."""
    with connect(broker) as sock:
        sock.sendall(request_bytes(broker, "GET", "/metrics", connection="close", **broker.ops_headers))
        text = read_until_closed(sock).decode()
    prefix = f'docbroker_connections_cut_total{{reason="{reason}"}} '
    return sum(float(x.split()[-1]) for x in text.splitlines() if x.startswith(prefix))


def rss_mib(broker: Broker) -> float:
    assert broker.proc is not None
    with open(f"/proc/{broker.proc.pid}/status") as f:
        return int(next(x for x in f if x.startswith("VmRSS:")).split()[1]) / 1024


def test_a_silent_connection_gets_408_and_is_closed_at_the_deadline(broker: Broker) -> None:
    before = cuts(broker, "read_timeout")
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
    assert cuts(broker, "read_timeout") == before + 1  # no identity, no audit line: a metric


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


def test_a_later_request_on_a_kept_alive_connection_gets_its_own_full_deadline(broker: Broker) -> None:
    # The connection's timer was started for the first request; it must wait again for the
    # second's deadline, not cut the second when the first one's time is up.
    with connect(broker) as sock:
        sock.sendall(request_bytes(broker, "GET", "/healthz"))
        sock.settimeout(5)
        assert status_of(sock.recv(65536)) == 200
        time.sleep(READ_TIMEOUT * 0.6)
        sock.sendall(b"GET /healthz HTTP/1.1\r\n")  # and nothing more
        begun = time.monotonic()
        response = read_until_closed(sock)
        elapsed = time.monotonic() - begun
    assert status_of(response) == 408
    assert READ_TIMEOUT * 0.9 <= elapsed < CUT_WITHIN


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


def test_a_head_within_the_cap_is_served(broker: Broker) -> None:
    with connect(broker) as sock:
        sock.sendall(request_bytes(broker, "GET", "/healthz", connection="close", x_pad="a" * 12_000))
        assert status_of(read_until_closed(sock)) == 200


def test_a_body_far_larger_than_the_head_cap_arrives_whole_with_its_head(broker: Broker) -> None:
    # Head and a 100 KB body in one send: the reads that carry both are larger than the cap,
    # and only the head may be held against it.
    call = {"name": "no_such_tool", "arguments": {"pad": "a" * 100_000}}
    body = json.dumps(modern_body("tools/call", call)).encode()
    headers = {k.replace("-", "_"): v for k, v in modern_headers("tools/call", "no_such_tool").items()}
    token = broker.token()
    request = request_bytes(
        broker, "POST", "/mcp", body, authorization=f"Bearer {token}", connection="close", **headers
    )
    assert len(body) > 6 * MAX_HEAD_BYTES
    with connect(broker) as sock:
        sock.sendall(request)
        response = read_until_closed(sock)
    assert status_of(response) == 400, response[:300]  # -32602 at 2026-07-28
    assert json.loads(response.split(b"\r\n\r\n", 1)[1])["error"]["message"] == "Unknown tool"


def test_pipelined_heads_each_under_the_cap_are_served_though_one_read_holds_more(broker: Broker) -> None:
    # Two requests in one send, each head ~10 KB: together over the 16 KiB cap, which holds
    # per head, so both are answered (in order) and nothing is cut.
    before = cuts(broker, "head_too_large")
    first = request_bytes(broker, "GET", "/healthz", x_pad="a" * 10_000)
    second = request_bytes(broker, "GET", "/healthz", connection="close", x_pad="b" * 10_000)
    with connect(broker) as sock:
        sock.sendall(first + second)
        response = read_until_closed(sock)
    assert response.count(b"HTTP/1.1 200 ") == 2, response[:300]
    assert b"431" not in response
    assert cuts(broker, "head_too_large") == before


@pytest.mark.parametrize(
    ("path", "headers"),
    [
        pytest.param("/healthz", {"x_pad": "a" * (MAX_HEAD_BYTES + 1)}, id="one-long-header"),
        pytest.param("/healthz", {f"x-h{i}": "v" * 60 for i in range(400)}, id="many-short-headers"),
        pytest.param("/healthz?" + "q" * (MAX_HEAD_BYTES + 1), {}, id="long-request-line"),
    ],
)
def test_a_head_over_the_cap_gets_431_and_the_connection_is_closed(
    broker: Broker, path: str, headers: dict[str, str]
) -> None:
    before = cuts(broker, "head_too_large")
    with connect(broker) as sock:
        sock.sendall(request_bytes(broker, "GET", path, **headers))
        response = read_until_closed(sock)
    assert status_of(response) == 431
    assert json.loads(response.split(b"\r\n\r\n", 1)[1])["error"] == "headers_too_large"
    assert cuts(broker, "head_too_large") == before + 1


def test_an_endless_header_is_cut_early_not_buffered(broker: Broker) -> None:
    # Before the cap, 200 MB of one header grew the broker by 188 MiB. Now it stops reading
    # after 16 KiB: the sender meets a closed connection long before 64 MB have gone.
    before = rss_mib(broker)
    chunk = b"a" * 1_000_000
    sent = 0
    with connect(broker) as sock:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nhost: x\r\nx-flood: ")
        with contextlib.suppress(BrokenPipeError, ConnectionResetError, TimeoutError):
            while sent < 64_000_000:
                sock.sendall(chunk)
                sent += len(chunk)
        with contextlib.suppress(ConnectionResetError):
            response = read_until_closed(sock)
            assert not response or status_of(response) == 431
    assert sent < 64_000_000
    assert rss_mib(broker) - before < 16


def chunked_request(broker: Broker, body: bytes, trailers: bytes, **headers: str) -> bytes:
    """A chunked POST /mcp of `body` in one chunk, then `trailers` (raw field lines)."""
    head = request_bytes(broker, "POST", "/mcp", transfer_encoding="chunked", **headers)
    return head + b"%x\r\n%s\r\n0\r\n" % (len(body), body) + trailers + b"\r\n"


def tools_list_headers() -> dict[str, str]:
    return {k.replace("-", "_"): v for k, v in modern_headers("tools/list").items()}


def test_a_token_sent_only_in_a_trailer_does_not_authenticate(broker: Broker) -> None:
    # httptools reports trailer fields like header fields; they were appended to the request's
    # headers before its handler ran, and the token was honoured.
    body = json.dumps(modern_body("tools/list")).encode()
    trailer = f"authorization: Bearer {broker.token()}\r\n".encode()
    with connect(broker) as sock:
        sock.sendall(chunked_request(broker, body, trailer, connection="close", **tools_list_headers()))
        response = read_until_closed(sock, limit=60)
    assert status_of(response) == 401, response[:300]


def test_a_small_trailer_is_ignored_and_the_request_served(broker: Broker) -> None:
    body = json.dumps(modern_body("tools/list")).encode()
    trailer = b"x-checksum: 1234\r\nmcp-method: tools/call\r\n"
    request = chunked_request(
        broker, body, trailer, authorization=f"Bearer {broker.token()}", connection="close",
        **tools_list_headers(),
    )  # fmt: skip
    with connect(broker) as sock:
        sock.sendall(request)
        response = read_until_closed(sock, limit=60)
    assert status_of(response) == 200, response[:300]
    assert b'"search_documents"' in response.split(b"\r\n\r\n", 1)[1]


TRAILER_FLOOD = 20 * 1024 * 1024


def flood_trailers(broker: Broker, head_headers: dict[str, str], line: bytes) -> tuple[int, bytes]:
    """A chunked POST /mcp whose trailer lines never end: how much was sent, what came back."""
    head = request_bytes(broker, "POST", "/mcp", transfer_encoding="chunked", **head_headers)
    sent = 0
    response = b""
    with connect(broker) as sock:
        sock.sendall(head + b"2\r\n{}\r\n0\r\n")
        with contextlib.suppress(BrokenPipeError, ConnectionResetError, TimeoutError):
            while sent < TRAILER_FLOOD:
                sock.sendall(line)
                sent += len(line)
        with contextlib.suppress(ConnectionResetError):
            response = read_until_closed(sock)
    return sent, response


@pytest.mark.parametrize(
    "line",
    [
        pytest.param(b"x-t: " + b"a" * 65_530 + b"\r\n", id="64k-trailer-lines"),
        pytest.param(b"a" * 1_000_000, id="one-endless-trailer"),
    ],
)
def test_endless_trailers_before_authentication_are_cut_early_not_buffered(
    broker: Broker, line: bytes
) -> None:
    # Before: 20 MiB of trailer lines took the broker from 79 to 562 MiB, and only the read
    # deadline ended it. Whether the 401 (no token) or the cut comes first, the connection is
    # closed at the cap.
    before = rss_mib(broker)
    sent, response = flood_trailers(broker, {"content_type": "application/json"}, line)
    assert sent < TRAILER_FLOOD
    assert not response or status_of(response) in (401, 431)
    assert rss_mib(broker) - before < 16


def test_endless_trailers_while_the_handler_waits_for_the_body_get_431(broker: Broker) -> None:
    before = cuts(broker, "trailers_too_large")
    headers = {"content_type": "application/json", "authorization": f"Bearer {broker.token()}"}
    sent, response = flood_trailers(broker, headers, b"x-t: " + b"a" * 65_530 + b"\r\n")
    assert sent < TRAILER_FLOOD
    assert status_of(response) == 431
    assert json.loads(response.split(b"\r\n\r\n", 1)[1])["error"] == "trailers_too_large"
    assert cuts(broker, "trailers_too_large") == before + 1


def test_chunk_extensions_count_like_trailers(broker: Broker) -> None:
    # Chunk-size lines and their extensions are not body data either: they count the same way.
    headers = {"content_type": "application/json", "authorization": f"Bearer {broker.token()}"}
    head = request_bytes(broker, "POST", "/mcp", transfer_encoding="chunked", **headers)
    pieces = b"".join(b"1;e=%s\r\n \r\n" % (b"x" * 1000) for _ in range(40))  # 40 KB of framing
    with connect(broker) as sock:
        sock.sendall(head + pieces)
        response = read_until_closed(sock)
    assert status_of(response) == 431


def test_cut_clients_leave_no_value_and_no_traceback_in_the_broker_log(broker: Broker) -> None:
    canary = f"CANARY-{secrets.token_hex(8)}"
    token = broker.token(subject=canary)
    slow_body = request_bytes(
        broker,
        "POST",
        f"/mcp?{canary}",
        authorization=f"Bearer {token}",
        content_type="application/json",
        content_length="4096",
        x_canary=canary,
    )
    flood = request_bytes(broker, "GET", f"/{canary}", x_canary=canary * (MAX_HEAD_BYTES // len(canary) + 1))
    for sent, status in ((slow_body + canary.encode(), 408), (flood, 431), (canary.encode() + b"\r\n", 400)):
        with connect(broker) as sock:
            sock.sendall(sent)
            assert status_of(read_until_closed(sock)) == status
    logs = broker.logs()
    assert canary not in logs and token not in logs
    assert "Traceback" not in logs


SETTINGS_BASE = {
    "DOCBROKER_AUTH_ISSUER": "https://issuer.example",
    "DOCBROKER_AUTH_AUDIENCE": "docbroker",
    "DOCBROKER_AUTH_JWKS_URL": "https://issuer.example/jwks.json",
}


def test_the_edge_limits_have_defaults_and_are_read_from_the_environment() -> None:
    assert Settings.from_env(SETTINGS_BASE).edge == EdgeSettings(15.0, 65_536, 1000)
    env = SETTINGS_BASE | {
        "DOCBROKER_READ_TIMEOUT": "2.5",
        "DOCBROKER_MAX_HEAD_BYTES": "32768",
        "DOCBROKER_MAX_CONNECTIONS": "64",
    }
    assert Settings.from_env(env).edge == EdgeSettings(2.5, 32_768, 64)


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("DOCBROKER_READ_TIMEOUT", "0.01"),  # would cut every request
        ("DOCBROKER_READ_TIMEOUT", "601"),  # would let a slow client hold its connection
        ("DOCBROKER_READ_TIMEOUT", "soon"),
        ("DOCBROKER_MAX_HEAD_BYTES", "1024"),  # under a token's own header cap
        ("DOCBROKER_MAX_HEAD_BYTES", "9999999"),
        ("DOCBROKER_MAX_CONNECTIONS", "3"),
        ("DOCBROKER_MAX_CONNECTIONS", "-1"),
        ("DOCBROKER_MAX_CONNECTIONS", "many"),
    ],
)
def test_out_of_range_edge_limits_are_refused_naming_the_variable_only(name: str, value: str) -> None:
    with pytest.raises(SettingsError) as caught:
        Settings.from_env(SETTINGS_BASE | {name: value})
    assert name in str(caught.value) and value not in str(caught.value).replace(name, "")


def test_a_head_cap_below_what_a_token_may_take_is_refused_at_start() -> None:
    env = SETTINGS_BASE | {"DOCBROKER_AUTH_MAX_HEADER_BYTES": "16384", "DOCBROKER_MAX_HEAD_BYTES": "16384"}
    with pytest.raises(
        SettingsError, match="DOCBROKER_MAX_HEAD_BYTES must exceed DOCBROKER_AUTH_MAX_HEADER_BYTES"
    ):
        Settings.from_env(env)
