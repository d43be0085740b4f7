"""What a client must respect: the edge's bounds, failed authentications, a request's size."""

from __future__ import annotations

from dataclasses import dataclass

from broker.settings.reader import IPNetwork, Reader


@dataclass(frozen=True)
class EdgeSettings:
    """What a client must respect before any handler runs (`broker.http_edge`)."""

    read_timeout_seconds: float = 15.0  # a request's head and body must arrive within this
    max_head_bytes: int = 65_536  # request line and headers together; past it, 431
    max_connections: int = 1000  # open client connections; past it, requests get 503


@dataclass(frozen=True)
class PreAuthSettings:
    """How often a client address may fail authentication (`broker.auth.preauth`).

    Each address has a bucket of `burst` failures, refilled at `rate` per second; an empty
    bucket means 429 before any token work. Broker-wide, the first `burst` failures of each
    `interval_seconds` are audited one line each; the others, and every 429, are counted and
    written as one `auth.denied` line per reason at the end of the interval."""

    rate: float = 1.0  # failures per second an address earns back
    burst: int = 20
    interval_seconds: float = 60.0
    max_addresses: int = 4096  # addresses tracked; past it, the others share one bucket
    # Reverse proxies whose X-Forwarded-For names the client (DOCBROKER_TRUSTED_PROXIES); a
    # request from anywhere else is its peer's, whatever it claims.
    trusted_proxies: tuple[IPNetwork, ...] = ()


@dataclass(frozen=True)
class LimitSettings:
    """How much one request, one answer and one session may hold."""

    max_body_bytes: int = 256 * 1024
    max_response_bytes: int = 32_000  # a sandbox's answer to one call
    session_ttl_seconds: int = 86_400  # a legacy session id's lifetime from its initialize


def edge_settings(r: Reader) -> EdgeSettings:
    return EdgeSettings(
        read_timeout_seconds=r.number(
            "READ_TIMEOUT",
            15.0,
            low=0.5,
            high=600,
            doc=(
                "seconds for a request's head and body to arrive; a client that is slower gets 408 and "
                "its connection is closed (slowloris)"
            ),
        ),
        max_head_bytes=r.integer(
            "MAX_HEAD_BYTES",
            65_536,
            low=16 * 1024,
            high=1024 * 1024,
            doc=(
                "request line and headers together, and again everything after the head that is not body "
                "data (chunk framing, trailers); past it, 431 and the connection is closed"
            ),
        ),
        max_connections=r.integer(
            "MAX_CONNECTIONS",
            1000,
            low=8,
            high=1_000_000,
            doc=(
                "open client connections; past it, requests get 503 (keep the process's open-file limit "
                "above it)"
            ),
        ),
    )


def preauth_settings(r: Reader) -> PreAuthSettings:
    return PreAuthSettings(
        rate=r.number(
            "PREAUTH_RATE",
            1.0,
            low=0.01,
            high=10_000,
            doc=(
                "failed authentications per second a client address may have after its burst; past it, "
                "`429` for each token that fails (a token that verifies is always served)"
            ),
        ),
        burst=r.integer(
            "PREAUTH_BURST",
            20,
            low=1,
            high=1_000_000,
            doc=(
                "failed authentications a client address may have at once; also the broker-wide number of "
                "such failures audited one line each per interval"
            ),
        ),
        interval_seconds=r.number(
            "PREAUTH_INTERVAL",
            60.0,
            low=0.5,
            high=3600,
            doc=(
                "seconds; the other failures and the 429s are written as one counted `auth.denied` line "
                "per reason at the end of each (and at shutdown)"
            ),
        ),
        max_addresses=r.integer(
            "PREAUTH_MAX_ADDRESSES",
            4096,
            low=16,
            high=1_000_000,
            doc=("client addresses tracked (memory bound); addresses past it share one bucket"),
        ),
        trusted_proxies=r.networks(
            "TRUSTED_PROXIES",
            doc=(
                "reverse proxies (IP addresses or networks, comma-separated; never all, `0.0.0.0/0`) "
                "whose `X-Forwarded-For` names the client for the pre-auth limit: the right-most address "
                "in it that is not a listed proxy. From any other peer the header is ignored"
            ),
        ),
    )


def limit_settings(r: Reader) -> LimitSettings:
    return LimitSettings(
        max_body_bytes=r.integer(
            "MAX_BODY_BYTES", 256 * 1024, low=16 * 1024, high=16 * 1024 * 1024, doc="request body cap"
        ),
        max_response_bytes=r.integer(
            "MAX_RESPONSE_BYTES",
            32_000,
            low=4_000,
            high=16 * 1024 * 1024,
            doc=(
                "cap on a sandbox's answer to one call (4000-16 MiB); past it the call is `failed` "
                "(`result_unknown` for a save)"
            ),
        ),
        session_ttl_seconds=r.integer(
            "SESSION_TTL",
            86_400,
            low=1,
            high=30 * 86_400,
            doc=(
                "seconds a 2025-11-25 session id is valid after its `initialize` (then 404; the client "
                "initializes again)"
            ),
        ),
    )
