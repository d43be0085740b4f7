"""The table `docbroker audit query` prints: one row per event, every value escaped.

The log may have been written by someone other than the broker (an attacker who can write the
file plants lines), and the table goes to a terminal: a raw ESC, CSI (C1), carriage return or
backspace in a value could set the window title, clear the screen or overwrite the real rows
above it, and a bidi override could reorder what the reader sees. So every character that is
not printable is shown as a visible escape (`\\x1b`, `\\u202e`), and the backslash itself as
`\\\\`, so an escape in the output always means the escaped character was in the log.
"""

from __future__ import annotations

from typing import Any, Final

COLUMNS: Final = (
    ("ts", 25),
    ("event", 18),
    ("tenant", 14),
    ("subject", 24),
    ("outcome", 16),
    ("reason", 22),
    ("method", 16),
    ("tool", 18),
    ("id", 0),  # the last column is not padded or cut
)


def table_header() -> str:
    return _row({name: name.upper() for name, _ in COLUMNS})


def table_row(record: dict[str, Any]) -> str:
    cells = {name: _cell(record.get(name)) for name, _ in COLUMNS}
    cells["id"] = _cell(record.get("request_id") or record.get("approval_id") or record.get("sandbox"))
    return _row(cells)


def escape(text: str) -> str:
    """`text` with every non-printable character (and the backslash) as a visible escape."""
    if text.isprintable() and "\\" not in text:
        return text  # the usual case: one C-level scan
    return "".join(c if c.isprintable() and c != "\\" else _escaped(c) for c in text)


def _escaped(char: str) -> str:
    code = ord(char)
    if char == "\\":
        return "\\\\"
    if code <= 0xFF:
        return f"\\x{code:02x}"
    return f"\\u{code:04x}" if code <= 0xFFFF else f"\\U{code:08x}"


def _cell(value: object) -> str:
    return "-" if value is None else escape(str(value))


def _row(cells: dict[str, str]) -> str:
    out = []
    for name, width in COLUMNS:
        text = cells[name]
        if width:
            text = text if len(text) < width else text[: width - 2] + "…"
            text = text.ljust(width)
        out.append(text)
    return " ".join(out).rstrip()
