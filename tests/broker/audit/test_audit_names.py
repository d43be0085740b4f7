"""The export's lists of names (broker/audit/names.py) against what the broker itself writes.

The gateway records a request's names through `CallRecord.describe_request`, Mcp-Param headers
through `param_header_names`, refused origins through `origin.surface`: whatever they write must
pass the export unchanged (else a real event would reach the SIEM as `other`), and what they turn
into `other` must be `other` in the export too.
"""

from __future__ import annotations

import json

import pytest

from broker.audit import names
from broker.gateway.forwarding import param_header_names
from broker.gateway.record import CallRecord
from broker.origin import surface
from broker.protocol import jsonrpc as rpc
from broker.protocol.methods import MCP_METHODS
from server import contracts as c


def described(method: str, tool: str | None, args: dict[str, object]) -> dict[str, object]:
    params: dict[str, object] = {"name": tool, "arguments": args} if tool is not None else {}
    body = {"jsonrpc": "2.0", "id": 1, "method": method, "params": params}
    record = CallRecord("r1", 0.0)
    record.read(rpc.parse(json.dumps(body).encode()), None)
    return record.describe_request()


@pytest.mark.parametrize("tool", [*c.TOOL_NAMES, "q3-layoffs.md"])
def test_what_the_gateway_records_passes_the_export_unchanged(tool: str) -> None:
    declared = list(c.INPUT_MODELS[tool].model_fields) if tool in c.INPUT_MODELS else []
    fields = described("tools/call", tool, dict.fromkeys([*declared, "secret-plan.md"], 1))
    assert names.known(fields["method"], names.METHODS) == fields["method"] == "tools/call"
    assert names.known(fields["tool"], names.TOOLS) == fields["tool"]
    args = names.ARGS_BY_TOOL.get(str(fields["tool"]), frozenset({names.OTHER}))
    assert names.known_list(fields["arg_names"], args) == fields["arg_names"]
    assert "other" in fields["arg_names"]


def test_methods_headers_and_surfaces_the_broker_writes_are_known() -> None:
    for method in MCP_METHODS:
        assert names.known(described(method, None, {})["method"], names.METHODS) == method
    assert described("x/secret-plan.md", None, {})["method"] == "other"
    for path in ("/mcp", "/v1/approvals", "/v1/approvals/a1", "/approvals", "/approvals/x", "/secret.md"):
        assert names.known(surface(path), names.METHODS) == surface(path)
    recorded = param_header_names(["mcp-param-secret-plan.md", "mcp-param-x"])
    assert names.known_list(recorded, names.HEADERS) == recorded == ["other"]


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("tool_not_allowed", "tool_not_allowed"),
        ("upstream_no_answer", "upstream_no_answer"),
        ("q3_plan.md", "other"),
        ("a:b", "other"),
        ("x-y", "other"),
        ("Tool", "other"),
        ("_x", "other"),
        ("x" * 65, "other"),
        (7, "other"),
    ],
)
def test_reason_codes_pass_in_the_brokers_form_only(value: object, expected: str) -> None:
    assert names.reason_code(value) == expected


def test_the_enumerated_reason_codes_keep_their_form() -> None:
    from broker.approvals.reports import SweepReason
    from broker.auth.errors import AuthReason

    codes = [*AuthReason, *SweepReason, *(f"tool_{s}" for s in c.Status)]
    assert [code for code in codes if names.reason_code(str(code)) != code] == []
