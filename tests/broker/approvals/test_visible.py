"""The classifier of characters an approver must see as marks (DESIGN §4), over all of Unicode.

An attacker picks the characters of a report; any one that is shown as itself while it hides,
reorders or controls text lets the approver read something other than what will be written.
"""

from __future__ import annotations

import bisect
import string
import unicodedata

import pytest

from broker.approvals import visible

ALL = range(0x110000)
FLAGGED_CATEGORIES = {"Cc", "Cf", "Co", "Cs", "Cn", "Zl", "Zp"}

# Default_Ignorable_Code_Point, from Unicode's DerivedCoreProperties.txt (written out here, not
# taken from the module): characters a renderer shows as nothing.
DEFAULT_IGNORABLE = [
    (0x00AD, 0x00AD), (0x034F, 0x034F), (0x061C, 0x061C), (0x115F, 0x1160), (0x17B4, 0x17B5),
    (0x180B, 0x180F), (0x200B, 0x200F), (0x202A, 0x202E), (0x2060, 0x206F), (0x3164, 0x3164),
    (0xFE00, 0xFE0F), (0xFEFF, 0xFEFF), (0xFFA0, 0xFFA0), (0xFFF0, 0xFFF8), (0x1BCA0, 0x1BCA3),
    (0x1D173, 0x1D17A), (0xE0000, 0xE0FFF),
]  # fmt: skip

# The characters issue 15 names, with the label the approver reads.
NAMED = {
    **{0x202A: "LRE", 0x202B: "RLE", 0x202C: "PDF", 0x202D: "LRO", 0x202E: "RLO"},
    **{0x2066: "LRI", 0x2067: "RLI", 0x2068: "FSI", 0x2069: "PDI"},
    **{0x200E: "LRM", 0x200F: "RLM", 0x061C: "ALM"},
    **{0x200B: "ZWSP", 0x200C: "ZWNJ", 0x200D: "ZWJ", 0x2060: "WJ", 0xFEFF: "BOM", 0x00AD: "SHY"},
    **{0x2061: "FUNCTION APPLICATION", 0x2062: "INVISIBLE TIMES", 0x2063: "INVISIBLE SEPARATOR"},
    **{0x2064: "INVISIBLE PLUS", 0x2028: "LS", 0x2029: "PS", 0x034F: "CGJ", 0x180E: "MVS"},
    **{0x00: "NUL", 0x07: "BEL", 0x08: "BS", 0x0B: "VT", 0x0C: "FF", 0x0D: "CR", 0x1B: "ESC"},
    **{0x1F: "US", 0x7F: "DEL", 0x80: "PAD", 0x85: "NEL", 0x9B: "CSI", 0x9D: "OSC", 0x9F: "APC"},
    **{0xFE00: "VS1", 0xFE0F: "VS16", 0xE0100: "VS17", 0xE01EF: "VS256", 0x180B: "FVS1", 0x180F: "FVS4"},
    **{0xE0001: "LANGUAGE TAG", 0xE0020: "TAG SPACE", 0xE0041: "TAG A", 0xE0030: "TAG 0"},
    **{0xE007E: "TAG TILDE", 0xE005B: "TAG LEFT SQUARE BRACKET", 0xE0061: "TAG a"},
    **{0xE007F: "CANCEL TAG", 0xE0000: "unassigned", 0xE0002: "unassigned"},
    **{0xE000: "private use", 0xF8FF: "private use", 0xF0000: "private use", 0x10FFFD: "private use"},
    **{0xD800: "surrogate", 0xDBFF: "surrogate", 0xDC00: "surrogate", 0xDFFF: "surrogate"},
    **{0x0378: "unassigned", 0xFFFE: "unassigned", 0xFFFF: "unassigned", 0x10FFFF: "unassigned"},
    **{0x3164: "HANGUL FILLER", 0x115F: "HANGUL CHOSEONG FILLER", 0x2800: "BRAILLE PATTERN BLANK"},
    **{0x0600: "ARABIC NUMBER SIGN", 0x1D173: "MUSICAL SYMBOL BEGIN BEAM"},
    **{0xFFF9: "INTERLINEAR ANNOTATION ANCHOR", 0x1BCA0: "SHORTHAND FORMAT LETTER OVERLAP"},
}  # fmt: skip

# Text an approver must read as it is: no marks at all.
PLAIN = [
    string.printable.replace("\r", "").replace("\x0b", "").replace("\x0c", ""),
    "# Quarterly\n\n\tnumbers are up ✓ — 12 % · “quoted” é ß",
    "שלום עולם مرحبا 你好 こんにちは Привет",  # strong right-to-left letters are text, not controls
    "non\u00a0breaking\u2009thin\u3000ideographic spaces",  # Zs: shown as space
    "e\u0301 combining acute, emoji 😀 without a selector",
]


def _ignorable(cp: int) -> bool:
    return any(lo <= cp <= hi for lo, hi in DEFAULT_IGNORABLE)


def test_every_control_format_private_surrogate_unassigned_and_separator_is_a_mark() -> None:
    missed = [
        f"U+{cp:04X}"
        for cp in ALL
        if unicodedata.category(chr(cp)) in FLAGGED_CATEGORIES
        and chr(cp) not in "\n\t"
        and visible.label(chr(cp)) is None
    ]
    assert missed == []


def test_every_default_ignorable_character_is_a_mark() -> None:
    missed = [f"U+{cp:04X}" for cp in ALL if _ignorable(cp) and visible.label(chr(cp)) is None]
    assert missed == []


def test_letters_digits_punctuation_symbols_marks_and_spaces_are_shown_as_themselves() -> None:
    # Everything outside the two rules above is text, but the one blank that renders as nothing.
    flagged = [
        f"U+{cp:04X}"
        for cp in ALL
        if unicodedata.category(chr(cp)) not in FLAGGED_CATEGORIES
        and not _ignorable(cp)
        and visible.label(chr(cp)) is not None
    ]
    assert flagged == ["U+2800"]


def test_newline_and_tab_are_shown_as_themselves() -> None:
    assert visible.label("\n") is None and visible.label("\t") is None
    assert visible.marked("a\n\tb\n") == ("a\n\tb\n", 0, False)


@pytest.mark.parametrize(("cp", "expected"), sorted(NAMED.items()))
def test_named_characters_carry_their_labels(cp: int, expected: str) -> None:
    assert visible.label(chr(cp)) == expected
    assert visible.mark(chr(cp)) == f"U+{cp:04X} {expected}"


def test_every_c0_and_c1_control_has_its_own_short_name() -> None:
    controls = [chr(cp) for cp in [*range(0x20), *range(0x7F, 0xA0)] if chr(cp) not in "\n\t"]
    labels = [visible.label(c) for c in controls]
    assert all(label and label.isalnum() and label.isupper() and len(label) <= 4 for label in labels)
    assert len(set(labels)) == len(controls)


def test_labels_are_printable_ascii_without_brackets() -> None:
    # A label is shown where the character was: it must not itself hide, reorder or close a mark.
    labels = {label for _, _, label in visible.table()}
    bad = [
        label for label in labels if not label.isascii() or not label.isprintable() or set(label) & set("[]")
    ]
    assert bad == []


@pytest.mark.parametrize("text", PLAIN)
def test_ordinary_text_has_no_marks(text: str) -> None:
    shown = visible.marked(text)
    assert (shown.text, shown.marks) == (text, 0)


def test_disguised_report_is_shown_with_every_hidden_character_marked() -> None:
    text = "Transfer to account 1234\u202e9876\u202c today\u200b\x1b[31m\U000e0061"
    shown = visible.marked(text)
    assert shown.text == (
        "Transfer to account 1234[U+202E RLO]9876[U+202C PDF] today[U+200B ZWSP][U+001B ESC][31m"
        "[U+E0061 TAG a]"
    )
    assert shown.marks == 5
    assert visible.warning(shown.marks) == "5 invisible or control characters are shown as marks"
    assert visible.warning(1) == "1 invisible or control character is shown as marks"


def test_marked_text_holds_no_flagged_character() -> None:
    every_flagged = "".join(chr(cp) for first, last, _ in visible.table() for cp in range(first, last + 1))
    shown = visible.marked(every_flagged)
    assert shown.marks == len(every_flagged)
    assert all(visible.label(c) is None for c in shown.text)


def test_the_pages_table_agrees_with_the_classifier_on_every_code_point() -> None:
    runs = visible.table()
    firsts = [first for first, _, _ in runs]
    assert firsts == sorted(firsts)
    assert all(
        first <= last < next_first for (first, last, _), next_first in zip(runs, firsts[1:], strict=False)
    )

    def looked_up(cp: int) -> str | None:  # what approvals.js does: a binary search of the runs
        i = bisect.bisect_right(firsts, cp) - 1
        return runs[i][2] if i >= 0 and runs[i][1] >= cp else None

    disagree = [f"U+{cp:04X}" for cp in ALL if looked_up(cp) != visible.label(chr(cp))]
    assert disagree == []


def test_right_to_left_letters_are_found_but_not_marked() -> None:
    for text in ("\u05d0", "x \u0627 y", "\u07c0", "\U00010800"):  # Hebrew, Arabic, NKo, Cypriot
        shown = visible.marked(text)
        assert shown == (text, 0, True)
    assert not visible.marked("Latin 123 \u00e9 \u4f60 \u0661").right_to_left  # Arabic-Indic digit: AN
    assert visible.notice(visible.marked("\u05d0 2222 3333")) == (
        "Warning: the content has right-to-left letters: words and numbers beside them may be "
        "shown in another order than they are stored.\n\n"
    )


def test_notice_counts_marks_and_is_empty_for_plain_text() -> None:
    assert visible.notice(visible.marked("plain\ttext\n")) == ""
    assert visible.notice(visible.marked("a\u200bb\u202e")) == (
        "Warning: 2 invisible or control characters are shown as marks [U+XXXX NAME].\n\n"
    )


def test_the_pages_right_to_left_table_agrees_on_every_code_point() -> None:
    runs = visible.right_to_left_table()
    firsts = [first for first, _ in runs]
    assert all(first <= last < nxt for (first, last), nxt in zip(runs, [*firsts[1:], 0x110000], strict=True))

    def looked_up(cp: int) -> bool:
        i = bisect.bisect_right(firsts, cp) - 1
        return i >= 0 and runs[i][1] >= cp

    disagree = [f"U+{cp:04X}" for cp in ALL if looked_up(cp) != visible.right_to_left(chr(cp))]
    assert disagree == []
    assert all(
        unicodedata.bidirectional(chr(cp)) in {"R", "AL"} for first, last in runs for cp in (first, last)
    )
