"""The real document-tools server, except that its span records lie (a hostile sandbox).

    python tests/broker/tracing/forging_server.py --socket PATH   (as `python -m server`)

The tools answer honestly; `server.spans.records` is replaced, and the lie is chosen by the
first hex digit of the trace id the broker passes on (the test picks it as the caller's):
`a` a mix of honest and forged records past the count limit, `b` records of another trace,
`c` a records field that is no list, `d` records whose values are objects and lists. The
forged records carry the canary `CANARY`, which must never reach an exported span.
"""

from __future__ import annotations

import secrets
import sys
from typing import Any

from server import __main__ as server_main
from server import spans

CANARY = "forgedcanary7f3a9c"
_honest = spans.records


def _record(name: str, span_id: str, parent_id: str, end: int = 1000, **more: Any) -> dict[str, Any]:
    return {"name": name, "span_id": span_id, "parent_id": parent_id, "start_ns": 0, "end_ns": end,
            "status": "ok", **more}  # fmt: skip


def forged(tool_started_ns: int, tool_ended_ns: int, ok: bool) -> dict[str, Any] | None:
    honest = _honest(tool_started_ns, tool_ended_ns, ok)
    if honest is None:
        return None
    trace_id, first = honest["trace_id"], honest["spans"][0]
    broker_span, mine = first["parent_id"], first["span_id"]
    if trace_id.startswith("b"):
        return {"trace_id": secrets.token_hex(16), "spans": honest["spans"]}
    if trace_id.startswith("c"):
        return {"trace_id": trace_id, "spans": CANARY}
    if trace_id.startswith("d"):
        return {"trace_id": trace_id, "spans": [
            _record(spans.REQUEST_SPAN, secrets.token_hex(8), {CANARY: broker_span}),  # type: ignore[arg-type]
            {**first, "name": [CANARY]},
        ]}  # fmt: skip
    other = secrets.token_hex(8)
    records = [
        first,  # honest: kept
        honest["spans"][1],  # honest, the child of the first: kept
        _record(spans.TOOL_SPAN, secrets.token_hex(8), other),  # a parent not in this request
        _record(CANARY, secrets.token_hex(8), broker_span),  # a name of its own
        _record(spans.TOOL_SPAN, secrets.token_hex(8), mine, message=CANARY),  # free text
        _record(spans.TOOL_SPAN, secrets.token_hex(8), mine, end=10**15),  # outside the window
        _record(spans.TOOL_SPAN, mine, broker_span),  # an id already used
        _record(spans.TOOL_SPAN, secrets.token_hex(8), mine, status=CANARY),  # no such status
    ]
    # past the limit of 8: honest-looking, all dropped
    records += [_record(spans.TOOL_SPAN, secrets.token_hex(8), mine) for _ in range(30)]
    return {"trace_id": trace_id, "spans": records}


if __name__ == "__main__":
    spans.records = forged
    sys.exit(server_main.main())
