"""A report cannot disguise itself in the in-band question (DESIGN §4, issue 15 item 8).

The attacker controls the report's content (a prompt-injected model writes it). The human reads
the `elicitation/create` message in their MCP client, maybe a terminal: a raw U+202E would show
"1234<RLO>9876" as "12346789", a raw ESC would drive the terminal. Every such character must be
a `[U+XXXX NAME]` mark in the text, counted in a warning, while the bytes written stay exactly
the approved ones.
"""

from __future__ import annotations

import unicodedata
from typing import Any

import mcp_types
import pytest

from broker.testing import Broker, structured
from tests.broker.support import open_mcp, unique

pytestmark = pytest.mark.anyio

DISGUISED = "Transfer to account 1234\u202e9876\u202c today\u200b.\n\x1b[8mhidden\x1b[0m\tdone\n"


async def test_in_band_question_shows_hidden_characters_as_counted_marks(broker: Broker) -> None:
    name = unique("disguised")
    asked: list[str] = []

    async def human(_ctx: Any, params: Any) -> mcp_types.ElicitResult:
        asked.append(params.message)
        return mcp_types.ElicitResult(action="accept", content={"decision": "approve"})

    async with open_mcp(broker, broker.token(), elicitation_callback=human) as client:
        result = structured(await client.call_tool("save_report", {"filename": name, "content": DISGUISED}))
    assert result["status"] == "ok", result
    [message] = asked
    # not one character of the text shown hides, reorders or controls anything
    hiding = sorted({f"U+{ord(ch):04X}" for ch in message if ch not in "\n\t" and _hides(ch)})
    assert hiding == []
    assert "Warning: 5 invisible or control characters are shown as marks" in message
    assert (
        "Transfer to account 1234[U+202E RLO]9876[U+202C PDF] today[U+200B ZWSP].\n"
        "[U+001B ESC][8mhidden[U+001B ESC][0m\tdone\n"
    ) in message
    assert message.index("Warning:") < message.index("--- content ---")
    # the marks are for the eyes only: the report holds exactly what was approved
    assert (broker.reports("acme") / name).read_text() == DISGUISED


async def ask(broker: Broker, content: str) -> str:
    """The question's text for a report of `content` (denied: nothing is written)."""
    asked: list[str] = []

    async def human(_ctx: Any, params: Any) -> mcp_types.ElicitResult:
        asked.append(params.message)
        return mcp_types.ElicitResult(action="accept", content={"decision": "deny"})

    async with open_mcp(broker, broker.token(), elicitation_callback=human) as client:
        await client.call_tool("save_report", {"filename": unique("ask"), "content": content})
    [message] = asked
    return message


async def test_in_band_question_of_plain_text_has_no_warning(broker: Broker) -> None:
    content = "# Notes\n\n\tnumbers are up 1234 — ok ✓ é\n"
    message = await ask(broker, content)
    assert "Warning" not in message and "[U+" not in message
    assert f"--- content ---\n{content}\n--- end ---" in message


async def test_in_band_question_warns_that_right_to_left_text_may_be_shown_reordered(broker: Broker) -> None:
    # No control character at all, yet "\u05d0 2222 3333" is drawn as "3333 2222 \u05d0" by
    # the bidi rules: not marked (it is how Hebrew is written), but the human is told.
    content = "Pay 1111 to \u05d0\u05d1 2222 3333 now\n"
    message = await ask(broker, content)
    assert "Warning: the content has right-to-left letters" in message and "[U+" not in message
    assert message.index("Warning:") < message.index(f"--- content ---\n{content}\n--- end ---")


def _hides(ch: str) -> bool:
    return unicodedata.category(ch) in {"Cc", "Cf", "Co", "Cs", "Cn", "Zl", "Zp"}
