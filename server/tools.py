"""The bodies of the three tools: raw arguments in, a `ToolResult` out, never an exception.

Each body validates its own input (the broker does too, but the server trusts nothing it is
sent), then works through `Workspace`. Results carry fixed messages only.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any

from pydantic import ValidationError

from server import contracts as c
from server.approval import ApprovalVerifier, Expected, content_sha256
from server.contracts import Message, Status, ToolResult
from server.workspace import ReadFailure, ReadOk, Workspace, WriteOutcome

log = logging.getLogger("docbroker.server")

_READ_FAILURES: dict[ReadFailure, tuple[Status, Message]] = {
    ReadFailure.NOT_FOUND: (Status.FAILED, Message.NOT_FOUND),
    ReadFailure.NOT_REGULAR: (Status.REJECTED, Message.NOT_REGULAR),
    ReadFailure.TOO_LARGE: (Status.REJECTED, Message.TOO_LARGE),
    ReadFailure.NOT_UTF8: (Status.REJECTED, Message.NOT_UTF8),
    ReadFailure.IO_ERROR: (Status.FAILED, Message.READ_FAILED),
}


class DocumentTools:
    """One tenant's tools over one workspace."""

    def __init__(self, workspace: Workspace, verifier: ApprovalVerifier, tenant: str) -> None:
        self._workspace = workspace
        self._verifier = verifier
        self._tenant = tenant

    def handlers(self) -> dict[str, Callable[[Mapping[str, Any]], ToolResult[Any]]]:
        return {
            c.TOOL_SEARCH: self.search_documents,
            c.TOOL_READ: self.read_document,
            c.TOOL_SAVE: self.save_report,
        }

    def search_documents(self, arguments: Mapping[str, Any]) -> ToolResult[c.SearchData]:
        args = _parse(c.SearchInput, arguments)
        if args is None:
            return ToolResult.error(Status.REJECTED, Message.INVALID_INPUT)
        hits: list[c.Hit] = []
        examined = skipped = 0
        truncated = False
        try:
            names = self._workspace.source_names(c.MAX_SCAN_ENTRIES + 1)
            for name in names:
                if examined == c.MAX_SCAN_ENTRIES or len(hits) == args.max_results:
                    truncated = True  # an entry is left unexamined: more may exist
                    break
                examined += 1
                if not c.FILENAME_RE.fullmatch(name):
                    skipped += 1
                    continue
                read = self._workspace.read_source(name, c.MAX_DOCUMENT_BYTES)
                if not isinstance(read, ReadOk):
                    skipped += 1
                    continue
                at = read.text.find(args.query)
                if at >= 0:
                    hits.append(c.Hit(filename=name, excerpt=_excerpt(read.text, at, len(args.query))))
        except OSError:
            return ToolResult.error(Status.FAILED, Message.SEARCH_FAILED)
        data = c.SearchData(hits=hits, examined=examined, skipped=skipped, truncated=truncated)
        return ToolResult.ok(Message.SEARCHED, data)

    def read_document(self, arguments: Mapping[str, Any]) -> ToolResult[c.ReadData]:
        args = _parse(c.ReadInput, arguments)
        if args is None:
            return ToolResult.error(Status.REJECTED, _input_message(arguments))
        read = self._workspace.read_source(args.filename, c.MAX_DOCUMENT_BYTES)
        if isinstance(read, ReadOk):
            return ToolResult.ok(Message.READ, c.ReadData(filename=args.filename, content=read.text))
        return ToolResult.error(*_READ_FAILURES[read])

    def save_report(self, arguments: Mapping[str, Any]) -> ToolResult[c.SaveData | c.PendingApprovalData]:
        args = _parse(c.SaveInput, arguments)
        if args is None:
            return ToolResult.error(Status.REJECTED, _input_message(arguments))
        data = args.content.encode("utf-8")  # the model checked it is encodable and small enough
        expected = Expected(self._tenant, c.TOOL_SAVE, args.filename, content_sha256(args.content))
        if not self._verifier.verify(args.approval_token, expected):
            log.info("save_report rejected: approval")
            return ToolResult.error(Status.REJECTED, Message.APPROVAL_INVALID)
        outcome = self._workspace.create_report(args.filename, data)
        log.info("save_report: %s", outcome.value)
        match outcome:
            case WriteOutcome.CREATED:
                return ToolResult.ok(Message.SAVED, c.SaveData(filename=args.filename, bytes=len(data)))
            case WriteOutcome.EXISTS:
                return ToolResult.error(Status.REJECTED, Message.REPORT_EXISTS)
            case WriteOutcome.NOT_CREATED:
                return ToolResult.error(Status.FAILED, Message.WRITE_FAILED)
            case WriteOutcome.UNKNOWN:
                return ToolResult.error(Status.RESULT_UNKNOWN, Message.WRITE_UNKNOWN)


def _parse(model: type[c.StrictInput], arguments: Mapping[str, Any]) -> Any:
    try:
        return model.model_validate(dict(arguments))
    except ValidationError as exc:
        # Declared field names only: values are the caller's data and never reach a log, and
        # neither are the names of unknown fields, which the caller chose freely.
        fields = sorted({_field_label(model, err["loc"]) for err in exc.errors()})
        log.info("%s rejected input fields: %s", model.__name__, fields)
        return None


def _field_label(model: type[c.StrictInput], loc: tuple[int | str, ...]) -> str:
    head = loc[0] if loc else None
    return head if isinstance(head, str) and head in model.model_fields else "<unknown>"


def _input_message(arguments: Mapping[str, Any]) -> Message:
    """A bad filename gets its own category; any other input problem the generic one."""
    name = arguments.get("filename")
    if isinstance(name, str) and not c.FILENAME_RE.fullmatch(name):
        return Message.INVALID_FILENAME
    return Message.INVALID_INPUT


def _excerpt(text: str, at: int, length: int) -> str:
    """A window of at most EXCERPT_CHARS around the first match, on one line, query intact."""
    room = max(c.EXCERPT_CHARS - length, 0)
    start = max(at - room // 2, 0)
    end = min(start + c.EXCERPT_CHARS, len(text))
    start = max(end - c.EXCERPT_CHARS, 0)
    return text[start:end].translate(_ONE_LINE)


_ONE_LINE = {ord(ch): " " for ch in "\r\n\t\v\f"}
