"""BYTES tensors in wire form (a 4-byte little-endian length before each element): what
kernel.core.datatypes makes of well-formed and malformed buffers, whichever way it reads them
(small elements sliced out of one copy, large ones copied straight out), and check_bytes agreeing."""

from __future__ import annotations

import struct

import numpy as np
import pytest

from kernel.core import datatypes

RNG = np.random.default_rng(11)


def wire(elements) -> bytes:
    return b"".join(struct.pack("<I", len(e)) + e for e in elements)


SMALL = [bytes(RNG.integers(0, 256, int(n), dtype=np.uint8)) for n in RNG.integers(0, 40, 5000)]
LARGE = [b"a" * 5000, b"", b"b" * 70_000]  # average past the slice-copy limit


@pytest.mark.parametrize("elements", [SMALL, LARGE, [b""] * 1000, [b"x"]], ids=["small", "large", "empty", "one"])
@pytest.mark.parametrize("form", [bytes, bytearray, memoryview, lambda b: np.frombuffer(b, np.uint8)],
                         ids=["bytes", "bytearray", "memoryview", "numpy"])
def test_every_element_comes_back_as_bytes(elements, form):
    data = form(wire(elements))
    got = datatypes.deserialize_bytes(data, len(elements))
    assert got == elements and all(type(e) is bytes for e in got)
    assert datatypes.deserialize_bytes(data) == elements  # count not given
    datatypes.check_bytes(data, len(elements))


def test_an_element_does_not_share_memory_with_the_buffer():
    buf = bytearray(wire(SMALL))
    got = datatypes.deserialize_bytes(buf, len(SMALL))
    buf[4:] = b"\0" * (len(buf) - 4)
    assert got == SMALL


BAD = {
    "length cut short": (wire(SMALL)[:-1], None),
    "three bytes of a length": (wire([b"ab"]) + b"\x01\x00\x00", "truncated BYTES element length"),
    "element past the end": (wire([b"ab"]) + struct.pack("<I", 10) + b"abc", "BYTES element runs past the end of its buffer"),
    "huge length": (struct.pack("<I", 2**32 - 1) + b"abc", "BYTES element runs past the end of its buffer"),
}


@pytest.mark.parametrize("case", list(BAD))
@pytest.mark.parametrize("count", ["given", "none"])
def test_malformed_framing_is_refused_in_the_same_words_both_ways(case, count):
    """With the count given, small elements are sliced out of a copy; without it, each is copied
    out of the buffer: the same refusal either way, and check_bytes's."""
    data, words = BAD[case]
    n = {"given": 5000 if case == "length cut short" else 2, "none": None}[count]
    with pytest.raises(ValueError) as got:
        datatypes.deserialize_bytes(data, n)
    if words is not None:
        assert str(got.value) == words
    with pytest.raises(ValueError) as checked:
        datatypes.check_bytes(data, n or 1)
    if words is not None:
        assert str(checked.value) == words


def test_a_wrong_count_is_refused():
    with pytest.raises(ValueError, match="expected 3 BYTES elements, found 2"):
        datatypes.deserialize_bytes(wire([b"a", b"b"]), 3)


@pytest.mark.parametrize("array, elements", [
    (np.array(SMALL, dtype=object), SMALL),
    (np.array(["é" * 3, "", "abc"], dtype=object), ["é".encode() * 3, b"", b"abc"]),
    (np.array([b"ab", "cd", 3, 1.5, bytearray(b"x"), None], dtype=object), [b"ab", b"cd", b"3", b"1.5", b"x", b"None"]),
    (np.array([b"a\0", b"bcd"], dtype="S4"), [b"a", b"bcd"]),  # numpy drops a fixed-width element's trailing NULs
    (np.array(["x", "yz"]), [b"x", b"yz"]),
    (np.array(b"zero-d", dtype=object), [b"zero-d"]),
    (np.array([[b"a", b"b"], [b"c", b""]], dtype=object), [b"a", b"b", b"c", b""]),  # row-major
    (np.array([], dtype=object), []),
], ids=["bytes", "str", "mixed", "fixed-bytes", "unicode", "zero-d", "2-d", "empty"])
def test_serialize_gives_each_element_after_its_length(array, elements):
    assert datatypes.serialize_bytes(array) == wire(elements)
