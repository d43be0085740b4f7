"""Where the broker listens and is reached, who may read its operators' surfaces, and how many
replicas share the deployment."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from broker.settings.reader import PREFIX, Reader, SettingsError, origin_of


@dataclass(frozen=True)
class ServerSettings:
    host: str = "127.0.0.1"
    port: int = 8080
    public_url: str = "http://127.0.0.1:8080"  # base of approve_url and the resource metadata
    # Origins a request may carry (DNS rebinding): the public URL's own and any listed.
    allowed_origins: tuple[str, ...] = ()
    # How many replicas serve the deployment: each enforces its share of a tenant's limits.
    replicas: int = 1
    # The operators' bearer tokens for /metrics and /readyz's details (broker/auth/ops.py);
    # None: nobody reads them.
    ops_token_file: Path | None = None


def server_settings(r: Reader) -> ServerSettings:
    host, port, url = _address(r)
    own_origin = origin_of(url)
    assert own_origin is not None  # _address refuses a URL without one
    return ServerSettings(
        host=host,
        port=port,
        public_url=url,
        allowed_origins=r.origins(
            "ALLOWED_ORIGINS",
            own_origin,
            doc=(
                "origins (`https://host[:port]`, comma-separated) a request's `Origin` may name besides "
                "the public URL's own; any other present `Origin` gets 403"
            ),
        ),
        replicas=r.integer(
            "REPLICAS",
            1,
            low=1,
            high=1000,
            doc=(
                "how many replicas serve the deployment (1-1000): each enforces ceil(limit / N) of every "
                "tenant's rate, burst, `max_concurrent` and `max_streams` (see Replicas); above 1 it needs "
                "`DOCBROKER_DATABASE_URL` (the broker refuses to start on SQLite)"
            ),
        ),
        ops_token_file=r.path(
            "OPS_TOKEN_FILE",
            doc=(
                "operators' bearer tokens, one per line (32+ characters; mode 0600): they alone read "
                "`/metrics` and the checks of `/readyz` (see Surfaces)"
            ),
        ),
    )


def public_url(r: Reader) -> str:
    """DOCBROKER_PUBLIC_URL, or `http://HOST:PORT`: where clients (and the client commands)
    reach the broker."""
    return _address(r)[2]


def _address(r: Reader) -> tuple[str, int, str]:
    host = r.text("HOST", "127.0.0.1", doc="the address to listen on")
    port = r.integer("PORT", 8080, low=1, high=65535, doc="the port to listen on")
    url = r.text(
        "PUBLIC_URL",
        f"http://{host}:{port}",
        doc=(
            "base of `approve_url` and the resource metadata (default `http://HOST:PORT`); the client "
            "commands (`approvals`, `client-config`) reach the broker there"
        ),
    ).rstrip("/")
    if origin_of(url) is None:
        raise SettingsError(f"{PREFIX}PUBLIC_URL must be an http(s) URL")
    return host, port, url
