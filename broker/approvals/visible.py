"""What the human approving a report sees: every character that could hide or disguise text as a mark.

A report is approved by reading it, so what the approver reads must be what will be written.
Bidi controls reorder what is shown (``1234<RLO>9876`` reads "12346789"), zero-width and other
default-ignorable characters show nothing at all, control characters such as ESC drive the
terminal that shows them. None of them is shown as itself: each becomes a labelled mark
(``[U+202E RLO]`` in text, a bordered span on the approvals page), and the marks are counted
so the approver is warned before reading.

One classifier for both surfaces: the in-band question text (`marked`, `notice`) and the
approvals page, whose script gets this module's classification as tables of code-point ranges
(`table`, `right_to_left_table`).

Flagged (``label`` is not None): general categories Cc (but newline and tab, which are the
line structure and indentation of Markdown and hide nothing), Cf, Co, Cs, Cn, Zl, Zp; Unicode's
Default_Ignorable_Code_Point characters outside them (variation selectors, Hangul fillers,
the combining grapheme joiner, …); and U+2800, a Braille blank that renders as nothing.
Spaces (Zs) stay as they are: they show as space. Labels are ASCII only.
"""

from __future__ import annotations

import functools
import unicodedata
from typing import NamedTuple

SHOWN_AS_IS = frozenset("\n\t")
FLAGGED_CATEGORIES = frozenset({"Cc", "Cf", "Co", "Cs", "Cn", "Zl", "Zp"})

_C0 = (
    "NUL SOH STX ETX EOT ENQ ACK BEL BS HT LF VT FF CR SO SI "
    "DLE DC1 DC2 DC3 DC4 NAK SYN ETB CAN EM SUB ESC FS GS RS US"
).split()
_C1 = (
    "PAD HOP BPH NBH IND NEL SSA ESA HTS HTJ VTS PLD PLU RI SS2 SS3 "
    "DCS PU1 PU2 STS CCH MW SPA EPA SOS SGCI SCI CSI ST OSC PM APC"
).split()
_SHORT = {
    0x007F: "DEL",
    0x00AD: "SHY",
    0x034F: "CGJ",
    0x061C: "ALM",
    0x180E: "MVS",
    0x200B: "ZWSP",
    0x200C: "ZWNJ",
    0x200D: "ZWJ",
    0x200E: "LRM",
    0x200F: "RLM",
    0x2028: "LS",
    0x2029: "PS",
    0x202A: "LRE",
    0x202B: "RLE",
    0x202C: "PDF",
    0x202D: "LRO",
    0x202E: "RLO",
    0x2060: "WJ",
    0x2066: "LRI",
    0x2067: "RLI",
    0x2068: "FSI",
    0x2069: "PDI",
    0xFEFF: "BOM",
    0xE0001: "LANGUAGE TAG",
    0xE0020: "TAG SPACE",
    0xE007F: "CANCEL TAG",
}
# Default_Ignorable_Code_Point (Unicode DerivedCoreProperties) outside the flagged categories,
# plus the Braille blank: characters that render as nothing although they are letters or marks.
_INVISIBLE = frozenset(
    chr(cp)
    for lo, hi in (
        (0x034F, 0x034F),
        (0x115F, 0x1160),
        (0x17B4, 0x17B5),
        (0x180B, 0x180D),
        (0x180F, 0x180F),
        (0x2800, 0x2800),
        (0x3164, 0x3164),
        (0xFE00, 0xFE0F),
        (0xFFA0, 0xFFA0),
        (0xE0100, 0xE01EF),
    )
    for cp in range(lo, hi + 1)
)
_CATEGORY_LABELS = {"Co": "private use", "Cs": "surrogate", "Cn": "unassigned"}
_RIGHT_TO_LEFT = frozenset({"R", "AL"})


def label(char: str) -> str | None:
    """The mark's label for one character, or None when it is shown as itself."""
    category = unicodedata.category(char)
    if (category not in FLAGGED_CATEGORIES and char not in _INVISIBLE) or char in SHOWN_AS_IS:
        return None
    cp = ord(char)
    if cp in _SHORT:
        return _SHORT[cp]
    if cp < 0x20:
        return _C0[cp]
    if 0x80 <= cp < 0xA0:
        return _C1[cp - 0x80]
    if 0xFE00 <= cp <= 0xFE0F:
        return f"VS{cp - 0xFE00 + 1}"
    if 0xE0100 <= cp <= 0xE01EF:
        return f"VS{cp - 0xE0100 + 17}"
    if 0x180B <= cp <= 0x180F:
        return f"FVS{cp - 0x180B + 1 if cp != 0x180F else 4}"
    if 0xE0030 <= cp <= 0xE007A and chr(cp - 0xE0000).isalnum():
        # Tag characters spell hidden ASCII text ("ASCII smuggling"): the mark shows which.
        return f"TAG {chr(cp - 0xE0000)}"
    if category in _CATEGORY_LABELS:
        return _CATEGORY_LABELS[category]
    return unicodedata.name(char, category)


def mark(char: str) -> str:
    """The text of one mark, e.g. ``U+202E RLO``."""
    return f"U+{ord(char):04X} {label(char)}"


def right_to_left(char: str) -> bool:
    """A strong right-to-left letter (Hebrew, Arabic, …): text beside it may be drawn reordered."""
    return unicodedata.bidirectional(char) in _RIGHT_TO_LEFT


class Shown(NamedTuple):
    text: str  # the text with every flagged character replaced by ``[U+XXXX LABEL]``
    marks: int  # how many were replaced
    right_to_left: bool  # it has right-to-left letters


def marked(text: str) -> Shown:
    parts: list[str] = []
    marks = 0
    for char in text:
        if label(char) is None:
            parts.append(char)
        else:
            parts.append(f"[{mark(char)}]")
            marks += 1
    return Shown("".join(parts), marks, any(right_to_left(char) for char in text))


def warning(marks: int) -> str:
    """The sentence shown above content with marks (the page builds the same sentence)."""
    noun = "character is" if marks == 1 else "characters are"
    return f"{marks} invisible or control {noun} shown as marks"


# Without any control character, the Unicode bidi algorithm draws numbers and words that stand
# among right-to-left letters in another order than stored ("A 1111 2222" as "2222 1111 A"):
# legitimate in Hebrew or Arabic, so not marked, but the approver is told.
RIGHT_TO_LEFT_WARNING = (
    "the content has right-to-left letters: words and numbers beside them may be shown "
    "in another order than they are stored"
)


def notice(shown: Shown) -> str:
    """The warnings to put above marked text, a line each and a blank line ("" if none)."""
    lines = [f"Warning: {warning(shown.marks)} [U+XXXX NAME]."] if shown.marks else []
    if shown.right_to_left:
        lines.append(f"Warning: {RIGHT_TO_LEFT_WARNING}.")
    return "".join(line + "\n" for line in lines) + ("\n" if lines else "")


@functools.cache
def table() -> tuple[tuple[int, int, str], ...]:
    """Every flagged code point as sorted, inclusive ``(first, last, label)`` runs, for the page.

    Built by asking `label` about every code point, so the page cannot disagree with the
    question text; about a thousand runs, computed once per process.
    """
    runs: list[tuple[int, int, str]] = []
    for cp in range(0x110000):
        name = label(chr(cp))
        if name is None:
            continue
        if runs and runs[-1][1] == cp - 1 and runs[-1][2] == name:
            runs[-1] = (runs[-1][0], cp, name)
        else:
            runs.append((cp, cp, name))
    return tuple(runs)


@functools.cache
def right_to_left_table() -> tuple[tuple[int, int], ...]:
    """Every right-to-left letter as sorted, inclusive ``(first, last)`` runs, for the page."""
    runs: list[tuple[int, int]] = []
    for cp in range(0x110000):
        if not right_to_left(chr(cp)):
            continue
        if runs and runs[-1][1] == cp - 1:
            runs[-1] = (runs[-1][0], cp)
        else:
            runs.append((cp, cp))
    return tuple(runs)
