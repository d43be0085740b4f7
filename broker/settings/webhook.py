"""Notices of new pending approvals (broker/web/webhooks.py), signed as Standard Webhooks."""

from __future__ import annotations

import urllib.parse
from dataclasses import dataclass, field
from pathlib import Path

from broker.settings.reader import PREFIX, Reader, SettingsError, loopback


@dataclass(frozen=True)
class WebhookSettings:
    """Notices of new pending approvals (broker/web/webhooks.py), signed as Standard Webhooks."""

    url: str = field(repr=False)  # may hold a token (Slack's and Teams' URLs do): never logged
    secret_file: Path
    template_file: Path | None = None  # None: the built-in payload (Slack and Teams accept it)
    queue_size: int = 100
    retries: int = 5
    backoff_seconds: float = 1.0  # before the first retry; doubled each time, at most 60
    timeout_seconds: float = 5.0


def webhook_settings(r: Reader) -> WebhookSettings | None:
    url = r.optional(
        "WEBHOOK_URL",
        doc=(
            "where a notice of each new pending approval is POSTed (https, or http on loopback): "
            "Slack's or Teams' incoming-webhook URL, or your own. Never the content or file name: id, "
            "tenant, size, SHA-256, approval URL. It may hold a token: never logged"
        ),
    )
    if url is None:
        return None
    parts = urllib.parse.urlsplit(url)
    if not (parts.scheme == "https" or (parts.scheme == "http" and loopback(url))) or not parts.hostname:
        raise SettingsError(f"{PREFIX}WEBHOOK_URL must be an https URL")
    secret_file = r.path(
        "WEBHOOK_SECRET_FILE",
        doc=(
            "the signing key, `whsec_<base64>` (Standard Webhooks) or raw (16+ bytes): "
            "`webhook-signature: v1,<base64 HMAC-SHA256 of id.timestamp.body>` with `webhook-id` and "
            "`webhook-timestamp`"
        ),
    )
    if secret_file is None:
        raise SettingsError(f"{PREFIX}WEBHOOK_SECRET_FILE is required with {PREFIX}WEBHOOK_URL")
    return WebhookSettings(
        url=url,
        secret_file=secret_file,
        template_file=r.path(
            "WEBHOOK_TEMPLATE_FILE",
            doc=(
                "a JSON payload whose strings may hold `{approval_id}`, `{tenant}`, `{bytes}`, "
                "`{sha256}`, `{approve_url}` (any other placeholder is refused at start)"
            ),
        ),
        queue_size=r.integer(
            "WEBHOOK_QUEUE",
            100,
            low=1,
            high=100_000,
            doc=(
                "notices waiting for delivery (1-100000); past it a notice is dropped, counted. A save "
                "never waits for a delivery"
            ),
        ),
        retries=r.integer(
            "WEBHOOK_RETRIES",
            5,
            low=0,
            high=20,
            doc=(
                "retries after a non-2xx answer or a network failure (same `webhook-id`); outcomes on "
                "`/metrics` as `docbroker_webhooks_total{outcome}` (`delivered`, `retried`, `failed`, "
                "`dropped`)"
            ),
        ),
        backoff_seconds=r.number(
            "WEBHOOK_BACKOFF",
            1.0,
            low=0.01,
            high=60,
            doc="the first retry's delay in seconds (doubled each time, at most 60)",
        ),
        timeout_seconds=r.number(
            "WEBHOOK_TIMEOUT", 5.0, low=0.1, high=60, doc="one delivery attempt's timeout, in seconds"
        ),
    )
