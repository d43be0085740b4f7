"""Descriptor admission and contract pinning, from the attacker's side: a sandbox that lies
in `tools/list`.

Every lie must cost the liar only the tool it lied about: that tool disappears from the
client's listing, calling it is refused before the sandbox sees the call, the refusal is
audited by tool name (`tools.rejected`), and the tenant's honest tools keep working. A sandbox
whose listing changes after it was pinned is replaced at once, and its calls are refused
(503, -32001) for the breaker's cool-down (see test_hostile_replacement.py).
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from broker.testing import Broker, structured
from tests.broker.hostile.hostile_helpers import (
    Rpc,
    contract_breaks,
    events,
    last_request,
    rejected,
    sandbox_calls,
    tool_calls,
)

SEARCH, READ, SAVE = "search_documents", "read_document", "save_report"
ALL_TOOLS = sorted([SEARCH, READ, SAVE])

# tenant → the tools it lies about, each with the audit reason; the rest of its tools are honest
BAD_DESCRIPTORS = {
    "refschema": {SEARCH: "schema_keyword_not_allowed", SAVE: "schema_keyword_not_allowed"},
    "credheader": {SEARCH: "header_carries_credential", SAVE: "header_carries_credential"},
    "badheader": {SEARCH: "header_not_top_level", SAVE: "header_type_not_scalar"},
    "bigdesc": {SEARCH: "description_invalid", SAVE: "schema_too_complex"},
    "bigschema": {SEARCH: "schema_too_large", SAVE: "title_invalid"},
    "deepschema": {READ: "schema_too_complex", SAVE: "schema_pattern_not_allowed"},
    "oddfields": {SEARCH: "descriptor_unknown_field", SAVE: "annotations_invalid"},
    "duplicate": {READ: "duplicate_name"},
}
TENANTS = (
    "honest", "changing", "extratools", "cursorloop", "manypages", "emptycursor",
    *BAD_DESCRIPTORS,
)  # fmt: skip


def works(rpc: Rpc, tool: str) -> None:
    """One honest call of `tool` gets a real, validated result."""
    if tool == SEARCH:
        reply = rpc.search("docbroker")
        assert reply.structured["status"] == "ok", reply
        assert reply.structured["data"]["hits"][0]["filename"] == "notes.md"
    else:
        reply = rpc.read("notes.md")
        assert reply.structured == {
            "status": "ok",
            "message": "document read",
            "data": {"filename": "notes.md", "content": "hello docbroker world\n"},
        }


def refused_unheard(rpc: Rpc, tool: str) -> None:
    """Calling a tool that was not admitted: -32602, audited, and the sandbox never hears of it."""
    before = len(tool_calls(rpc.broker, rpc.tenant, tool))
    approvals = len(events(rpc.broker, "approval.requested", tenant=rpc.tenant))
    arguments = {"filename": "notes.md"} if tool != SEARCH else {"query": "docbroker"}
    if tool == SAVE:
        arguments["content"] = "text"
    reply = rpc.call(tool, arguments)
    assert reply.status == 400 and reply.error_code == -32602, reply  # -32602: 400 at 2026-07-28
    denied = last_request(rpc.broker, rpc.tenant, tool=tool)
    assert (denied["event"], denied["outcome"]) == ("policy.denied", "denied")
    assert denied["reason"] in ("tool_not_admitted", "tool_not_allowed")
    assert len(tool_calls(rpc.broker, rpc.tenant, tool)) == before
    # no human is asked to approve a save_report that could never be forwarded
    assert len(events(rpc.broker, "approval.requested", tenant=rpc.tenant)) == approvals


@pytest.mark.anyio
async def test_honest_server_passes_untouched_through_a_real_client(hostile: Broker) -> None:
    async with hostile.client(hostile.token(tenant="honest")) as client:
        listed = {t.name: t for t in (await client.list_tools()).tools}
        assert sorted(listed) == ALL_TOOLS
        # the broker-only argument is hidden from the model
        assert "approval_token" not in json.dumps(listed[SAVE].input_schema)
        read = await client.call_tool(READ, {"filename": "notes.md"})
        assert structured(read)["data"]["content"] == "hello docbroker world\n"
        search = await client.call_tool(SEARCH, {"query": "ship"})
        assert structured(search)["data"]["hits"][0]["filename"] == "plan.md"
    assert rejected(hostile, "honest") == set()


@pytest.mark.parametrize("tenant", sorted(BAD_DESCRIPTORS))
def test_a_bad_descriptor_excludes_only_that_tool(hostile: Broker, tenant: str) -> None:
    lies = BAD_DESCRIPTORS[tenant]
    assert rejected(hostile, tenant) == set(lies.items())
    rpc = Rpc(hostile, tenant)
    assert rpc.tool_names() == sorted(set(ALL_TOOLS) - set(lies))
    for tool in lies:
        refused_unheard(rpc, tool)
    for tool in sorted({SEARCH, READ} - set(lies)):
        works(rpc, tool)


def test_rejections_are_audited_by_name_never_by_content(hostile: Broker) -> None:
    rejections = events(hostile, "tools.rejected")
    assert rejections
    allowed = {"v", "seq", "ts", "prev", "event", "replica", "tenant", "sandbox", "tool", "reason", "outcome"}
    for event in rejections:
        assert set(event) <= allowed and event["outcome"] == "rejected", event
    text = hostile.audit_file.read_text()
    for planted in ("IGNORE ALL PREVIOUS", "attacker.invalid", "run_shell", "$ref", "Approval-Token"):
        assert planted not in text


def test_extra_tools_are_refused_and_never_shown(hostile: Broker) -> None:
    # 36 tools: cut at 16 (too_many_tools); the 13 extras among those are not allow-listed
    assert rejected(hostile, "extratools") == {(None, "tool_not_allowed"), (None, "too_many_tools")}
    reasons = [e["reason"] for e in events(hostile, "tools.rejected", tenant="extratools")]
    assert reasons.count("tool_not_allowed") == 13
    rpc = Rpc(hostile, "extratools")
    assert rpc.tool_names() == ALL_TOOLS
    for name in ("run_shell", "read_document_v2"):
        reply = rpc.call(name, {"command": "id"})
        assert reply.error_code == -32602, reply
        assert last_request(hostile, "extratools")["event"] == "policy.denied"
    assert tool_calls(hostile, "extratools", "run_shell") == []
    works(rpc, SEARCH)
    works(rpc, READ)


def each_listing_was(calls: list[dict[str, Any]], cursors: list[str | None]) -> None:
    """The sandbox was asked for exactly these pages, in order, once or more: the start-up
    listing may not have finished in time on a loaded host, and then the test's own request
    pins too."""
    seen = [c["cursor"] for c in calls]
    assert seen and seen == cursors * (len(seen) // len(cursors)), seen


def test_a_cursor_loop_ends_the_listing(hostile: Broker) -> None:
    rpc = Rpc(hostile, "cursorloop")
    before = len(sandbox_calls(hostile, "cursorloop", "tools/list"))
    # the pages seen before the loop closed (a → b → a) are admitted; the loop is audited
    assert rpc.tool_names() == ALL_TOOLS
    listing = sandbox_calls(hostile, "cursorloop", "tools/list")[before:]
    each_listing_was(listing, [None, "a", "b"])
    assert rejected(hostile, "cursorloop") == {(None, "cursor_repeated")}
    works(rpc, READ)


def test_endless_pages_end_at_the_page_bound(hostile: Broker) -> None:
    rpc = Rpc(hostile, "manypages")
    before = len(sandbox_calls(hostile, "manypages", "tools/list"))
    assert rpc.tool_names() == ALL_TOOLS
    listing = sandbox_calls(hostile, "manypages", "tools/list")[before:]
    each_listing_was(listing, [None, "p1", "p2", "p3"])
    assert (None, "too_many_pages") in rejected(hostile, "manypages")
    works(rpc, SEARCH)


def test_an_empty_string_cursor_is_followed(hostile: Broker) -> None:
    rpc = Rpc(hostile, "emptycursor")
    before = len(sandbox_calls(hostile, "emptycursor", "tools/list"))
    assert rpc.tool_names() == ALL_TOOLS  # read and save are only on the page after cursor ""
    listing = sandbox_calls(hostile, "emptycursor", "tools/list")[before:]
    each_listing_was(listing, [None, ""])  # the second page was asked for with cursor ""
    assert [c["has_cursor"] for c in listing[:2]] == [False, True]
    assert rejected(hostile, "emptycursor") == set()
    works(rpc, READ)


def test_the_broker_pins_the_tools_before_anything_reaches_the_sandbox(hostile: Broker) -> None:
    calls = [c["method"] for c in sandbox_calls(hostile, "honest")]
    # the broker's own listing comes first, then the client's request it was made for
    assert calls[0] == "tools/list"
    assert "server/discover" in calls
    assert events(hostile, "sandbox.started", tenant="honest")


def test_a_changed_listing_replaces_the_sandbox(hostile: Broker) -> None:
    contract_breaks(hostile, "changing")
    # other tenants are not affected
    works(Rpc(hostile, "honest"), READ)
