"""large_json in isolation: its pieces give what the one-go codec gives, text and errors alike.

The KServe HTTP front hands large JSON to kernel.transports.http.large_json (issue 23); a client
must not be able to tell which path its request or answer took. Each case runs through both
paths with pieces made small, so that every case is cut into many of them.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from kernel.core.errors import KernelError
from kernel.core.request import InferResponse, InferTensor
from kernel.core import datatypes
from kernel.transports.http import codec, json_scan, large_json


@pytest.fixture(autouse=True)
def small_pieces(monkeypatch):
    monkeypatch.setattr(large_json, "PIECE_ELEMENTS", 7)
    monkeypatch.setattr(large_json, "PIECE_BYTES", 13)
    monkeypatch.setattr(json_scan, "WINDOW_BYTES", 11)
    monkeypatch.setattr(json_scan, "SCAN_WINDOW_BYTES", 7)


def tensor(name: str, datatype: str, values) -> InferTensor:
    if datatype == "BYTES":
        arr = np.array(values, dtype=np.object_)
        return InferTensor(name, datatype, arr.shape, raw=datatypes.serialize_bytes(arr.reshape(-1)))
    return InferTensor.from_numpy(name, np.asarray(values, dtype=datatypes.datatype_to_numpy(datatype)), datatype)


ANSWERS = [
    InferResponse("m", "1", "", [tensor("F", "FP32", np.arange(50, dtype=np.float32) * 0.1 - 2)]),
    InferResponse("m", "1", "id-1", [tensor("I", "INT64", [[1, -2, 3], [2**40, 5, 6]]),
                                     tensor("B", "BOOL", [True, False] * 9)], {"p": 1, "q": "x"}),
    InferResponse("m", "", "", [tensor("S", "BYTES", [b"a,b", "é".encode(), b"\xff\xfe", b"", b'"q"'] * 4),
                                tensor("E", "FP16", np.zeros((0, 3))), tensor("U", "UINT8", np.arange(30))]),
    InferResponse("m", "2", "", [tensor("D", "FP64", [1e300, -0.0, 1.5e-300, 3.0] * 5)]),
]


@pytest.mark.parametrize("response", ANSWERS, ids=lambda r: ",".join(t.name for t in r.outputs))
@pytest.mark.parametrize("binary", [{}, {"F": True, "I": True, "U": True}])
def test_answers_in_pieces_are_the_one_go_text(response, binary):
    want = codec.encode_infer_response(response, False, binary)
    got = large_json.encode_answer(response, False, binary, 1 << 30)
    if want[1] is None:
        assert got[1] is None and bytes(got[0]) == want[0]
    else:
        assert got[1] == want[1] and [bytes(p) for p in got[0]] == [bytes(p) for p in want[0]]


def test_an_answer_over_the_limit_is_refused_early_or_while_written():
    response = ANSWERS[0]
    size = len(codec.encode_infer_response(response, False, {})[0])
    assert large_json.encode_answer(response, False, {}, size)[1] is None  # exactly at the limit: fine
    for limit in (size - 1, 100, 10):
        with pytest.raises(KernelError) as info:
            large_json.encode_answer(response, False, {}, limit)
        assert f"more than {limit} bytes as JSON (--http-max-json-output-size)" in info.value.message
        assert "'binary_data'" in info.value.message
    with pytest.raises(codec.LargeJson):  # the one-go path hands large outputs over
        codec.encode_infer_response(InferResponse("m", "1", "", [tensor("F", "FP32", np.zeros(20000))]),
                                    False, {}, 1 << 30)


def request_body(inputs: list, extra: dict = None) -> bytes:
    return json.dumps({"inputs": inputs, **(extra or {})}).encode()


def inp(name, datatype, shape, data) -> dict:
    return {"name": name, "datatype": datatype, "shape": shape, "data": data}


REQUESTS = {
    "flat": request_body([inp("A", "INT32", [40], list(range(-20, 20)))]),
    "nested": request_body([inp("A", "FP32", [4, 5], [[i * 0.5 + j for j in range(5)] for i in range(4)])]),
    "whitespace": (b'{"inputs": [ {"name": "A", "datatype": "INT16", "shape": [2, 3], '
                   b'"data": [ [ 1 ,\n 2, 3] , [4,5 , 6 ] ] } ] }'),
    "scalar": request_body([inp("A", "INT32", [1], 7)]),
    "bools": request_body([inp("A", "BOOL", [6], [True, False, True, True, False, False])]),
    "uint": request_body([inp("A", "UINT64", [3], [0, 2**63, 2**64 - 1])]),
    "strings": request_body([inp("S", "BYTES", [3], ["a,b", "[]", "é"])]),
    "empty": request_body([inp("A", "FP32", [0], [])]),
    "empty_nested": request_body([inp("A", "FP32", [0, 2], [[], []])]),
    "two_inputs": request_body([inp("A", "INT8", [3], [1, 2, 3]), inp("B", "FP64", [2], [1e308, -1e-308])],
                               {"id": "r", "parameters": {"k": 1}, "outputs": [{"name": "X"}]}),
    "wrong_count": request_body([inp("A", "INT32", [41], list(range(40)))]),
    "float_for_int": request_body([inp("A", "INT32", [40], [1.5] + list(range(39)))]),
    "float_and_count": request_body([inp("A", "INT32", [41], list(range(39)) + [1.5])]),
    "negative_unsigned": request_body([inp("A", "UINT8", [20], list(range(19)) + [-1])]),
    "overflow": request_body([inp("A", "INT8", [20], list(range(19)) + [300])]),
    "bool_for_number": request_body([inp("A", "FP32", [20], [True] * 20)]),
    "null": request_body([inp("A", "FP32", [1], None)]),
    "string_for_number": request_body([inp("A", "FP32", [2], ["1,2", 3])]),
    "object": request_body([inp("A", "FP32", [1], {"a": [1, 2]})]),
    "no_data": request_body([{"name": "A", "datatype": "FP32", "shape": [1]}]),
    "bad_datatype": request_body([inp("A", "FP33", [1], [1])]),
    "negative_shape": request_body([inp("A", "FP32", [-1], [1])]),
    "bf16": request_body([inp("A", "BF16", [1], [1])]),
    "first_bad_wins": request_body([inp("A", "INT32", [1], [1.5]), inp("B", "INT32", [2], [1])]),
    "binary_and_json": None,  # built below: binary data after the JSON header
    # issue 31: strings, nesting and objects are read in pieces too; bounds and parameters alike
    "strings_nested": request_body([inp("S", "BYTES", [2, 3], [["a", "[b]", "c,d"], ['"q"', "x\\", 'y\\"],[']])]),
    "strings_escaped": request_body([inp("S", "BYTES", [6], ["\\", '\\"', "\\\\", "]", "", "\u00e9\u005b,"])]),
    "strings_and_empties": request_body([inp("S", "BYTES", [3], [[], ["a", []], [[["b, ["]]], [], "c"])]),
    "numbers_and_empties": request_body([inp("A", "FP32", [3], [[], [1, []], [[2]], [ ], [3], []])]),
    "only_empties": request_body([inp("A", "INT32", [0], [[[]], [], [[], []]])]),
    "number_in_strings": request_body([inp("S", "BYTES", [3], ["a", 5, "b"])]),
    "null_in_strings": request_body([inp("S", "BYTES", [2], ["a", None])]),
    "strings_count": request_body([inp("S", "BYTES", [4], ["a", "b,c", "d"])]),
    "object_and_count": request_body([inp("A", "FP32", [3], [{"a": 1}, 2])]),
    "object_in_strings": request_body([inp("S", "BYTES", [3], ["a", {"b": "c,d"}])]),
    "object_nested": request_body([inp("A", "INT32", [2], [[1], [{"a": [1, 2]}]])]),
    "huge_integer": request_body([inp("A", "INT64", [2], [1, 10**30])]),
    "many_dims": request_body([inp("A", "INT32", [1] * 65, [1])]),
    "most_dims": request_body([inp("A", "INT32", [1] * 32, [1])]),
    "many_dims_long": request_body([inp("A", "INT32", [1] * 3000, [1])]),  # counted, not decoded
    "many_dims_later": request_body([inp("A", "INT32", [1], [1]), inp("B", "INT32", [1] * 100, [1])]),
    "shape_of_strings": request_body([inp("A", "INT32", [1], [1]), inp("B", "INT32", ["1"], [1])]),
    "many_inputs": request_body([inp(f"A{i}", "INT32", [1], [i]) for i in range(4097)]),
    "many_outputs": request_body([inp("A", "INT32", [1], [1])], {"outputs": [{"name": "X"}] * 4097}),
    "most_outputs": request_body([inp("A", "INT32", [1], [1])], {"outputs": [{"name": "X"}] * 4096}),
    "parameter_array": request_body([inp("A", "INT32", [1], [1])], {"parameters": {"k": 1, "a": [1, 2]}}),
    "parameter_large_object": request_body([inp("A", "INT32", [1], [1])], {"parameters": {"a": {"b": [0] * 100}}}),
    "priority_object": request_body([inp("A", "INT32", [1], [1])], {"parameters": {"priority": {"x": 1}}}),
    "parameter_null": request_body([inp("A", "INT32", [1], [1])], {"parameters": {"sequence_id": None}}),
    "input_parameter_array": request_body([dict(inp("A", "INT32", [1], [1]), parameters={"tags": [1, 2], "k": 1})],
                                          {"parameters": {"k": 2}}),
    "output_parameter_array": request_body([inp("A", "INT32", [1], [1])],
                                           {"outputs": [{"name": "X", "parameters": {"binary_data": True, "t": [[]] * 50}}]}),
    "misplaced_bracket": b'{"inputs": [{"name": "A", "datatype": "INT32", "shape": [2], "data": [1[2]]}]}',
    "misplaced_comma": b'{"inputs": [{"name": "A", "datatype": "INT32", "shape": [1], "data": [[],,1]}]}',
    "trailing_comma": b'{"inputs": [{"name": "A", "datatype": "INT32", "shape": [1], "data": [[1],]}]}',
    "values_side_by_side": b'{"inputs": [{"name": "A", "datatype": "INT32", "shape": [2], "data": [[1 2]]}]}',
    "strings_side_by_side": b'{"inputs": [{"name": "S", "datatype": "BYTES", "shape": [2], "data": [["a""b"]]}]}',
    "bracket_after_array": b'{"inputs": [{"name": "A", "datatype": "INT32", "shape": [2], "data": [[1][2]]}]}',
    "value_after_array": b'{"inputs": [{"name": "A", "datatype": "INT32", "shape": [2], "data": [[1]2]}]}',
    "bad_shape_json": b'{"inputs": [{"name": "A", "datatype": "INT32", "shape": [1,], "data": [1]}]}',
    "bad_parameter_json": b'{"inputs": [{"name": "A", "datatype": "INT32", "shape": [1], "data": [1]}], "parameters": {"a": [1,,2]}}',
    "bad_unknown_json": b'{"inputs": [{"name": "A", "datatype": "INT32", "shape": [1], "data": [1]}], "x": [[1] [2]]}',
    "unknown_fields": request_body([dict(inp("A", "INT32", [1], [1]), extra=[[1, "]"], {"a": [2]}])],
                                   {"extra": [1, [2, {"b": "["}]], "more": {"c": [[]]}}),
    "root_array": b'[{"inputs": []}]',
    "inputs_of_arrays": request_body([[1, 2]]),
    "name_array": b'{"inputs": [{"name": ["A"], "datatype": "INT32", "shape": [1], "data": [1]}]}',
    "deep_data": b'{"inputs": [{"name": "A", "datatype": "INT32", "shape": [1], "data": ' + b"[" * 800 + b"1" + b"]" * 800 + b"}]}",
    "binary_data_size_array": request_body([dict(inp("A", "INT32", [1], [1]), parameters={"binary_data_size": [4]})]),
    "not_json": b'{"inputs": [{"name": "A", "datatype": "FP32", "shape": [2], "data": [1, 2}]}',
    "bad_field": b'{"inputs": [{"name": 5, "datatype": "FP32", "shape": [1], "data": [1]}]}',
}


def parse(body: bytes, header_length, decoded):
    try:
        request, binary_default, choice = codec.parse_infer_request(body, header_length, "m", "1", None, decoded)
    except KernelError as exc:
        return ("error", exc.message)
    tensors = [(t.name, t.datatype, list(t.shape), t.as_numpy().dtype.str, t.as_numpy().tolist())
               for t in request.inputs]
    return tensors, request.id, request.parameters, binary_default, choice


@pytest.mark.parametrize("case", sorted(REQUESTS))
def test_requests_in_pieces_are_read_as_in_one_go(case):
    body, header_length = REQUESTS[case], None
    if body is None:
        header = request_body([inp("A", "INT32", [30], list(range(30))),
                               {"name": "B", "datatype": "UINT8", "shape": [4], "parameters": {"binary_data_size": 4}}])
        body, header_length = header + b"\x01\x02\x03\x04", len(header)
    want = parse(body, header_length, None)
    got = parse(body, header_length, large_json.decode_request(body, header_length))
    assert got == want


NASTY = ["\\", '"', "[", "]", "{", "}", ",", ":", " ", "a", "\u00e9", "\\\\", '\\"']


def reference_count(text: bytes, chars: bytes) -> list:
    """Bytes outside strings, one at a time (the obvious way, for comparing)."""
    counts, inside, escaped = [0] * len(chars), False, False
    for c in text:
        if inside:
            escaped, inside = (False, inside) if escaped else (c == 0x5C, c != 0x22)
        elif c == 0x22:
            inside = True
        elif c in chars:
            counts[chars.index(c)] += 1
    return counts


@pytest.mark.parametrize("seed", range(40))
def test_strings_with_any_characters_are_read_in_pieces_as_in_one_go(seed):
    """Random strings of quotes, backslashes, brackets and commas, nested at random: the pieces
    (cut at commas outside strings, 13 bytes or more each) give the one-go request and error."""
    rng = np.random.default_rng(seed)
    words = ["".join(rng.choice(NASTY, size=rng.integers(0, 6))) for _ in range(rng.integers(1, 30))]
    data = [[w] if rng.random() < 0.3 else w for w in words]
    if rng.random() < 0.3:
        data.insert(int(rng.integers(0, len(data))), [])
    body = request_body([inp("S", "BYTES", [len(words)], data)],
                        {"parameters": {"k": "".join(rng.choice(NASTY, size=8))}})
    want = parse(body, None, None)
    assert want[0] != "error"
    assert parse(body, None, large_json.decode_request(body, None)) == want
    for window in (1, 3, 13, 1 << 20):
        assert json_scan.count_outside(body, b"{:,[", window) == reference_count(body, b"{:,[")


def test_objects_are_counted_outside_strings_before_anything_is_decoded(monkeypatch):
    """'{' and ':' in strings do not count; past the limit outside them, the request is refused
    naming it, before msgspec builds anything."""
    monkeypatch.setattr(large_json, "MAX_JSON_OBJECTS", 12)  # 11 members and 7 objects below
    texts = ['{"a": {"b": 1}}'] * 20
    body = request_body([inp("S", "BYTES", [20], texts)], {"outputs": [{"name": "X"}] * 5})
    assert parse(body, None, large_json.decode_request(body, None)) == parse(body, None, None)
    body = request_body([inp("S", "BYTES", [1], ["x"])], {"outputs": [{"name": "X"}] * 11})
    got = parse(body, None, large_json.decode_request(body, None))
    assert got[0] == "error" and "more than 12 objects or object members" in got[1]
    assert "at most 4096 inputs and 4096 outputs" in got[1]


@pytest.mark.parametrize("seed", range(30))
def test_any_data_text_is_refused_or_read_as_in_one_go(seed):
    """Random data text (valid or not) of brackets, commas, numbers, strings and blanks: cut out
    of the header and read in pieces, it is refused exactly when msgspec refuses it whole, and
    read the same when not (the checks that dropping brackets would otherwise hide)."""
    rng = np.random.default_rng(1000 + seed)
    tokens = ["[", "]", ",", "1", "2.5", '"a,]"', " ", "[]", "[1]", ",", "1,"]
    for _ in range(40):
        data = "[" + "".join(rng.choice(tokens, size=rng.integers(0, 14))) + "]"
        datatype = "BYTES" if '"' in data else "FP32"
        body = (b'{"inputs": [{"name": "A", "datatype": "%s", "shape": [3], "data": %s}]}'
                % (datatype.encode(), data.encode()))
        want = parse(body, None, None)
        got = parse(body, None, large_json.decode_request(body, None))
        assert got == want, data
