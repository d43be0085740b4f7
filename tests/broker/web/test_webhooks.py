"""A signed webhook for each new pending approval (issue 26 item 4), to a real HTTP receiver.

The receiver checks what a Slack, Teams or ticket-system endpoint would get: a Standard
Webhooks signature over id, timestamp and body; never the report's content or file name;
the same id on every retry after a failure; and a broker whose saves never wait for it, even
when it hangs, with what it could not deliver counted on /metrics.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import hmac
import json
import re
import secrets
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx2
import pytest

from broker.testing import Broker, free_port, make_broker, structured
from tests.broker.support import open_mcp, unique, wait_for

pytestmark = pytest.mark.anyio

KEY = secrets.token_bytes(32)
SECRET = "whsec_" + base64.b64encode(KEY).decode()
CONTENT = "the CFO's numbers: 1234 9876\n"


@dataclass
class Receiver:
    """A webhook endpoint: answers each request with the next scripted status (204 once the
    script is done); while `hold` is clear, requests wait before being answered."""

    port: int
    statuses: list[int] = field(default_factory=list)
    received: list[tuple[dict[str, str], bytes]] = field(default_factory=list)
    answered: list[int] = field(default_factory=list)
    hold: threading.Event = field(default_factory=threading.Event)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/hook"


@contextlib.contextmanager
def receiver() -> Iterator[Receiver]:
    state = Receiver(free_port())
    state.hold.set()
    lock = threading.Lock()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers["content-length"]))
            with lock:
                state.received.append(({k.lower(): v for k, v in self.headers.items()}, body))
                status = state.statuses.pop(0) if state.statuses else 204
            state.hold.wait(60)
            self.send_response(status)
            self.send_header("content-length", "0")
            self.end_headers()
            with lock:
                state.answered.append(status)

        def log_message(self, *_: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", state.port), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield state
    finally:
        state.hold.set()
        server.shutdown()
        server.server_close()


@contextlib.contextmanager
def broker_with_webhook(tmp: Path, hook: Receiver, **extra: str) -> Iterator[Broker]:
    secret = tmp / "webhook.secret"
    secret.write_text(SECRET + "\n")
    secret.chmod(0o600)
    env = {
        "DOCBROKER_WEBHOOK_URL": hook.url,
        "DOCBROKER_WEBHOOK_SECRET_FILE": str(secret),
        "DOCBROKER_WEBHOOK_BACKOFF": "0.2",
        "DOCBROKER_WEBHOOK_TIMEOUT": "30",
        **extra,
    }
    broker = make_broker(tmp / "broker", env=env)
    broker.start()
    try:
        yield broker
    finally:
        broker.stop()


async def propose(broker: Broker) -> dict[str, Any]:
    async with open_mcp(broker, broker.token(subject="alice")) as client:
        result = structured(
            await client.call_tool("save_report", {"filename": unique("hook"), "content": CONTENT})
        )
    assert result["status"] == "waiting_approval", result
    return dict(result["data"])


def verified(headers: dict[str, str], body: bytes) -> bool:
    """The Standard Webhooks check a receiver runs."""
    signed = f"{headers['webhook-id']}.{headers['webhook-timestamp']}.".encode() + body
    expected = base64.b64encode(hmac.new(KEY, signed, hashlib.sha256).digest()).decode()
    versions = dict(part.split(",", 1) for part in headers["webhook-signature"].split(" "))
    return hmac.compare_digest(versions.get("v1", ""), expected)


def metric(broker: Broker, outcome: str) -> float:
    text = httpx2.get(f"{broker.url}/metrics", headers=broker.ops_headers).text
    found = re.search(rf'^docbroker_webhooks_total{{outcome="{outcome}"}} (\S+)$', text, re.M)
    return float(found.group(1)) if found else 0.0


async def test_a_new_pending_approval_is_notified_signed_without_content_and_retried(tmp_path: Path) -> None:
    with receiver() as hook, broker_with_webhook(tmp_path, hook) as broker:
        hook.statuses[:] = [500, 503]  # the receiver fails twice, then takes it
        waiting = await propose(broker)
        assert wait_for(lambda: hook.answered == [500, 503, 204], timeout=30), hook.answered
        ids = {headers["webhook-id"] for headers, _ in hook.received}
        assert len(ids) == 1 and re.fullmatch(r"msg_[0-9a-f]{32}", ids.pop())  # one notice, retried
        for headers, body in hook.received:
            assert verified(headers, body)
            assert abs(int(headers["webhook-timestamp"]) - time.time()) < 60
            assert not verified({**headers, "webhook-timestamp": "1"}, body)  # a replayed time fails
        body = hook.received[-1][1]
        payload = json.loads(body)
        assert payload == {
            "type": "approval.pending",
            "text": f"A report of {waiting['bytes']} bytes from tenant acme waits for approval: "
            f"{waiting['approve_url']}",
            "approval_id": waiting["approval_id"],
            "tenant": "acme",
            "bytes": waiting["bytes"],
            "sha256": waiting["sha256"],
            "approve_url": waiting["approve_url"],
        }
        assert CONTENT.encode() not in body and waiting["filename"].encode() not in body
        assert (metric(broker, "retried"), metric(broker, "delivered"), metric(broker, "failed")) == (2, 1, 0)


async def test_a_hanging_receiver_never_holds_a_save_and_a_full_queue_drops_counted(tmp_path: Path) -> None:
    with receiver() as hook, broker_with_webhook(tmp_path, hook, DOCBROKER_WEBHOOK_QUEUE="2") as broker:
        hook.hold.clear()  # the receiver takes requests and does not answer
        await propose(broker)
        assert wait_for(lambda: len(hook.received) == 1, timeout=30)
        began = time.monotonic()
        for _ in range(5):  # one is in the worker's hands, two fit in the queue, three do not
            await propose(broker)
        assert hook.answered == []  # every save above was answered while the receiver hung
        assert time.monotonic() - began < 20
        assert wait_for(lambda: metric(broker, "dropped") == 3, timeout=10)
        hook.hold.set()
        assert wait_for(lambda: metric(broker, "delivered") == 3, timeout=30)


async def test_a_template_shapes_the_payload_for_slack_or_teams(tmp_path: Path) -> None:
    template = tmp_path / "slack.json"
    template.write_text(
        json.dumps({"text": "New report for {tenant} ({bytes} bytes): <{approve_url}|review it>"})
    )
    with (
        receiver() as hook,
        broker_with_webhook(tmp_path, hook, DOCBROKER_WEBHOOK_TEMPLATE_FILE=str(template)) as broker,
    ):
        waiting = await propose(broker)
        assert wait_for(lambda: hook.answered == [204], timeout=30)
        assert json.loads(hook.received[0][1]) == {
            "text": f"New report for acme ({waiting['bytes']} bytes): <{waiting['approve_url']}|review it>"
        }


def test_a_template_with_an_unknown_placeholder_is_refused_at_start(tmp_path: Path) -> None:
    template = tmp_path / "typo.json"
    template.write_text(json.dumps({"text": "{filename} waits"}))  # the file name is never sent
    with receiver() as hook:
        broker = make_broker(tmp_path / "broker", env={
            "DOCBROKER_WEBHOOK_URL": hook.url,
            "DOCBROKER_WEBHOOK_SECRET_FILE": str(tmp_path / "s"),
            "DOCBROKER_WEBHOOK_TEMPLATE_FILE": str(template),
        })  # fmt: skip
        (tmp_path / "s").write_text(SECRET)
        (tmp_path / "s").chmod(0o600)
        with pytest.raises(RuntimeError, match="WEBHOOK_TEMPLATE_FILE may use only"):
            broker.start()
