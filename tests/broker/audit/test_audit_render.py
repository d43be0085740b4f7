"""The audit line renderer: its fast path must write exactly the canonical form `verify` expects.

`render_json` takes orjson's bytes when they are pure ASCII and falls back to the standard
library otherwise; `canonical` (used by `verify`) is always the standard library. Any byte of
difference would make a freshly written line fail verification, so the two are compared on
edge cases and on many random records.
"""

from __future__ import annotations

import json
import random
import string
from typing import Any

import pytest

from broker.audit.processors import canonical, render_json


def exact(record: dict[str, Any]) -> str:
    return json.dumps(record, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False)


@pytest.mark.parametrize(
    "record",
    [
        {"event": "mcp.request", "seq": 1, "duration_ms": 1.234, "arg_names": ["filename"]},
        {"subject": "del\x7f"},  # json escapes DEL, orjson would not
        {"subject": "ctl\x00\x01\x08\x1f\t\n\r"},
        {"subject": "é user", "tenant": "acme"},  # non-ASCII: the exact path
        {"subject": "line\u2028sep", "b": "😀"},
        {"request_id": "a:null", "ok": True, "no": False},
        {"big": 2**53, "neg": -(2**63), "zero": 0.0, "tiny": 1e-7, "huge": 1e21, "mid": 0.001},
        {"floats": [1e-5, 2.5, 1e300], "neg": -1.5e-9},
        {"z": 1, "a": 2, "M": 3, "_": 4},  # key order: code points, as json sorts
    ],
)
def test_edge_cases_render_the_canonical_form(record: dict[str, Any]) -> None:
    assert render_json(None, "", dict(record)) == exact(record) == canonical(record)


@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf")])
def test_non_finite_numbers_are_refused_as_json_refuses_them(value: float) -> None:
    with pytest.raises(ValueError):
        render_json(None, "", {"duration_ms": value})


def test_a_lone_surrogate_is_escaped_like_json_does() -> None:
    record = {"subject": "x\ud800y"}
    assert render_json(None, "", record) == exact(record)


def test_random_records_render_the_canonical_form() -> None:
    rng = random.Random(20261130)
    chars = [chr(i) for i in range(128)] + ["é", "\u2028", "😀", "\ud800"]
    for _ in range(20_000):
        record: dict[str, Any] = {}
        for _ in range(rng.randint(1, 8)):
            key = "".join(rng.choice(string.ascii_letters + "_") for _ in range(rng.randint(1, 8)))
            kind = rng.random()
            if kind < 0.4:
                record[key] = "".join(rng.choice(chars) for _ in range(rng.randint(0, 12)))
            elif kind < 0.6:
                record[key] = rng.randint(-(2**63), 2**63)
            elif kind < 0.7:
                record[key] = rng.choice(
                    [round(rng.uniform(0, 1e6), 3), rng.uniform(-1, 1) * 10 ** rng.randint(-30, 30)]
                )
            elif kind < 0.8:
                record[key] = rng.choice([True, False])
            else:
                record[key] = sorted({"".join(rng.choices(string.ascii_letters, k=3)) for _ in range(3)})
        assert render_json(None, "", dict(record)) == exact(record), record
