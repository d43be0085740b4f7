"""The approvals page in a real browser: a report cannot disguise itself (issue 15 item 8).

The attacker writes the report's content; the approver reads it on /approvals in Chromium.
Placed as plain text, `1234<U+202E>9876<U+202C>` was drawn as "12346789": the human approved
digits that were not the ones written. Here the page must draw each hidden character as a
labelled mark, count them above the content, and draw the digits in the order they are written.

Debian's chromium and chromedriver (installed by `./dev setup`) are driven by Selenium with
explicit paths, so Selenium Manager never tries to download a browser. No browser: the test
fails, it does not skip.
"""

from __future__ import annotations

import unicodedata
from pathlib import Path
from typing import Any

import pytest
from selenium import webdriver
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait

from broker.testing import Broker, make_broker, structured
from tests.broker.support import APPROVER_SCOPE, open_mcp, unique

pytestmark = pytest.mark.anyio

DISGUISED = "Transfer to account 1234\u202e9876\u202c today\u200b\x1b[0m"
FLAGGED_CATEGORIES = {"Cc", "Cf", "Co", "Cs", "Cn", "Zl", "Zp"}

# Left edge of each character of `needle` as drawn, found in the text nodes of `root` that are
# not inside a mark (a mark's own label has digits too).
_CHAR_LEFTS = """
const [root, needle] = arguments;
const walker = document.createTreeWalker(root, NodeFilter.SHOW_TEXT, {
  acceptNode: (n) => n.parentElement.closest(".mark") ? NodeFilter.FILTER_REJECT : NodeFilter.FILTER_ACCEPT,
});
for (let node = walker.nextNode(); node; node = walker.nextNode()) {
  const at = node.data.indexOf(needle);
  if (at < 0) { continue; }
  const lefts = [];
  for (let i = at; i < at + needle.length; i++) {
    const range = document.createRange();
    range.setStart(node, i);
    range.setEnd(node, i + 1);
    lefts.push(range.getBoundingClientRect().left);
  }
  return lefts;
}
return null;
"""


async def pending_approval(broker: Broker, name: str, content: str) -> str:
    # a client that cannot be asked in-band: the approval waits for the page
    async with open_mcp(broker, broker.token(subject="alice")) as client:
        result = structured(await client.call_tool("save_report", {"filename": name, "content": content}))
    assert result["status"] == "waiting_approval", result
    return str(result["data"]["approval_id"])


def _shown_or_failed(driver: webdriver.Chrome) -> bool:
    contents = driver.find_elements(By.CSS_SELECTOR, ".content")
    return (
        bool(contents and contents[0].is_displayed())
        or "Could not" in driver.find_element(By.ID, "status").text
    )


def open_page(driver: webdriver.Chrome, broker: Broker, approval_id: str) -> Any:
    driver.get(f"{broker.url}/approvals?id={approval_id}")
    driver.find_element(By.ID, "token").send_keys(broker.token(subject="carol", scope=APPROVER_SCOPE))
    driver.find_element(By.ID, "load").click()
    WebDriverWait(driver, 20).until(_shown_or_failed)
    return driver.find_element(By.CSS_SELECTOR, ".approval")


async def test_page_draws_hidden_characters_as_counted_marks_in_written_order(
    broker: Broker, chromium: webdriver.Chrome, tmp_path: Path
) -> None:
    name = unique("disguised")
    approval_id = await pending_approval(broker, name, DISGUISED)
    card = open_page(chromium, broker, approval_id)
    chromium.save_screenshot(str(tmp_path / "approvals.png"))
    content = card.find_element(By.CSS_SELECTOR, ".content")
    shown = content.get_attribute("innerText") or ""

    # nothing drawn hides, reorders or controls text; each such character is a labelled mark
    hiding = [f"U+{ord(ch):04X}" for ch in shown if unicodedata.category(ch) in FLAGGED_CATEGORIES]
    assert hiding == [], shown
    assert [m.text for m in content.find_elements(By.CSS_SELECTOR, ".mark")] == [
        "U+202E RLO",
        "U+202C PDF",
        "U+200B ZWSP",
        "U+001B ESC",
    ]
    order = [
        shown.index(part) for part in ("1234", "U+202E RLO", "9876", "U+202C PDF", "today", "U+001B ESC")
    ]
    assert order == sorted(order), shown
    warning = card.find_element(By.CSS_SELECTOR, ".count")
    assert warning.is_displayed()
    assert warning.text == "4 invisible or control characters are shown as marks"
    assert warning.location["y"] < content.location["y"]

    # drawn left to right as written: 1, 2, 3, 4, then the mark, then 9, 8, 7, 6
    before = chromium.execute_script(_CHAR_LEFTS, content, "1234")
    after = chromium.execute_script(_CHAR_LEFTS, content, "9876")
    assert before and after, shown
    lefts = [*before, *after]
    assert lefts == sorted(lefts) and len(set(lefts)) == len(lefts), lefts

    # the human can approve what they read, and the bytes written are the ones they approved
    approve = card.find_element(By.CSS_SELECTOR, ".approve")
    assert approve.is_enabled()
    approve.click()
    WebDriverWait(chromium, 20).until(
        lambda _: card.find_element(By.CSS_SELECTOR, ".state").text == "approved"
    )
    async with open_mcp(broker, broker.token(subject="alice")) as client:
        result = structured(await client.call_tool("save_report", {"filename": name, "content": DISGUISED}))
    assert result["status"] == "ok", result
    assert (broker.reports("acme") / name).read_text() == DISGUISED


async def test_a_written_report_has_a_receipt_link_under_recent_decisions(
    tmp_path: Path, chromium: webdriver.Chrome
) -> None:
    # A broker of its own: the shared one signs checkpoints once a day, and a receipt waits for
    # the checkpoint over the report's last line (issue 37).
    broker = make_broker(tmp_path, env={"DOCBROKER_AUDIT_CHECKPOINT_INTERVAL": "0.2"})
    broker.start()
    try:
        name = unique("receipt")
        card = open_page(chromium, broker, await pending_approval(broker, name, "numbers\n"))
        card.find_element(By.CSS_SELECTOR, ".approve").click()
        WebDriverWait(chromium, 20).until(
            lambda _: card.find_element(By.CSS_SELECTOR, ".state").text == "approved"
        )
        async with open_mcp(broker, broker.token(subject="alice")) as client:
            result = structured(
                await client.call_tool("save_report", {"filename": name, "content": "numbers\n"})
            )
        assert result["status"] == "ok", result
        chromium.find_element(By.ID, "load").click()

        def receipt_saved(driver: webdriver.Chrome) -> bool:
            rows = [r for r in driver.find_elements(By.CSS_SELECTOR, "#recent-rows tr") if name in r.text]
            links = rows[0].find_elements(By.CSS_SELECTOR, "a.receipt") if rows else []
            if links and not driver.find_element(By.ID, "status").text.startswith("Receipt saved"):
                links[0].click()  # 409 receipt_not_ready until the next checkpoint: asked again
            return driver.find_element(By.ID, "status").text.startswith("Receipt saved")

        WebDriverWait(chromium, 30, poll_frequency=0.5).until(receipt_saved)
        rows = chromium.find_elements(By.CSS_SELECTOR, "#recent-rows tr")
        undecided = [r for r in rows if name not in r.text]
        assert all(not r.find_elements(By.CSS_SELECTOR, "a.receipt") for r in undecided)
    finally:
        broker.stop()


async def test_page_shows_plain_report_without_marks_or_warning(
    broker: Broker, chromium: webdriver.Chrome
) -> None:
    content_text = "# Notes\n\n\tnumbers are up \u2713 \u2014 1234 9876\n"
    card = open_page(chromium, broker, await pending_approval(broker, unique("plain"), content_text))
    content = card.find_element(By.CSS_SELECTOR, ".content")
    assert content.find_elements(By.CSS_SELECTOR, ".mark") == []
    assert not card.find_element(By.CSS_SELECTOR, ".count").is_displayed()
    assert content.get_attribute("textContent") == content_text


async def test_listing_pages_through_every_pending_approval_and_shows_content_only_on_request(
    broker: Broker, chromium: webdriver.Chrome
) -> None:
    # more than one page of the listing, in a tenant of its own on the shared broker
    names = [unique("many") for _ in range(60)]
    async with open_mcp(broker, broker.token(tenant="globex", subject="alice")) as client:
        for name in names:
            result = structured(
                await client.call_tool("save_report", {"filename": name, "content": DISGUISED})
            )
            assert result["status"] == "waiting_approval", result
    chromium.get(f"{broker.url}/approvals")
    token = broker.token(tenant="globex", subject="carol", scope=APPROVER_SCOPE)
    chromium.find_element(By.ID, "token").send_keys(token)
    chromium.find_element(By.ID, "load").click()
    WebDriverWait(chromium, 30).until(lambda d: "pending" in d.find_element(By.ID, "status").text)
    cards = {
        c.find_element(By.CSS_SELECTOR, ".filename").text: c
        for c in chromium.find_elements(By.CSS_SELECTOR, ".approval")
    }
    assert set(names) <= set(cards)

    card = cards[names[0]]  # the oldest: the last page
    content = card.find_element(By.CSS_SELECTOR, ".content")
    approve = card.find_element(By.CSS_SELECTOR, ".approve")
    assert not content.is_displayed() and not approve.is_enabled()  # nothing approved unread
    card.find_element(By.CSS_SELECTOR, ".reveal").click()
    WebDriverWait(chromium, 20).until(lambda _: content.is_displayed())
    assert [m.text for m in content.find_elements(By.CSS_SELECTOR, ".mark")] == [
        "U+202E RLO",
        "U+202C PDF",
        "U+200B ZWSP",
        "U+001B ESC",
    ]
    assert card.find_element(By.CSS_SELECTOR, ".count").text.startswith("4 invisible")
    assert approve.is_enabled()


async def test_right_to_left_text_is_flagged_and_can_be_read_in_stored_order(
    broker: Broker, chromium: webdriver.Chrome, tmp_path: Path
) -> None:
    # No control character at all: the bidi rules alone draw "\u05d0\u05d1 2222 3333" as
    # "3333 2222 \u05d1\u05d0", so an approver reading left to right sees the numbers swapped.
    text = "Pay 1111 to \u05d0\u05d1 2222 3333 now"
    card = open_page(chromium, broker, await pending_approval(broker, unique("rtl"), text))
    content = card.find_element(By.CSS_SELECTOR, ".content")
    note = card.find_element(By.CSS_SELECTOR, ".rtl")
    assert note.is_displayed() and "right-to-left letters" in note.text
    assert content.find_elements(By.CSS_SELECTOR, ".mark") == []

    def lefts(needle: str) -> list[float]:
        found = chromium.execute_script(_CHAR_LEFTS, content, needle)
        assert found, needle
        return list(found)

    assert min(lefts("3333")) < min(lefts("2222"))  # what the warning is about
    card.find_element(By.CSS_SELECTOR, ".stored-order").click()
    chromium.save_screenshot(str(tmp_path / "stored-order.png"))
    drawn = [*lefts("1111"), *lefts("2222"), *lefts("3333")]
    assert drawn == sorted(drawn) and len(set(drawn)) == len(drawn), drawn
