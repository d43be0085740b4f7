"""Descriptor admission: a tool listing from the sandbox is checked before anyone sees it.

A hostile sandbox could offer extra tools, descriptions that carry prompt injections at
length, schemas that make validators fetch remote documents or loop (`$ref`), schemas with
catastrophic regular expressions, or ask the client to mirror a credential into an HTTP
header (`x-mcp-header`). Each descriptor is admitted only if it is an allow-listed tool whose
every part fits a small known shape; a bad descriptor excludes that tool only.

The shape checks come first (they name what is wrong in the audit); then the descriptor must
equal the broker's own contract for that tool (`server.contracts.tool_descriptor`) in name,
title, description, input and output schema and annotations. A sandbox cannot narrow, widen
or reword its tools, and what clients are served is the broker's copy, never the sandbox's.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from server.contracts import TOOL_NAMES, tool_descriptor

MAX_TOOLS = 16
MAX_DESCRIPTOR_BYTES = 32 * 1024  # the real ones are under 3 KB; `_meta` counts too
MAX_DESCRIPTION_CHARS = 2_048
MAX_TITLE_CHARS = 128
MAX_SCHEMA_BYTES = 16_384
MAX_SCHEMA_DEPTH = 8
MAX_SCHEMA_NODES = 256
MAX_PROPERTY_NAME = 64
MAX_PATTERN_CHARS = 128

_DESCRIPTOR_KEYS = frozenset(
    {"name", "title", "description", "inputSchema", "outputSchema", "annotations", "_meta"}
)
_ANNOTATION_TYPES: dict[str, type] = {
    "title": str,
    "readOnlyHint": bool,
    "destructiveHint": bool,
    "idempotentHint": bool,
    "openWorldHint": bool,
}
_TYPES = frozenset({"object", "array", "string", "integer", "number", "boolean", "null"})
# The JSON Schema 2020-12 keywords we understand. Nothing that references, fetches or
# identifies: no $ref, $dynamicRef, $id, $anchor, $defs, no format (validators differ).
_SCHEMA_KEYWORDS = frozenset(
    {"type", "properties", "required", "additionalProperties", "items", "enum", "const", "title",
     "description", "default", "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum",
     "minLength", "maxLength", "minItems", "maxItems", "anyOf", "oneOf", "pattern", "x-mcp-header"}
)  # fmt: skip
_HEADER_NAME = re.compile(r"[A-Za-z0-9-]{1,64}")
_CREDENTIAL = re.compile(
    r"token|secret|passw|pwd|authori[sz]|auth|api[_-]?key|apikey|credential|cookie|session|bearer|private[_-]?key",
    re.IGNORECASE,
)
_HEADER_TYPES = frozenset({"string", "integer", "boolean"})


class Rejected(Exception):
    """One descriptor does not fit; `reason` is a fixed code for the audit log."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass
class Admission:
    tools: dict[str, dict[str, Any]] = field(default_factory=dict)  # admitted, by name
    rejected: list[tuple[str, str]] = field(default_factory=list)  # (tool name or "-", reason)

    def fingerprint(self) -> str:
        """What a contract pin compares: admitted descriptors and the names refused."""
        body = {"tools": self.tools, "rejected": sorted(self.rejected)}
        return json.dumps(body, sort_keys=True, separators=(",", ":"))


def admit(descriptors: list[Any]) -> Admission:
    admission = Admission()
    if len(descriptors) > MAX_TOOLS:
        admission.rejected.append(("-", "too_many_tools"))
        descriptors = descriptors[:MAX_TOOLS]
    seen: set[str] = set()
    for descriptor in descriptors:
        name = descriptor.get("name") if isinstance(descriptor, dict) else None
        label = name if isinstance(name, str) and name in TOOL_NAMES else "-"
        if isinstance(name, str) and name in seen:
            # Both copies go: which of two same-named tools is "real" is not ours to guess.
            admission.tools.pop(name, None)
            admission.rejected.append((label, "duplicate_name"))
            continue
        if isinstance(name, str):
            seen.add(name)
        try:
            checked = _checked_name(name)
            admission.tools[checked] = _admit_one(descriptor)
        except Rejected as exc:
            admission.rejected.append((label, exc.reason))
    return admission


def _checked_name(name: Any) -> str:
    if not isinstance(name, str) or name not in TOOL_NAMES:
        raise Rejected("tool_not_allowed")
    return name


def _canonical(value: Any) -> str:
    # As JSON text, not Python values: `true` is not 1 and 3.0 is not 3 here.
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


# What the contract says of each tool, compared field by field; built once.
_CONTRACT = {name: {k: _canonical(v) for k, v in tool_descriptor(name).items()} for name in TOOL_NAMES}
_COMPARED = (
    ("description", "description_mismatch"),
    ("inputSchema", "input_schema_mismatch"),
    ("outputSchema", "output_schema_mismatch"),
    ("annotations", "annotations_mismatch"),
)


def _admit_one(descriptor: Any) -> dict[str, Any]:
    if not isinstance(descriptor, dict):
        raise Rejected("descriptor_not_object")
    try:
        size = len(json.dumps(descriptor, separators=(",", ":")))
    except (TypeError, ValueError, RecursionError):
        raise Rejected("descriptor_invalid") from None
    if size > MAX_DESCRIPTOR_BYTES:
        raise Rejected("descriptor_too_large")
    if set(descriptor) - _DESCRIPTOR_KEYS:
        raise Rejected("descriptor_unknown_field")
    _text(descriptor.get("description", ""), MAX_DESCRIPTION_CHARS, "description")
    _text(descriptor.get("title", ""), MAX_TITLE_CHARS, "title")
    annotations = descriptor.get("annotations", {})
    if not isinstance(annotations, dict) or any(
        k not in _ANNOTATION_TYPES or not isinstance(v, _ANNOTATION_TYPES[k]) for k, v in annotations.items()
    ):
        raise Rejected("annotations_invalid")
    input_schema = descriptor.get("inputSchema")
    if not isinstance(input_schema, dict) or input_schema.get("type") != "object":
        raise Rejected("input_schema_invalid")
    _check_schema(input_schema, allow_pattern=True)
    _check_headers(input_schema)
    if "outputSchema" in descriptor:
        output_schema = descriptor["outputSchema"]
        if not isinstance(output_schema, dict):
            raise Rejected("output_schema_invalid")
        # No `pattern` here: the broker evaluates output schemas, and a hostile regular
        # expression would be a denial of service against it.
        _check_schema(output_schema, allow_pattern=False)
    return _as_contracted(descriptor)


def _as_contracted(descriptor: dict[str, Any]) -> dict[str, Any]:
    """The broker's own descriptor of the tool, if the sandbox's says exactly the same.

    `_meta` is the sandbox's, not the client's: ignored. The contract has no titles."""
    contract = _CONTRACT[descriptor["name"]]
    if "title" in descriptor:
        raise Rejected("title_mismatch")
    for key, reason in _COMPARED:
        if key not in descriptor or _canonical(descriptor[key]) != contract[key]:
            raise Rejected(reason)
    return tool_descriptor(descriptor["name"])


def _text(value: Any, limit: int, what: str) -> None:
    if not isinstance(value, str) or len(value) > limit:
        raise Rejected(f"{what}_invalid")


def _check_schema(schema: dict[str, Any], *, allow_pattern: bool) -> None:
    if len(json.dumps(schema, separators=(",", ":"))) > MAX_SCHEMA_BYTES:
        raise Rejected("schema_too_large")
    nodes = [0]

    def walk(node: Any, depth: int) -> None:
        nodes[0] += 1
        if nodes[0] > MAX_SCHEMA_NODES or depth > MAX_SCHEMA_DEPTH:
            raise Rejected("schema_too_complex")
        if isinstance(node, bool):
            return  # true / false are schemas
        if not isinstance(node, dict):
            raise Rejected("schema_invalid")
        for key, value in node.items():
            if key not in _SCHEMA_KEYWORDS:
                raise Rejected("schema_keyword_not_allowed")
            if key == "pattern" and (
                not allow_pattern or not isinstance(value, str) or len(value) > MAX_PATTERN_CHARS
            ):
                raise Rejected("schema_pattern_not_allowed")
            if key == "type":
                types = value if isinstance(value, list) else [value]
                if not types or any(t not in _TYPES for t in types):
                    raise Rejected("schema_type_invalid")
            elif key == "properties":
                if not isinstance(value, dict):
                    raise Rejected("schema_invalid")
                for prop, sub in value.items():
                    if not isinstance(prop, str) or len(prop) > MAX_PROPERTY_NAME:
                        raise Rejected("schema_property_invalid")
                    walk(sub, depth + 1)
            elif key in ("items", "additionalProperties"):
                walk(value, depth + 1)
            elif key in ("anyOf", "oneOf"):
                if not isinstance(value, list) or not value:
                    raise Rejected("schema_invalid")
                for sub in value:
                    walk(sub, depth + 1)
            elif key == "required":
                if not isinstance(value, list) or not all(isinstance(r, str) for r in value):
                    raise Rejected("schema_invalid")

    walk(schema, 0)


def _check_headers(input_schema: dict[str, Any]) -> None:
    """`x-mcp-header` only on direct top-level properties of a scalar type, never a credential."""
    properties = input_schema.get("properties", {})
    direct = {id(sub) for sub in properties.values()} if isinstance(properties, dict) else set()

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            if "x-mcp-header" in node and id(node) not in direct:
                raise Rejected("header_not_top_level")
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(input_schema)
    for prop, sub in properties.items() if isinstance(properties, dict) else []:
        if not isinstance(sub, dict) or "x-mcp-header" not in sub:
            continue
        header = sub["x-mcp-header"]
        if not isinstance(header, str) or not _HEADER_NAME.fullmatch(header):
            raise Rejected("header_name_invalid")
        if sub.get("type") not in _HEADER_TYPES:
            raise Rejected("header_type_not_scalar")
        if _CREDENTIAL.search(prop) or _CREDENTIAL.search(header):
            raise Rejected("header_carries_credential")
