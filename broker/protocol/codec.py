"""The one JSON codec: every JSON the broker reads or writes goes through here.

Three readers for three trust levels, one writer:

- `loads_client`: a client's JSON-RPC body, strict RFC 8259 in UTF-8, and only what the broker
  can write back unchanged (raises ValueError / RecursionError);
- `loads_sandbox`: a sandbox's message, or None for anything that is not JSON;
- `loads_strict`: the broker's own documents (JWT segments, audit lines), refusing duplicate
  members and NaN/Infinity (raises ValueError / RecursionError);
- `encode`: compact UTF-8 JSON.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

import orjson

_LONG_DIGITS = re.compile(rb"[0-9]{19}")


class StrictJsonError(ValueError):
    """JSON the broker refuses although `json` would read it."""


def _refuse_constant(name: str) -> Any:
    raise StrictJsonError("NaN and Infinity are not JSON")


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):  # 1e400: a number the broker could not write back as JSON
        raise StrictJsonError("number out of range")
    return value


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    # Two "alg" members, or two equal audit keys: parsers disagree on which one wins, so refuse.
    obj = dict(pairs)
    if len(obj) != len(pairs):
        raise StrictJsonError("duplicate member")
    return obj


def loads_client(raw: bytes) -> Any:
    """Strict RFC 8259 JSON in UTF-8, and only what the broker can write back unchanged.

    Anything the broker reads it must also be able to encode (an answer carries the request's
    id; a forwarded body may be rebuilt), and read the way the sandbox will: a value accepted
    here but not encodable (a lone surrogate) failed only after the call had run. So NaN,
    infinities, lone surrogates, a BOM and other encodings are refused, as orjson refuses
    them. The standard library only reads what orjson reads differently: an integer past
    64 bits (orjson makes it a float), held in a run of 19 digits."""
    if _LONG_DIGITS.search(raw) is None:
        return orjson.loads(raw)
    body = json.loads(raw.decode("utf-8"), parse_constant=_refuse_constant, parse_float=_finite)
    try:
        json.dumps(body, ensure_ascii=False).encode("utf-8")  # a lone surrogate cannot be
    except UnicodeEncodeError:
        raise StrictJsonError("lone surrogate") from None
    return body


def loads_sandbox(raw: bytes | None) -> Any:
    """A sandbox's JSON, or None. orjson is stricter than `json` (no NaN, depth capped at
    1024); an integer past 64 bits becomes a float, so an answer with such an id matches no
    request, which is how the gateway treats any stray answer."""
    if not raw:
        return None
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None


def loads_strict(text: str, *, finite: bool = False) -> Any:
    """The broker's own documents: duplicate members and NaN/Infinity refused; with `finite`,
    numbers out of a float's range too (a claim cannot hold 1e400)."""
    if finite:
        return json.loads(
            text, object_pairs_hook=_no_duplicates, parse_constant=_refuse_constant, parse_float=_finite
        )
    return json.loads(text, object_pairs_hook=_no_duplicates, parse_constant=_refuse_constant)


def encode(body: dict[str, Any]) -> bytes:
    """Compact UTF-8 JSON, the same bytes as `json.dumps(separators=(",", ":"), ensure_ascii=False)`.

    orjson: every answer passes through here, and it encodes an order of magnitude faster than
    the standard library (bench/broker_overhead.py measures it)."""
    try:
        return orjson.dumps(body)
    except TypeError:  # an integer past 64 bits (a client's own request id): the slow, exact way
        return json.dumps(body, separators=(",", ":"), ensure_ascii=False).encode()
