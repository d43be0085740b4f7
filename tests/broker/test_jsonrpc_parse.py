"""`jsonrpc.parse` reads bodies exactly as `json.loads` does, whatever JSON library is fastest."""

from __future__ import annotations

import json

import pytest

from broker.gateway import jsonrpc as rpc

PING = b'"jsonrpc":"2.0","id":1,"method":"ping"'
BODIES = {
    "plain": b'{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"read_document"}}',
    "big-int-id": b'{"jsonrpc":"2.0","id":1180591620717411303424,"method":"ping"}',
    "big-int-argument": b"{" + PING + b',"params":{"arguments":{"n":-99999999999999999999}}}',
    "nan-and-infinity": b"{" + PING + b',"params":{"a":NaN,"b":-Infinity,"c":1e400}}',
    "lone-surrogate": b'{"jsonrpc":"2.0","id":"\\ud800","method":"ping"}',
    "bom": b'\xef\xbb\xbf{"jsonrpc":"2.0","id":1,"method":"ping"}',
    "utf-16": '{"jsonrpc":"2.0","id":1,"method":"ping"}'.encode("utf-16"),
    "duplicate-keys": b'{"jsonrpc":"2.0","id":1,"id":2,"method":"ping"}',
    "floats": b"{" + PING + b',"params":{"x":1.5e-7,"y":0.1000000000000000055511,"z":-0.0}}',
    "escapes": b'{"jsonrpc":"2.0","id":"\\u0000\\u2028\\"","method":"ping"}',
}


@pytest.mark.parametrize("raw", BODIES.values(), ids=BODIES.keys())
def test_parse_reads_what_the_standard_library_reads(raw: bytes) -> None:
    expected = json.loads(raw)
    body = rpc.parse(raw).body
    assert json.dumps(body, sort_keys=True) == json.dumps(expected, sort_keys=True)
    assert [type(v) for v in _leaves(body)] == [type(v) for v in _leaves(expected)]


def test_deep_nesting_is_a_parse_error_not_a_crash() -> None:
    raw = b'{"jsonrpc":"2.0","id":1,"method":"ping","params":' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    with pytest.raises(rpc.RpcParseError) as caught:
        rpc.parse(raw)
    assert caught.value.code == rpc.PARSE_ERROR


def _leaves(value: object) -> list[object]:
    if isinstance(value, dict):
        return [leaf for key in sorted(value) for leaf in _leaves(value[key])]
    if isinstance(value, list):
        return [leaf for item in value for leaf in _leaves(item)]
    return [value]
