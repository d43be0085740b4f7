"""`jsonrpc.parse` reads strict JSON exactly as `json.loads` does, whatever JSON library is fastest,
and refuses what the broker could not write back or the sandbox could read another way."""

from __future__ import annotations

import json

import pytest

from broker.protocol import jsonrpc as rpc

PING = b'"jsonrpc":"2.0","id":1,"method":"ping"'
BODIES = {
    "plain": b'{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"read_document"}}',
    "big-int-id": b'{"jsonrpc":"2.0","id":1180591620717411303424,"method":"ping"}',
    "big-int-argument": b"{" + PING + b',"params":{"arguments":{"n":-99999999999999999999}}}',
    "paired-surrogates": b'{"jsonrpc":"2.0","id":"\\ud83d\\ude00","method":"ping"}',
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


# What the broker cannot encode again (a lone surrogate: the answer carrying that id failed only
# after the call had run), numbers JSON has no spelling for, and bytes that are not UTF-8 JSON.
BIG = b'"n":12345678901234567890'  # takes the standard library's path
REFUSED = {
    "lone-surrogate-id": b'{"jsonrpc":"2.0","id":"\\ud800","method":"ping"}',
    "lone-low-surrogate": b'{"jsonrpc":"2.0","id":"\\udfff","method":"ping"}',
    "lone-surrogate-argument": b"{" + PING + b',"params":{"arguments":{"content":"a\\ud800b"}}}',
    "lone-surrogate-key": b"{" + PING + b',"params":{"arguments":{"\\udbff":1}}}',
    "nan": b"{" + PING + b',"params":{"a":NaN}}',
    "infinity": b"{" + PING + b',"params":{"b":-Infinity}}',
    "overflow": b"{" + PING + b',"params":{"c":1e400}}',
    "bom": b'\xef\xbb\xbf{"jsonrpc":"2.0","id":1,"method":"ping"}',
    "utf-16": '{"jsonrpc":"2.0","id":1,"method":"ping"}'.encode("utf-16"),
    "big-int-and-lone-surrogate": b"{" + PING + b',"params":{' + BIG + b',"s":"\\ud800"}}',
    "big-int-and-nan": b"{" + PING + b',"params":{' + BIG + b',"a":NaN}}',
    "big-int-and-overflow": b"{" + PING + b',"params":{' + BIG + b',"a":-1e999}}',
    "big-int-and-bom": b"\xef\xbb\xbf{" + PING + b',"params":{' + BIG + b"}}",
    "big-int-and-latin-1": b"{" + PING + b',"params":{' + BIG + b',"s":"\xe9"}}',
}


@pytest.mark.parametrize("raw", REFUSED.values(), ids=REFUSED.keys())
def test_parse_refuses_what_cannot_be_encoded_or_is_not_strict_json(raw: bytes) -> None:
    with pytest.raises(rpc.RpcParseError) as caught:
        rpc.parse(raw)
    assert (caught.value.code, caught.value.reason) == (rpc.PARSE_ERROR, "parse_error")


@pytest.mark.parametrize("raw", BODIES.values(), ids=BODIES.keys())
def test_what_parse_accepts_encodes_again(raw: bytes) -> None:
    assert json.loads(rpc.encode(rpc.parse(raw).body)) == json.loads(raw)


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
