"""How deep a JSON line nests, checked before it is parsed.

Python's json parser recurses once per `[` or `{`: a line of 100k `[` planted in a log, a
witness or a proof raised `RecursionError` out of `audit verify`, `prove` and `verify-proof`
(a traceback, no line named). The audit's own lines nest three deep (a checkpoint line: the
record, its checkpoint, its frontier list), so anything past `MAX_DEPTH` is refused as a bad
line before the parser sees it.
"""

from __future__ import annotations

import re
from typing import Final

MAX_DEPTH: Final = 32

_STRING: Final = re.compile(rb'"(?:[^"\\]|\\.)*"', re.DOTALL)
_BRACKETS: Final = re.compile(rb"[\[{]+|[\]}]+")


def too_deep(data: bytes) -> bool:
    """Whether the JSON text `data` nests arrays and objects more than `MAX_DEPTH` deep.

    Counting brackets bounds the depth from above, in C, so a valid line costs two scans. Only
    a line with more brackets than the limit is looked at closely: strings dropped (a `[` in a
    name is no nesting), then the depth followed run by run, so 100k `[` is one step.
    """
    if data.count(b"[") + data.count(b"{") <= MAX_DEPTH:
        return False
    depth = 0
    for run in _BRACKETS.finditer(_STRING.sub(b"", data)):
        text = run.group()
        depth += len(text) if text[:1] in b"[{" else -len(text)
        if depth > MAX_DEPTH:
            return True
    return False
