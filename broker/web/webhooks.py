"""A signed notice of each new pending approval, for chat or a ticket system (issue 26 item 4).

Who should look at `/approvals` learns of a new report from a webhook rather than by polling.

- **Signed like Standard Webhooks** (standardwebhooks.com): `webhook-id` (one per notice, the
  same on every retry: receivers deduplicate by it), `webhook-timestamp` (Unix seconds, of
  this attempt), `webhook-signature: v1,<base64 HMAC-SHA256(secret, id + "." + timestamp +
  "." + body)>`. The secret file holds `whsec_<base64>` (their format) or the raw key.
- **Never the content**, nor the file name (both are the requester's words): the approval's
  id, tenant, size, SHA-256 and the approval URL only.
- **A payload Slack and Teams incoming webhooks take**: the built-in one has `text` (what
  both show) beside the structured fields; `DOCBROKER_WEBHOOK_TEMPLATE_FILE` replaces it with
  any JSON whose strings may hold `{approval_id}`, `{tenant}`, `{bytes}`, `{sha256}`,
  `{approve_url}` (values are placed as JSON strings: nothing can break out of them).
- **Never blocking the request**: the save's answer never waits for a delivery. Notices go to
  a bounded queue; a full queue drops the notice. One worker delivers, retrying non-2xx answers
  and network failures with exponential backoff. Outcomes are counted on /metrics
  (`docbroker_webhooks_total{outcome="delivered|retried|failed|dropped"}`); nothing about the
  URL, the secret or a receiver's answer is logged.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import hashlib
import hmac
import json
import logging
import re
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import httpx2

from broker.approvals.store import Approval
from broker.files import UnsafeFileError, read_bounded, read_secret
from broker.settings import PREFIX, SettingsError, WebhookSettings

log = logging.getLogger("docbroker")

FIELDS = ("approval_id", "tenant", "bytes", "sha256", "approve_url")
MAX_TEMPLATE_BYTES = 16 * 1024
MAX_BACKOFF_SECONDS = 60.0
_PLACEHOLDER = re.compile(r"\{([a-z0-9_]+)\}")
_BAD_TEMPLATE = f"{PREFIX}WEBHOOK_TEMPLATE_FILE must be a JSON object of at most 16 KiB"
DEFAULT_TEMPLATE: dict[str, Any] = {
    "type": "approval.pending",
    "text": "A report of {bytes} bytes from tenant {tenant} waits for approval: {approve_url}",
    "approval_id": "{approval_id}",
    "tenant": "{tenant}",
    "bytes": "{bytes}",
    "sha256": "{sha256}",
    "approve_url": "{approve_url}",
}


@dataclass(frozen=True)
class Notice:
    id: str  # webhook-id: the same for every attempt
    body: bytes


def load_secret(settings: WebhookSettings) -> bytes:
    try:
        raw = read_secret(settings.secret_file, 4096)
    except UnsafeFileError as exc:  # the reason names no content: safe in the one line
        raise SettingsError(f"{PREFIX}WEBHOOK_SECRET_FILE {exc.reason}") from None
    if raw.startswith("whsec_"):
        try:
            key = base64.b64decode(raw.removeprefix("whsec_"), validate=True)
        except binascii.Error:
            raise SettingsError(f"{PREFIX}WEBHOOK_SECRET_FILE: whsec_ must be followed by base64") from None
    else:
        key = raw.encode()
    if len(key) < 16:
        raise SettingsError(f"{PREFIX}WEBHOOK_SECRET_FILE must hold at least 16 bytes of key")
    return key


def load_template(settings: WebhookSettings) -> dict[str, Any]:
    if settings.template_file is None:
        return DEFAULT_TEMPLATE
    try:
        template = json.loads(read_bounded(settings.template_file, MAX_TEMPLATE_BYTES, follow_links=True))
    except (UnsafeFileError, ValueError):
        raise SettingsError(_BAD_TEMPLATE) from None
    if not isinstance(template, dict):
        raise SettingsError(_BAD_TEMPLATE)
    unknown = {name for text in _strings(template) for name in _PLACEHOLDER.findall(text)} - set(FIELDS)
    if unknown:  # a typo would send the braces themselves; refused at start instead
        raise SettingsError(f"{PREFIX}WEBHOOK_TEMPLATE_FILE may use only {', '.join(FIELDS)}")
    return template


def _strings(value: Any) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [s for v in value.values() for s in _strings(v)]
    if isinstance(value, list):
        return [s for v in value for s in _strings(v)]
    return []


def render(template: Any, values: dict[str, Any]) -> Any:
    """The template with each placeholder replaced inside its JSON string (never re-parsed); a
    string that is one placeholder alone becomes the value itself (`bytes` a number)."""
    if isinstance(template, str):
        whole = _PLACEHOLDER.fullmatch(template)
        if whole and whole.group(1) in values:
            return values[whole.group(1)]
        return _PLACEHOLDER.sub(lambda m: str(values.get(m.group(1), m.group(0))), template)
    if isinstance(template, dict):
        return {key: render(value, values) for key, value in template.items()}
    if isinstance(template, list):
        return [render(value, values) for value in template]
    return template


def signature(key: bytes, notice_id: str, timestamp: int, body: bytes) -> str:
    signed = f"{notice_id}.{timestamp}.".encode() + body
    return "v1," + base64.b64encode(hmac.new(key, signed, hashlib.sha256).digest()).decode()


class Webhooks:
    def __init__(
        self,
        settings: WebhookSettings,
        *,
        count: Callable[[str], None],
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._settings = settings
        self._key = load_secret(settings)
        self._template = load_template(settings)
        self._count = count  # outcome → the metrics counter
        self._clock = clock
        self._queue: asyncio.Queue[Notice] = asyncio.Queue(settings.queue_size)
        self._worker: asyncio.Task[None] | None = None

    def pending(self, approval: Approval, approve_url: str) -> None:
        """Queue the notice of a new pending approval; never waits (a full queue drops it)."""
        values: dict[str, Any] = {
            "approval_id": approval.id,
            "tenant": approval.tenant,
            "bytes": approval.bytes,
            "sha256": approval.sha256,
            "approve_url": approve_url,
        }
        body = json.dumps(render(self._template, values), separators=(",", ":")).encode()
        try:
            self._queue.put_nowait(Notice(f"msg_{secrets.token_hex(16)}", body))
        except asyncio.QueueFull:
            self._count("dropped")

    def start(self) -> None:
        self._worker = asyncio.create_task(self._deliver_forever())

    async def close(self) -> None:
        if self._worker is not None:
            self._worker.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._worker

    async def _deliver_forever(self) -> None:
        timeout = httpx2.Timeout(self._settings.timeout_seconds)
        async with httpx2.AsyncClient(timeout=timeout, follow_redirects=False) as http:
            while True:
                notice = await self._queue.get()
                await self._deliver(http, notice)

    async def _deliver(self, http: httpx2.AsyncClient, notice: Notice) -> None:
        delay = self._settings.backoff_seconds
        for attempt in range(self._settings.retries + 1):
            if attempt:
                self._count("retried")
                await asyncio.sleep(delay)
                delay = min(delay * 2, MAX_BACKOFF_SECONDS)
            timestamp = int(self._clock())
            headers = {
                "content-type": "application/json",
                "webhook-id": notice.id,
                "webhook-timestamp": str(timestamp),
                "webhook-signature": signature(self._key, notice.id, timestamp, notice.body),
            }
            try:
                answer = await http.post(self._settings.url, content=notice.body, headers=headers)
            except httpx2.HTTPError as exc:
                log.warning("webhook delivery failed", extra={"error": type(exc).__name__})
                continue
            if 200 <= answer.status_code < 300:
                self._count("delivered")
                return
            log.warning("webhook delivery refused", extra={"status": answer.status_code})
        self._count("failed")
