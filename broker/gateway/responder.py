"""One answer per request, sent only once it is audited: the one owner of that rule.

Every way a request ends goes through here: a whole JSON answer, the one answer inside a
stream, a stream's end, or no answer at all (a client that left). The terminal audit event is
written first; if it cannot be, nothing the sandbox said is released: before a response has
started the client gets the audit refusal, after it the connection simply ends.
"""

from __future__ import annotations

import logging
from typing import Any, Protocol

from starlette.types import Send

from broker.audit.schema import AuditEvent
from broker.errors import Denial
from broker.gateway.record import CallRecord
from broker.protocol import answers, inbound
from broker.protocol import jsonrpc as rpc
from server import contracts as c

log = logging.getLogger("docbroker.gateway")

_JSON = (b"content-type", b"application/json")


class AuditLike(Protocol):
    """What the gateway needs of the audit log (see broker.audit)."""

    def check(self) -> None: ...

    async def emit(self, event: AuditEvent, /, **fields: Any) -> None: ...

    def settle(self) -> None: ...


class AuditFailed(Exception):
    """The terminal event could not be written: the answer is held back."""


class Responder:
    """Sends the one HTTP response of a request, whole or as a stream, each after its audit."""

    def __init__(self, send: Send, record: CallRecord, audit: AuditLike) -> None:
        self._send = send
        self._record = record
        self._audit = audit
        self.started = False

    # -- whole answers ----------------------------------------------------------------------

    async def json(self, status: int, body: dict[str, Any], headers: dict[str, str] | None = None) -> None:
        extra = [(k.encode(), v.encode()) for k, v in (headers or {}).items() if k != "content-type"]
        await self.raw(status, rpc.encode(body), [_JSON, *extra])

    async def refuse(self, denial: Denial, headers: dict[str, str] | None = None) -> None:
        """The denial's own status, JSON-RPC code and fixed text. A JSON-RPC-level refusal (a
        200 row) of a 2026-07-28 request takes the status the SDK gives its code (-32601: 404,
        -32602: 400), as the server alone would answer it."""
        body = rpc.error(self._record.rpc_id, denial.code, denial.message)
        status = denial.status
        if status == 200 and self._record.typed_results:
            status = inbound.error_status(denial.code)
        await self.json(status, body, headers)

    async def raw(self, status: int, payload: bytes, headers: list[tuple[bytes, bytes]]) -> None:
        record = self._record
        record.status = status
        record.bytes_out = len(payload)
        try:
            await self.audit()
        except AuditFailed:
            if self.started:
                return
            if record.forwarded and record.tool == c.TOOL_SAVE and record.rpc_id is not None:
                # The write went to the sandbox: it may have happened (it may be in the store
                # now). "Refused" would have the client ask for it again; the one true answer
                # is that its result is unknown (DESIGN §2).
                unknown = answers.write_unknown()
                result = {"resultType": "complete", **unknown} if record.typed_results else unknown
                status, payload = 200, rpc.encode(rpc.result(record.rpc_id, result))
            else:
                denial = Denial.AUDIT_UNAVAILABLE
                refusal = rpc.error(record.rpc_id, denial.code, denial.message)
                status, payload = denial.status, rpc.encode(refusal)
            headers = [_JSON]
        await self._whole(status, payload, headers)

    # -- streams ----------------------------------------------------------------------------

    async def start(self, status: int, headers: list[tuple[bytes, bytes]]) -> None:
        self.started = True
        self._record.status = status
        await self._send({"type": "http.response.start", "status": status, "headers": headers})

    async def chunk(self, data: bytes) -> None:
        """A part of the stream that is not the answer (a notification)."""
        self._record.bytes_out += len(data)
        await self._body(data)

    async def answer(self, framed: bytes) -> None:
        """The request's one answer inside a stream, held until it is audited."""
        self._record.bytes_out += len(framed)
        await self.audit()
        await self._body(framed)

    async def end(self) -> None:
        await self._send({"type": "http.response.body", "body": b""})

    # -- the audit --------------------------------------------------------------------------

    async def audit(self) -> None:
        """Write the terminal event, once; raise AuditFailed if it cannot be written."""
        record = self._record
        if record.audited:
            return
        record.audited = True
        try:
            await self._audit.emit(record.event, **record.audit_fields())
        except Exception:
            log.error("audit write failed; refusing the response")
            raise AuditFailed from None

    def close(self) -> None:
        self._audit.settle()  # the answer has left: finish the audit line's bookkeeping now

    async def _whole(self, status: int, payload: bytes, headers: list[tuple[bytes, bytes]]) -> None:
        if self.started:
            return
        self.started = True
        headers = [*headers, (b"content-length", str(len(payload)).encode())]
        await self._send({"type": "http.response.start", "status": status, "headers": headers})
        await self._send({"type": "http.response.body", "body": payload})

    async def _body(self, data: bytes) -> None:
        await self._send({"type": "http.response.body", "body": data, "more_body": True})
