"""The sandbox's answer to one request, checked; what the client gets instead.

Handshake answers are rebuilt (broker.gateway.results.handshake); a `tools/call` result is
validated against the broker's own contract (results.consume); an approved save's report must
then pass the drop-box's sha256 check, and a sandbox that claims a report already exists is
believed only if the broker's own store has it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from broker.approvals.reports import Accepted, Reports
from broker.gateway import results
from broker.gateway.record import CallRecord
from broker.protocol import answers, inbound
from broker.protocol import jsonrpc as rpc
from broker.types import Outcome, Principal
from server import contracts as c

_OUTCOMES = {outcome.value: outcome for outcome in Outcome}  # a dict: Outcome(x) is much slower


class Consumer:
    def __init__(self, reports_for: Callable[[str], Reports], max_response_bytes: int) -> None:
        self._reports_for = reports_for
        self._max_response = max_response_bytes

    async def __call__(
        self,
        principal: Principal,
        reply: dict[str, Any],
        size: int,
        msg: rpc.RpcMessage,
        descriptor: dict[str, Any] | None,
        record: CallRecord,
    ) -> dict[str, Any]:
        """The client's answer to `msg`, given the sandbox's `reply` of `size` bytes."""
        save = record.save
        if save is None and "result" not in reply and isinstance(reply.get("error"), dict):
            # The server refused the client's own request (its params, its version, its
            # method): the client's error, passed on as one, not a sandbox failure — never
            # counted by the breaker (the sandbox answered). A save is another matter: what
            # the sandbox did with an approved write is only known from a valid result.
            record.end(Outcome.ERROR, "request_invalid")
            return inbound.sandbox_error(msg.id, reply["error"])
        if msg.method != "tools/call" or descriptor is None:
            result = reply.get("result")
            clean = results.handshake(msg.method or "", result) if isinstance(result, dict) else None
            if clean is None:
                record.end(Outcome.ERROR, "upstream_invalid")
                return rpc.error(msg.id, rpc.INTERNAL_ERROR, "Tool sandbox returned an error")
            record.end(Outcome.OK, "ok")
            return rpc.result(msg.id, clean)
        arguments = save.arguments if save is not None else msg.arguments
        consumed = results.consume(reply, record.tool or "", arguments, size, self._max_response)
        record.end(_OUTCOMES[consumed.status], consumed.reason)
        result = consumed.result
        if save is not None and consumed.status == c.Status.OK.value:
            accepted = await self._reports_for(principal.tenant).accept(save.filename, save.sha256)
            if accepted is not Accepted.OK:
                record.end(Outcome.RESULT_UNKNOWN, f"report_{accepted.value}")
                result = answers.write_unknown()
        elif save is not None and _says_report_exists(result):
            # Only the broker's store knows which reports exist; the drop-box was emptied just
            # before this save, so a sandbox that says "exists" and has no such report lies.
            if not await self._reports_for(principal.tenant).exists(save.filename):
                record.end(Outcome.FAILED, "report_exists_unconfirmed")
                result = answers.write_failed()
        return rpc.result(msg.id, answers.typed(msg, result))


def _says_report_exists(result: dict[str, Any]) -> bool:
    structured = result.get("structuredContent")
    return isinstance(structured, dict) and structured.get("message") == c.Message.REPORT_EXISTS.value
