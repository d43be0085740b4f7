"""Result consumption: a sandbox's `tools/call` answer is checked before a client sees it.

The client gets either a result the broker has validated against its own contract, or a
clean result the broker wrote itself. What the sandbox may return is narrow: one JSON-RPC
result of at most `max_bytes`, whose `structuredContent` validates against the broker's own
result model for the tool (`server.contracts`, never a schema the sandbox published), with a
status the sandbox may produce, one of the fixed messages of that status, data that agrees
with the request (the file asked for, the bytes approved, hits within the asked bound), and
one short text block. The text the client receives is rebuilt from the validated structured
result, so injected content blocks (a prompt injection riding along a valid result) never
pass, and neither does a message the sandbox made up.

For `save_report`, anything but a valid, complete result is `result_unknown`: the write may
or may not have happened, and it is never retried automatically.

The handshake answers (`server/discover`, `initialize`, `ping`) are rebuilt too: the client
learns the sandbox's protocol versions and nothing else it says. Instructions and server info
are the broker's words (a client puts instructions straight into its model's context), and
only the tools capability is advertised, the one the gateway lets through.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from broker.protocol import jsonrpc as rpc
from broker.protocol.answers import broker_result, compact_text, write_unknown
from broker.protocol.versions import META_SERVER_INFO
from server import contracts as c

MAX_TEXT_BLOCK_CHARS = 1_024
_SANDBOX_STATUSES = frozenset(
    {"ok", "rejected", "failed", "result_unknown"}
)  # waiting_approval is the broker's
INVALID_RESULT_MESSAGE = "the tool sandbox returned an invalid result"
INSTRUCTIONS = "Document tools over one tenant's files. Reports need a human's approval."
SERVER_INFO = {"name": "docbroker", "version": "1"}
_VERSION = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}")
_MAX_VERSIONS = 8


# HTTP statuses a sandbox's answer may carry to the client; any other becomes 502. A 401 or
# 403 would make a client drop or refresh a token that is fine, a 3xx would send it elsewhere,
# a 5xx is the sandbox's own failure, which the broker reports as such.
_RELAYED_STATUSES = frozenset({200, 202, 204, 400, 404, 405, 406, 415})


def relay_status(status: int) -> int:
    return status if status in _RELAYED_STATUSES else 502


@dataclass(frozen=True)
class Consumed:
    result: dict[str, Any]  # what the client receives as the JSON-RPC `result`
    status: str  # the tool result status (for the audit outcome)
    reason: str  # fixed code


def consume(
    reply: dict[str, Any], tool: str, arguments: dict[str, Any], size: int, max_bytes: int
) -> Consumed:
    """The client's view of the sandbox's answer to `tools/call` of `tool` with `arguments`
    (as forwarded). `size` is the answer's size in bytes; over `max_bytes` it is refused unread."""
    checked = _check(reply, tool, arguments, size, max_bytes)
    if isinstance(checked, _Valid):
        status = checked.structured["status"]
        clean = {
            "content": [{"type": "text", "text": checked.text}],
            "structuredContent": checked.structured,
            "isError": False,
        }
        if checked.result_type is not None:
            clean["resultType"] = checked.result_type
        return Consumed(clean, status, f"tool_{status}")
    if checked == "tool_error" and tool != c.TOOL_SAVE:
        return Consumed(
            broker_result(c.Status.FAILED, c.Message.READ_FAILED.value), "failed", "tool_is_error"
        )
    if tool == c.TOOL_SAVE:
        return Consumed(write_unknown(), "result_unknown", checked)
    return Consumed(broker_result(c.Status.FAILED, INVALID_RESULT_MESSAGE), "failed", checked)


def notification(message: dict[str, Any], request: rpc.RpcMessage | None) -> dict[str, Any] | None:
    """The client's copy of a notification the sandbox sent in a response stream, or None.

    The real server sends none; a sandbox's notification is rebuilt from the fields that have
    a meaning, each checked, so no text of its own rides along: progress only for the token the
    client gave this request (numbers, no message), a cancellation only of this request (no
    reason). Log messages (`notifications/message`) are the sandbox's words and never pass."""
    params = message.get("params")
    if request is None or "id" in message or not isinstance(params, dict):
        return None
    method = message.get("method")
    if method == "notifications/progress":
        token = request.meta.get("progressToken")
        progress, total = params.get("progress"), params.get("total", 0)
        if token is None or params.get("progressToken") != token:
            return None
        if not (_number(progress) and _number(total)):
            return None
        clean: dict[str, Any] = {"progressToken": token, "progress": progress}
        if "total" in params:
            clean["total"] = total
    elif (
        method == "notifications/cancelled"
        and request.id is not None
        and params.get("requestId") == request.id
    ):
        clean = {"requestId": request.id}
    else:
        return None
    return {"jsonrpc": "2.0", "method": method, "params": clean}


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def handshake(method: str, result: dict[str, Any]) -> dict[str, Any] | None:
    """The client's view of a sandbox's handshake answer, or None if the answer is unusable."""
    if method == "ping":
        return {}
    if method == "server/discover":
        versions = result.get("supportedVersions")
        if (
            not isinstance(versions, list)
            or not 0 < len(versions) <= _MAX_VERSIONS
            or not all(isinstance(v, str) and _VERSION.fullmatch(v) for v in versions)
        ):
            return None
        return {
            "supportedVersions": versions,
            "capabilities": {"tools": {}},
            "instructions": INSTRUCTIONS,
            "resultType": "complete",
            "ttlMs": 0,
            "cacheScope": "private",
            "_meta": {META_SERVER_INFO: SERVER_INFO},
        }
    if method == "initialize":
        version = result.get("protocolVersion")
        if not isinstance(version, str) or not _VERSION.fullmatch(version):
            return None
        return {
            "protocolVersion": version,
            "capabilities": {"tools": {}},
            "serverInfo": SERVER_INFO,
            "instructions": INSTRUCTIONS,
        }
    return None


@dataclass(frozen=True)
class _Valid:
    structured: dict[str, Any]
    text: str  # `structured` as compact JSON: what was validated, and the client's text block
    result_type: str | None


def _check(
    reply: dict[str, Any], tool: str, arguments: dict[str, Any], size: int, max_bytes: int
) -> _Valid | str:
    """The parts of a valid result, or the fixed code of what is wrong with it."""
    if size > max_bytes:
        return "result_too_large"
    if "error" in reply:
        return "upstream_error"
    result = reply.get("result")
    if not isinstance(result, dict):
        return "result_not_object"
    if "resultType" in result and result["resultType"] != "complete":
        return "result_incomplete"
    result_type = result.get("resultType")  # "complete", or absent (the handshake era)
    if result.get("isError") is True:
        return "tool_error"
    structured = result.get("structuredContent")
    if not isinstance(structured, dict) or structured.get("status") not in _SANDBOX_STATUSES:
        return "structured_content_invalid"
    text = compact_text(structured)
    validator = _VALIDATORS.get(tool)
    if validator is None or not _valid(validator, text):
        return "output_schema_mismatch"
    if structured["message"] not in c.RESULT_MESSAGES[tool].get(structured["status"], ()):
        return "message_not_allowed"
    if not _agrees(tool, structured, arguments):
        return "data_disagrees"
    content = result.get("content")
    if not isinstance(content, list) or len(content) != 1:
        return "content_blocks_invalid"
    block = content[0]
    if (
        not isinstance(block, dict)
        or block.get("type") != "text"
        or not isinstance(block.get("text"), str)
        or len(block["text"]) > MAX_TEXT_BLOCK_CHARS
        or set(block) - {"type", "text"}
    ):
        return "content_blocks_invalid"
    return _Valid(structured, text, result_type)


# The broker's own result models, compiled once: the only schema a result is checked against.
_VALIDATORS = {tool: c.RESULT_MODELS[tool].__pydantic_validator__ for tool in c.TOOL_NAMES}


def _valid(validator: Any, text: str) -> bool:
    try:  # strict JSON mode: "1" is not 1, true is not 1, and enums are their JSON strings
        validator.validate_json(text, strict=True)
    except ValidationError:
        return False
    return True


_DATA_KEYS = {
    c.TOOL_SEARCH: frozenset({"hits", "examined", "skipped", "truncated"}),
    c.TOOL_READ: frozenset({"filename", "content"}),
    c.TOOL_SAVE: frozenset({"filename", "bytes"}),  # the pending-approval shape is the broker's
}
_RESULT_KEYS = frozenset({"status", "message", "data"})
_HIT_KEYS = frozenset({"filename", "excerpt"})


def _agrees(tool: str, structured: dict[str, Any], arguments: dict[str, Any]) -> bool:
    """Does the (schema-valid) result say only what the real server says for these arguments?

    The client receives these very objects, and the models ignore unknown keys: every key is
    one the contract names. Only `ok` carries data; names and sizes the server echoes must be
    the ones asked for, so a sandbox cannot put words of its own where a client expects a
    file name or a count."""
    data = structured.get("data")
    if structured.keys() != _RESULT_KEYS:
        return False
    if structured["status"] != c.Status.OK.value:
        return data is None
    if not isinstance(data, dict) or data.keys() != _DATA_KEYS[tool]:
        return False
    if tool == c.TOOL_READ:
        return bool(data["filename"] == arguments.get("filename"))
    if tool == c.TOOL_SAVE:
        return bool(
            data["filename"] == arguments.get("filename")
            and data["bytes"] == _utf8_size(arguments.get("content"))
        )
    hits, examined, skipped = data["hits"], data["examined"], data["skipped"]
    wanted = arguments.get("max_results", c.MAX_SEARCH_RESULTS)
    if not isinstance(wanted, int) or not 0 <= skipped <= examined <= c.MAX_SCAN_ENTRIES:
        return False
    return len(hits) <= min(wanted, c.MAX_SEARCH_RESULTS) and all(
        hit.keys() == _HIT_KEYS
        and c.FILENAME_RE.fullmatch(hit["filename"]) is not None
        and len(hit["excerpt"]) <= c.EXCERPT_CHARS
        for hit in hits
    )


def _utf8_size(content: Any) -> int:
    try:
        return len(content.encode("utf-8")) if isinstance(content, str) else -1
    except UnicodeEncodeError:
        return -1
