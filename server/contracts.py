"""The document tools' public contract: inputs, the one result shape, fixed messages.

Everything a client can see of the server is defined here, so the broker can import the
same models to filter schemas and check results (DESIGN §2).
"""

from __future__ import annotations

import re
from enum import StrEnum
from typing import Annotated, Any, Generic, TypeVar

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, StringConstraints

FILENAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}\.md$"
FILENAME_RE = re.compile(FILENAME_PATTERN)
TENANT_PATTERN = r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$"
TENANT_RE = re.compile(TENANT_PATTERN)

MAX_DOCUMENT_BYTES = 24_000
MAX_REPORT_CHARS = 8_000
MAX_REPORT_BYTES = 24_000
MAX_QUERY_CHARS = 80
MAX_SEARCH_RESULTS = 3
MAX_SCAN_ENTRIES = 64
EXCERPT_CHARS = 160

TOOL_SEARCH = "search_documents"
TOOL_READ = "read_document"
TOOL_SAVE = "save_report"
TOOL_NAMES = (TOOL_SEARCH, TOOL_READ, TOOL_SAVE)


class Status(StrEnum):
    OK = "ok"
    REJECTED = "rejected"
    FAILED = "failed"
    RESULT_UNKNOWN = "result_unknown"
    WAITING_APPROVAL = "waiting_approval"


class Message(StrEnum):
    """Fixed category texts: a message never carries a path, a content or a token."""

    SEARCHED = "search completed"
    READ = "document read"
    SAVED = "report saved"
    INVALID_INPUT = "input does not match the tool's schema"
    INVALID_FILENAME = "filename is not allowed"
    NOT_FOUND = "document not found"
    NOT_REGULAR = "document is not a single regular file"
    TOO_LARGE = "document exceeds the size limit"
    NOT_UTF8 = "document is not valid UTF-8"
    READ_FAILED = "document could not be read"
    SEARCH_FAILED = "search could not be completed"
    APPROVAL_INVALID = "approval token is missing, invalid, expired or already used"
    REPORT_EXISTS = "a report with this name already exists"
    WRITE_FAILED = "report could not be created"
    WRITE_UNKNOWN = "report write did not complete; it may or may not exist"
    WAITING_APPROVAL = "report is waiting for a human's approval"
    INTERNAL = "internal error"


# What each status may say, per tool: the only texts the server produces (server/tools.py).
# The broker accepts no other (a sandbox's own words would reach the client's model).
_READ_REJECTED = frozenset(
    {
        Message.INVALID_INPUT,
        Message.INVALID_FILENAME,
        Message.NOT_REGULAR,
        Message.TOO_LARGE,
        Message.NOT_UTF8,
    }
)
RESULT_MESSAGES: dict[str, dict[str, frozenset[str]]] = {  # keyed by tool, then status
    TOOL_SEARCH: {
        Status.OK: frozenset({Message.SEARCHED}),
        Status.REJECTED: frozenset({Message.INVALID_INPUT}),
        Status.FAILED: frozenset({Message.SEARCH_FAILED}),
    },
    TOOL_READ: {
        Status.OK: frozenset({Message.READ}),
        Status.REJECTED: _READ_REJECTED,
        Status.FAILED: frozenset({Message.NOT_FOUND, Message.READ_FAILED}),
    },
    TOOL_SAVE: {
        Status.OK: frozenset({Message.SAVED}),
        Status.REJECTED: frozenset({Message.INVALID_INPUT, Message.INVALID_FILENAME,
                                    Message.APPROVAL_INVALID, Message.REPORT_EXISTS}),
        Status.FAILED: frozenset({Message.WRITE_FAILED}),
        Status.RESULT_UNKNOWN: frozenset({Message.WRITE_UNKNOWN}),
    },
}  # fmt: skip


# --- inputs ---------------------------------------------------------------------------------

Filename = Annotated[str, StringConstraints(pattern=FILENAME_PATTERN, min_length=4, max_length=67)]


class StrictInput(BaseModel):
    # strict: JSON `true` is not the integer 1; forbid: an unknown field is an error, not ignored.
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


class SearchInput(StrictInput):
    query: Annotated[
        str,
        Field(min_length=1, max_length=MAX_QUERY_CHARS, description="Literal, case-sensitive text to find"),
    ]
    max_results: Annotated[int, Field(ge=1, le=MAX_SEARCH_RESULTS, description="Hits to return")] = (
        MAX_SEARCH_RESULTS
    )


class ReadInput(StrictInput):
    filename: Annotated[Filename, Field(description="A file in the sources folder, e.g. notes.md")]


def _fits_report(content: str) -> str:
    # Characters and bytes are both limited; a lone surrogate survives JSON decoding but has
    # no UTF-8 form, so it cannot be written (or hashed for an approval) either.
    try:
        size = len(content.encode("utf-8"))
    except UnicodeEncodeError:
        raise ValueError("content is not valid Unicode text") from None
    if size > MAX_REPORT_BYTES:
        raise ValueError("content exceeds the byte limit")
    return content


ReportContent = Annotated[
    str,
    Field(min_length=1, max_length=MAX_REPORT_CHARS, description="Markdown text"),
    AfterValidator(_fits_report),
]


class SaveInput(StrictInput):
    filename: Annotated[Filename, Field(description="Name of the new report, e.g. summary.md")]
    content: ReportContent
    approval_token: Annotated[
        str, Field(min_length=1, max_length=2048, description="Set by the broker after a human approved")
    ]


INPUT_MODELS: dict[str, type[StrictInput]] = {
    TOOL_SEARCH: SearchInput,
    TOOL_READ: ReadInput,
    TOOL_SAVE: SaveInput,
}


# --- outputs --------------------------------------------------------------------------------


class Hit(BaseModel):
    filename: str
    excerpt: str


class SearchData(BaseModel):
    hits: list[Hit]
    examined: int
    skipped: int
    truncated: bool


class ReadData(BaseModel):
    filename: str
    content: str


class SaveData(BaseModel):
    filename: str
    bytes: int


class PendingApprovalData(BaseModel):
    # Said in the config, not a docstring: the sandbox runs with -OO, which drops docstrings,
    # and its published schema must equal the broker's to the byte (the pin compares them).
    model_config = ConfigDict(
        json_schema_extra={"description": "Produced only by the broker; published here so clients accept it."}
    )

    approval_id: str
    filename: str
    bytes: int
    sha256: str
    approve_url: str


D = TypeVar("D")


class ToolResult(BaseModel, Generic[D]):
    """The one result shape of every tool: errors are values, not exceptions."""

    model_config = ConfigDict(use_enum_values=True)

    status: Status
    message: str
    data: D | None = None

    @classmethod
    def ok(cls, message: Message, data: D) -> ToolResult[D]:
        return cls(status=Status.OK, message=message.value, data=data)

    @classmethod
    def error(cls, status: Status, message: Message) -> ToolResult[D]:
        return cls(status=status, message=message.value)


SearchResult = ToolResult[SearchData]
ReadResult = ToolResult[ReadData]
SaveResult = ToolResult[SaveData | PendingApprovalData]

RESULT_MODELS: dict[str, type[ToolResult[Any]]] = {
    TOOL_SEARCH: SearchResult,
    TOOL_READ: ReadResult,
    TOOL_SAVE: SaveResult,
}


# --- descriptors ----------------------------------------------------------------------------

TOOL_DESCRIPTIONS = {
    TOOL_SEARCH: "Find a literal, case-sensitive text in the tenant's source documents (not recursive).",
    TOOL_READ: "Read one source document (UTF-8, at most 24,000 bytes).",
    TOOL_SAVE: "Save a new Markdown report. Every report needs a human's approval first; "
    "existing reports are never overwritten.",
}
_READ_ONLY = {"readOnlyHint": True, "openWorldHint": False}
TOOL_ANNOTATIONS: dict[str, dict[str, bool]] = {
    TOOL_SEARCH: _READ_ONLY,
    TOOL_READ: _READ_ONLY,
    TOOL_SAVE: {"readOnlyHint": False, "destructiveHint": False, "idempotentHint": False,
                "openWorldHint": False},
}  # fmt: skip


def tool_descriptor(tool: str) -> dict[str, Any]:
    """The tool as `tools/list` publishes it (a fresh copy): what the broker admits and serves."""
    return {
        "name": tool,
        "description": TOOL_DESCRIPTIONS[tool],
        "inputSchema": input_schema(tool),
        "outputSchema": output_schema(tool),
        "annotations": dict(TOOL_ANNOTATIONS[tool]),
    }


def input_schema(tool: str) -> dict[str, Any]:
    """The published JSON schema of a tool's input, with unknown fields closed off."""
    schema = inline_refs(INPUT_MODELS[tool].model_json_schema())
    schema["additionalProperties"] = False
    return schema


def output_schema(tool: str) -> dict[str, Any]:
    return inline_refs(RESULT_MODELS[tool].model_json_schema())


def inline_refs(schema: dict[str, Any]) -> dict[str, Any]:
    """Replace local `$ref`s with their definitions.

    The broker admits only self-contained schemas (no `$ref`, nothing remote), so the
    server publishes its own that way. pydantic's models here are not recursive.
    """
    defs = schema.get("$defs", {})

    def resolve(node: Any) -> Any:
        if isinstance(node, dict):
            ref = node.get("$ref")
            if isinstance(ref, str) and ref.startswith("#/$defs/"):
                merged = {
                    **defs[ref.removeprefix("#/$defs/")],
                    **{k: v for k, v in node.items() if k != "$ref"},
                }
                return resolve(merged)
            return {k: resolve(v) for k, v in node.items() if k != "$defs"}
        if isinstance(node, list):
            return [resolve(item) for item in node]
        return node

    resolved: dict[str, Any] = resolve(schema)
    return resolved
