"""RapidJSON's words and offsets for malformed bodies, as tritonserver 2.51 answered each of these
(measured: POST /v2/models/add_sub/infer with the body: Triton answered 500 and
`failed to parse the request JSON buffer: <this>`; Kernel answers the same words with 400, a client mistake)."""

from __future__ import annotations

import pytest

from kernel.transports.http.json_errors import MAX_BYTES, describe

MEASURED = [
    (b"not json", "Invalid value. at 1"),
    (b"xyz", "Invalid value. at 0"),
    (b"{bad", "Missing a name for object member. at 1"),
    (b"   ", "The document is empty. at 3"),
    (b'{"inputs": [ {"name": ', "Invalid value. at 22"),
    (b'{"a":1,}', "Missing a name for object member. at 7"),
    (b"[1,2", "Missing a comma or ']' after an array element. at 4"),
    (b'{"a" 1}', "Missing a colon after a name of object member. at 5"),
    (b'{"a":1 "b":2}', "Missing a comma or '}' after an object member. at 7"),
    (b'"abc', "Missing a closing quotation mark in string. at 4"),
    (b'"a\\qb"', "Invalid escape character in string. at 2"),
    (b'"\\u12g4"', "Incorrect hex digit after \\u escape in string. at 1"),
    (b"-x", "Invalid value. at 1"),
    (b"1.", "Miss fraction part in number. at 2"),
    (b"1e", "Miss exponent in number. at 2"),
    (b"{} x", "The document root must not be followed by other values. at 3"),
    (b"tru", "Invalid value. at 3"),
    (b"[1 2]", "Missing a comma or ']' after an array element. at 3"),
    (b'{"a":"\x01"}', "Invalid escape character in string. at 6"),
    (b'{"a":01}', "Missing a comma or '}' after an object member. at 6"),
    (b"\xff", "Invalid value. at 0"),
    (b'{"a":[}', "Invalid value. at 6"),
    (b"nul", "Invalid value. at 3"),
]


@pytest.mark.parametrize("body, words", MEASURED, ids=[repr(b)[2:-1] for b, _ in MEASURED])
def test_words_and_offsets_match_tritonserver(body, words):
    assert describe(body) == words


def test_no_verdict_for_valid_json_deep_nesting_or_large_bodies():
    assert describe(b'{"inputs": [1, 2.5e3, "x", true, null]}') is None
    assert describe(b"[" * 5000) is None  # deeper than the walk goes: the caller keeps msgspec's words
    assert describe(b"x" * (MAX_BYTES + 1)) is None  # too large to walk on the event loop
