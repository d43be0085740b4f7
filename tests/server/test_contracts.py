"""server/contracts.py: strict input models, the filename pattern, the one result shape."""

from __future__ import annotations

import json
from typing import Any

import pytest
from pydantic import ValidationError

from server import contracts as c
from server.contracts import Message, ReadInput, SaveInput, SearchInput, Status, ToolResult

VALID_NAMES = ["a.md", "A.md", "0.md", "notes.md", "Q3-report_v2.md", "a" * 64 + ".md", "x-.md", "x_.md"]
INVALID_NAMES = [
    "",
    ".md",
    "a",
    "a.txt",
    "a.MD",
    "a.md.md",
    ".hidden.md",
    "-a.md",
    "_a.md",
    "a b.md",
    "a.md\n",  # Python's `$` would accept this; the pattern must not
    "\na.md",
    "a" * 65 + ".md",  # stem of 65 characters: one too many
    "../a.md",
    "..",
    "/etc/passwd",
    "/abs.md",
    "sub/a.md",
    "sub\\a.md",
    "a\x00.md",
    "é.md",
    "٣.md",  # a non-ASCII digit
]


@pytest.mark.parametrize("name", VALID_NAMES)
def test_filename_pattern_accepts(name: str) -> None:
    assert c.FILENAME_RE.fullmatch(name)
    assert ReadInput(filename=name).filename == name


@pytest.mark.parametrize("name", INVALID_NAMES)
def test_filename_pattern_rejects(name: str) -> None:
    assert not c.FILENAME_RE.fullmatch(name)
    with pytest.raises(ValidationError):
        ReadInput(filename=name)
    with pytest.raises(ValidationError):
        SaveInput(filename=name, content="x", approval_token="t")


def test_filename_pattern_is_the_designed_one() -> None:
    assert c.FILENAME_PATTERN == r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}\.md$"


# --- search input ---------------------------------------------------------------------------


def test_search_defaults_to_three_results() -> None:
    assert SearchInput(query="x").max_results == 3
    assert SearchInput.model_validate_json('{"query": "x"}').max_results == 3


@pytest.mark.parametrize("query", ["x", "q" * 80, "a.c", "\u00e9" * 80])
def test_search_query_lengths_accepted(query: str) -> None:
    assert SearchInput(query=query).query == query


@pytest.mark.parametrize("query", ["", "q" * 81, "\u00e9" * 81])
def test_search_query_lengths_rejected(query: str) -> None:
    with pytest.raises(ValidationError):
        SearchInput(query=query)


@pytest.mark.parametrize("n", [1, 2, 3])
def test_search_max_results_range_accepted(n: int) -> None:
    assert SearchInput(query="x", max_results=n).max_results == n


@pytest.mark.parametrize("value", [0, 4, -1, 100])
def test_search_max_results_range_rejected(value: int) -> None:
    with pytest.raises(ValidationError):
        SearchInput(query="x", max_results=value)


@pytest.mark.parametrize(
    "raw",
    [
        '{"query": "x", "max_results": true}',  # JSON true is not the integer 1
        '{"query": "x", "max_results": "3"}',  # "3" is not 3
        '{"query": "x", "max_results": 3.0}',
        '{"query": "x", "max_results": null}',
        '{"query": 5}',
        '{"query": ["x"]}',
        '{"query": null}',
        '{"query": "x", "unknown": 1}',  # unknown fields are errors
        '{"query": "x", "approval_token": "t"}',
        "{}",
    ],
)
def test_search_input_is_strict_from_json(raw: str) -> None:
    with pytest.raises(ValidationError):
        SearchInput.model_validate_json(raw)
    # The tool bodies receive already-decoded JSON: the same must hold for Python objects.
    with pytest.raises(ValidationError):
        SearchInput.model_validate(json.loads(raw))


def test_bool_is_not_int_even_for_one() -> None:
    with pytest.raises(ValidationError):
        SearchInput.model_validate({"query": "x", "max_results": True})


# --- read / save input ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "args",
    [
        {},
        {"filename": 1},
        {"filename": b"a.md"},
        {"filename": "a.md", "extra": True},
        {"filename": "a.md", "path": "/etc"},
    ],
)
def test_read_input_is_strict(args: dict[str, Any]) -> None:
    with pytest.raises(ValidationError):
        ReadInput.model_validate(args)


def _save(**overrides: Any) -> dict[str, Any]:
    return {"filename": "r.md", "content": "text", "approval_token": "tok", **overrides}


def test_save_input_accepts_the_limits() -> None:
    assert SaveInput.model_validate(_save(content="x"))
    assert SaveInput.model_validate(_save(content="x" * 8000))
    # 8,000 characters of three bytes each: 24,000 bytes, exactly at both limits.
    assert SaveInput.model_validate(_save(content="\u20ac" * 8000))


@pytest.mark.parametrize(
    "args",
    [
        _save(content=""),
        _save(content="x" * 8001),
        _save(content=5),
        _save(content=None),
        _save(approval_token=""),
        _save(approval_token=None),
        _save(approval_token=1),
        _save(extra="x"),
        {"filename": "r.md", "content": "text"},  # the token is required
        {"content": "text", "approval_token": "tok"},
    ],
)
def test_save_input_is_strict(args: dict[str, Any]) -> None:
    with pytest.raises(ValidationError):
        SaveInput.model_validate(args)


def test_save_content_is_limited_in_characters_and_in_bytes() -> None:
    # 8,000 characters is the character limit, but 8,000 emoji are 32,000 UTF-8 bytes.
    emoji = "\U0001f600"  # 4 bytes
    assert SaveInput.model_validate(_save(content=emoji * 6000)).content == emoji * 6000  # 24,000 bytes
    with pytest.raises(ValidationError):
        SaveInput.model_validate(_save(content=emoji * 6001))  # 24,004 bytes, 6,001 characters
    with pytest.raises(ValidationError):
        SaveInput.model_validate(_save(content="a" * (c.MAX_REPORT_CHARS + 1)))


def test_lone_surrogate_content_is_not_a_valid_string() -> None:
    with pytest.raises(ValidationError):
        SaveInput.model_validate(_save(content="a\ud800b"))


def test_inputs_are_frozen() -> None:
    args = SearchInput(query="x")
    with pytest.raises(ValidationError):
        args.query = "y"  # type: ignore[misc]


# --- published schemas ---------------------------------------------------------------------


@pytest.mark.parametrize("tool", c.TOOL_NAMES)
def test_input_schema_is_closed_and_self_contained(tool: str) -> None:
    schema = c.input_schema(tool)
    assert schema["type"] == "object"
    assert schema["additionalProperties"] is False
    assert "$ref" not in json.dumps(schema) and "$defs" not in schema


def test_input_schema_fields() -> None:
    search = c.input_schema(c.TOOL_SEARCH)
    assert search["required"] == ["query"]
    assert (
        search["properties"]["query"] | {"type": "string", "minLength": 1, "maxLength": 80}
        == search["properties"]["query"]
    )
    max_results = search["properties"]["max_results"]
    assert (max_results["type"], max_results["minimum"], max_results["maximum"], max_results["default"]) == (
        "integer",
        1,
        3,
        3,
    )
    read = c.input_schema(c.TOOL_READ)
    assert read["required"] == ["filename"]
    assert read["properties"]["filename"]["pattern"] == c.FILENAME_PATTERN
    save = c.input_schema(c.TOOL_SAVE)
    assert sorted(save["required"]) == ["approval_token", "content", "filename"]
    assert save["properties"]["content"]["minLength"] == 1
    assert save["properties"]["content"]["maxLength"] == 8000


@pytest.mark.parametrize("tool", c.TOOL_NAMES)
def test_output_schema_publishes_every_status(tool: str) -> None:
    schema = c.output_schema(tool)
    assert "$ref" not in json.dumps(schema)
    assert set(schema["required"]) == {"status", "message"}
    assert schema["properties"]["status"]["enum"] == [
        "ok",
        "rejected",
        "failed",
        "result_unknown",
        "waiting_approval",
    ]


def test_save_output_schema_admits_the_brokers_pending_approval() -> None:
    variants = c.output_schema(c.TOOL_SAVE)["properties"]["data"]["anyOf"]
    required = [set(v.get("required", [])) for v in variants]
    assert {"filename", "bytes"} in required
    assert {"approval_id", "filename", "bytes", "sha256", "approve_url"} in required
    assert {"type": "null"} in variants


def test_search_output_schema_fields() -> None:
    data = next(
        v for v in c.output_schema(c.TOOL_SEARCH)["properties"]["data"]["anyOf"] if v.get("properties")
    )
    assert set(data["required"]) == {"hits", "examined", "skipped", "truncated"}
    assert set(data["properties"]["hits"]["items"]["required"]) == {"filename", "excerpt"}


# --- the result shape ----------------------------------------------------------------------


def test_status_values() -> None:
    assert [s.value for s in Status] == ["ok", "rejected", "failed", "result_unknown", "waiting_approval"]


def test_result_shape_ok_and_error() -> None:
    ok = ToolResult.ok(Message.READ, c.ReadData(filename="a.md", content="x")).model_dump(mode="json")
    assert ok == {"status": "ok", "message": "document read", "data": {"filename": "a.md", "content": "x"}}
    err = ToolResult.error(Status.RESULT_UNKNOWN, Message.WRITE_UNKNOWN).model_dump(mode="json")
    assert err == {"status": "result_unknown", "message": Message.WRITE_UNKNOWN.value, "data": None}


def test_messages_are_fixed_category_texts() -> None:
    # No placeholder could ever carry a path, a content or a token into a message.
    for message in Message:
        assert "{" not in message.value and "%" not in message.value
        assert "/" not in message.value
