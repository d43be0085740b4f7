"""Requests that fail before authentication: limited per client address, audited within a bound.

Each request that fails authentication (no token, a bad one, an unknown tenant) or comes from
a refused `Origin` costs its client address one try from a token bucket (`burst` tries,
refilled at `rate` per second). An address whose bucket is empty gets `429` with
`Retry-After` instead of `401` for each token that fails, counted and never audited alone;
a token that verifies is served all the same (`AuthService.authenticate`): what is limited
is the cost of bad tokens, not the service to good ones, so a tenant behind the same NAT or
proxy as a flooder keeps working, with a token it had before or a new one. A limited
address's bad token still costs one signature check (a few tens of µs: far less than the
request around it), and a lookup of an unknown key id stays bounded broker-wide by the key
source's refetch cooldown.

**Behind a reverse proxy** every client has the proxy's address. `TrustedProxies` gives
back each one's own: only a request whose peer is a configured proxy
(`DOCBROKER_TRUSTED_PROXIES`) has its `X-Forwarded-For` read, from the right, skipping
trusted proxies, to the first address that is not one, the client as the outermost trusted
proxy saw it. Everything left of that was written by the client and is never believed
(else each request could name a fresh address, and a fresh budget). A hop that is not an
address stops the walk at the proxy that passed it on.

The audit log fails closed, so an unauthenticated client that could fill its disk could stop
every tenant (one line each was ~1.7 GB an hour from one sequential client). So, broker-wide,
the first `burst` failures of each interval are audited one line each; every other failure,
and every 429, is counted by reason, and `drain()` hands the counts over at the end of the
interval (and at shutdown) for one `auth.denied` line per reason with its `count`. Nothing
goes uncounted, and under any flood the log grows by at most `burst` + one line per reason
per interval, whatever the number of addresses.

Memory is bounded too: at most `max_addresses` buckets. A new address past that takes the
place of the oldest one if that one has refilled (it is owed nothing), else shares one
overflow bucket with every other address that did not fit. Buckets that have refilled are
dropped at each drain, so in normal operation the table is empty and `retry_after` costs one
truth test.

The client address is not written to the audit log: the schema records names, never values
that identify a person or a machine (DESIGN §6), and a count per reason is what an operator
needs to see a flood; the address of one is for the network's own logs.
"""

from __future__ import annotations

import ipaddress
import math
import time
from collections.abc import Awaitable, Callable, Iterable

from starlette.types import Scope

from broker.audit.schema import AuditEvent
from broker.settings import IPNetwork, PreAuthSettings
from broker.types import Outcome

LIMITED = "preauth_limited"  # the reason a 429 of this limiter is counted under

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address


def client_address(scope: Scope) -> str:
    """The client's host: the peer's as the ASGI server saw it ("" for a unix socket), or the
    one `TrustedProxies.rewrite` put in its place."""
    client = scope.get("client")
    return str(client[0]) if client else ""


class TrustedProxies:
    """Which peers may say, in `X-Forwarded-For`, whom they forward for (see the module)."""

    def __init__(self, networks: Iterable[IPNetwork]) -> None:
        self._networks = tuple(networks)

    def rewrite(self, scope: Scope) -> None:
        """Put the forwarded client in `scope["client"]` if the peer is a trusted proxy (as
        uvicorn's proxy middleware does, with its right-most-untrusted rule, minus `scheme`)."""
        if not self._networks:
            return
        peer = _address(client_address(scope))
        if peer is None or not self._trusted(peer):
            return
        hops: list[str] = []
        for name, value in scope["headers"]:
            if name == b"x-forwarded-for":  # several headers are one list, in order (RFC 9110 §5.3)
                hops.extend(value.decode("latin-1").split(","))
        client = peer
        for hop in reversed(hops):
            address = _address(hop.strip())
            if address is None:
                break  # not an address: the proxy that passed it on is the client we know
            client = address
            if not self._trusted(address):
                break
        if client != peer:
            scope["client"] = (str(client), 0)

    def _trusted(self, address: IPAddress) -> bool:
        return any(address in network for network in self._networks)


def _address(text: str) -> IPAddress | None:
    """An address as proxies write it: bare, `v4:port` or `[v6]:port`; IPv4-mapped IPv6 as
    IPv4, so that one client has one spelling (and one bucket)."""
    if text.startswith("["):
        text = text[1 : text.find("]")] if "]" in text else ""
    elif text.count(":") == 1:
        text = text.split(":", 1)[0]
    try:
        address = ipaddress.ip_address(text)
    except ValueError:
        return None
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped
    return address


class _Bucket:
    __slots__ = ("stamp", "tokens")

    def __init__(self, tokens: float, stamp: float) -> None:
        self.tokens = tokens
        self.stamp = stamp


class PreAuthLimiter:
    def __init__(self, settings: PreAuthSettings, clock: Callable[[], float] = time.monotonic) -> None:
        self._rate = settings.rate
        self._burst = float(settings.burst)
        self._max = settings.max_addresses
        self._clock = clock
        self._buckets: dict[str, _Bucket] = {}
        self._overflow = _Bucket(self._burst, clock())
        self._own_lines = settings.burst  # per interval, broker-wide
        self._lines = 0
        self._pending: dict[str, int] = {}

    def retry_after(self, address: str) -> int:
        """0 if `address` may try to authenticate; else the seconds until it may (≥ 1)."""
        if not self._buckets:
            return 0
        bucket = self._buckets.get(address)
        if bucket is None:
            if len(self._buckets) < self._max:
                return 0
            bucket = self._overflow
        tokens = self._refill(bucket, self._clock())
        return 0 if tokens >= 1 else max(1, math.ceil((1 - tokens) / self._rate))

    def failed(self, address: str, reason: str, *, charge: bool = True) -> bool:
        """A request from `address` failed with `reason`. True: audit it on a line of its own;
        False: it is counted for the interval's line. `charge=False` for a failure that is
        not the client's doing (the identity provider's keys are unavailable)."""
        if charge:
            bucket = self._bucket(address)
            bucket.tokens = max(0.0, self._refill(bucket, self._clock()) - 1)
        if self._lines < self._own_lines:
            self._lines += 1
            return True
        self._pending[reason] = self._pending.get(reason, 0) + 1
        return False

    def limited(self) -> None:
        """A request was answered 429 by this limiter: counted, never a line of its own."""
        self._pending[LIMITED] = self._pending.get(LIMITED, 0) + 1

    def drain(self) -> dict[str, int]:
        """The counts since the last drain, by reason; starts a new interval."""
        pending, self._pending, self._lines = self._pending, {}, 0
        now = self._clock()
        for address in [a for a, b in self._buckets.items() if self._refill(b, now) >= self._burst]:
            del self._buckets[address]
        return pending

    def restore(self, counts: dict[str, int]) -> None:
        """Put back counts that could not be written, so they go out with the next interval's."""
        for reason, count in counts.items():
            self._pending[reason] = self._pending.get(reason, 0) + count

    def __len__(self) -> int:
        return len(self._buckets)

    def _bucket(self, address: str) -> _Bucket:
        bucket = self._buckets.get(address)
        if bucket is not None:
            return bucket
        now = self._clock()
        if len(self._buckets) >= self._max:
            oldest = next(iter(self._buckets))
            if self._refill(self._buckets[oldest], now) < self._burst:
                return self._overflow
            del self._buckets[oldest]
        bucket = self._buckets[address] = _Bucket(self._burst, now)
        return bucket

    def _refill(self, bucket: _Bucket, now: float) -> float:
        bucket.tokens = min(self._burst, bucket.tokens + (now - bucket.stamp) * self._rate)
        bucket.stamp = now
        return bucket.tokens


async def write_counts(limiter: PreAuthLimiter, emit: Callable[..., Awaitable[None]]) -> None:
    """One `auth.denied` line per reason with the interval's `count`; what cannot be written
    now is kept for the next interval (so a count is never lost to a full disk)."""
    counts = limiter.drain()
    for reason in list(counts):
        try:
            await emit(AuditEvent.AUTH_DENIED, outcome=Outcome.DENIED, reason=reason, count=counts[reason])
        except Exception:
            limiter.restore(counts)
            raise
        del counts[reason]
