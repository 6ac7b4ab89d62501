"""Where a malformed JSON body goes wrong, in the words and offsets tritonserver reports.

tritonserver parses request bodies with RapidJSON and answers a malformed one with
`failed to parse the request JSON buffer: <RapidJSON's message> at <byte offset>`
(HTTP 500). Kernel parses with msgspec, whose messages and offsets differ, and
clients and scripts match on Triton's text. `describe(body)` re-reads a body that
msgspec already refused and says what RapidJSON would say: the same grammar walk,
stopping at the first byte RapidJSON stops at. It runs only on the error path.
"""

from __future__ import annotations

from typing import Optional

_WS = b" \t\n\r"
_MAX_DEPTH = 512  # deeper than this: no verdict here (the caller keeps msgspec's message)
# The walk is plain Python on the event loop: bodies larger than this get no verdict (the caller
# keeps msgspec's message) so that a large malformed body cannot hold the loop for seconds.
MAX_BYTES = 8 * 1024  # about 15 ms of walking at worst


class _Stop(Exception):
    def __init__(self, message: str, offset: int):
        self.message = message
        self.offset = offset


def describe(body: bytes) -> Optional[str]:
    """'<message> at <offset>' as RapidJSON reports the first error in `body`; None if none is found
    (or `body` is larger than MAX_BYTES, or nested deeper than _MAX_DEPTH)."""
    if len(body) > MAX_BYTES:
        return None
    try:
        _Reader(bytes(body)).document()
    except _Stop as stop:
        return f"{stop.message} at {stop.offset}"
    except RecursionError:
        return None
    return None


class _Reader:
    def __init__(self, data: bytes):
        self.data = data
        self.pos = 0

    def peek(self) -> int:
        return self.data[self.pos] if self.pos < len(self.data) else 0

    def skip_ws(self) -> None:
        while self.pos < len(self.data) and self.data[self.pos] in _WS:
            self.pos += 1

    def document(self) -> None:
        self.skip_ws()
        if self.pos >= len(self.data):
            raise _Stop("The document is empty.", self.pos)
        self.value(0)
        self.skip_ws()
        if self.pos < len(self.data):
            raise _Stop("The document root must not be followed by other values.", self.pos)

    def value(self, depth: int) -> None:
        if depth > _MAX_DEPTH:
            raise RecursionError
        c = self.peek()
        if c == ord("{"):
            self.obj(depth)
        elif c == ord("["):
            self.array(depth)
        elif c == ord('"'):
            self.string()
        elif c in b"ntf":
            self.literal({ord("n"): b"null", ord("t"): b"true", ord("f"): b"false"}[c])
        else:
            self.number()

    def literal(self, word: bytes) -> None:
        self.pos += 1
        for expected in word[1:]:
            if self.peek() != expected:
                raise _Stop("Invalid value.", self.pos)
            self.pos += 1

    def obj(self, depth: int) -> None:
        self.pos += 1
        self.skip_ws()
        if self.peek() == ord("}"):
            self.pos += 1
            return
        while True:
            if self.peek() != ord('"'):
                raise _Stop("Missing a name for object member.", self.pos)
            self.string()
            self.skip_ws()
            if self.peek() != ord(":"):
                raise _Stop("Missing a colon after a name of object member.", self.pos)
            self.pos += 1
            self.skip_ws()
            self.value(depth + 1)
            self.skip_ws()
            c = self.peek()
            if c == ord(","):
                self.pos += 1
                self.skip_ws()
            elif c == ord("}"):
                self.pos += 1
                return
            else:
                raise _Stop("Missing a comma or '}' after an object member.", self.pos)

    def array(self, depth: int) -> None:
        self.pos += 1
        self.skip_ws()
        if self.peek() == ord("]"):
            self.pos += 1
            return
        while True:
            self.value(depth + 1)
            self.skip_ws()
            c = self.peek()
            if c == ord(","):
                self.pos += 1
                self.skip_ws()
            elif c == ord("]"):
                self.pos += 1
                return
            else:
                raise _Stop("Missing a comma or ']' after an array element.", self.pos)

    def string(self) -> None:
        self.pos += 1
        data = self.data
        while True:
            if self.pos >= len(data):
                raise _Stop("Missing a closing quotation mark in string.", self.pos)
            c = data[self.pos]
            if c == ord('"'):
                self.pos += 1
                return
            if c == ord("\\"):
                escape_at = self.pos
                self.pos += 1
                e = self.peek()
                if e == ord("u"):
                    self.pos += 1
                    for _ in range(4):
                        if chr(self.peek()) not in "0123456789abcdefABCDEF" or self.pos >= len(data):
                            raise _Stop("Incorrect hex digit after \\u escape in string.", escape_at)
                        self.pos += 1
                elif e and e in b'"\\/bfnrt':
                    self.pos += 1
                else:
                    raise _Stop("Invalid escape character in string.", escape_at)
            elif c < 0x20:
                # RapidJSON's words for a raw control character in a string.
                raise _Stop("Invalid escape character in string.", self.pos)
            else:
                self.pos += 1

    def number(self) -> None:
        start = self.pos
        if self.peek() == ord("-"):
            self.pos += 1
        c = self.peek()
        if c == ord("0"):
            self.pos += 1
        elif ord("1") <= c <= ord("9"):
            while ord("0") <= self.peek() <= ord("9"):
                self.pos += 1
        else:
            raise _Stop("Invalid value.", self.pos if self.pos > start else start)
        if self.peek() == ord("."):
            self.pos += 1
            if not ord("0") <= self.peek() <= ord("9"):
                raise _Stop("Miss fraction part in number.", self.pos)
            while ord("0") <= self.peek() <= ord("9"):
                self.pos += 1
        if self.peek() in (ord("e"), ord("E")):
            self.pos += 1
            if self.peek() in (ord("+"), ord("-")):
                self.pos += 1
            if not ord("0") <= self.peek() <= ord("9"):
                raise _Stop("Miss exponent in number.", self.pos)
            while ord("0") <= self.peek() <= ord("9"):
                self.pos += 1
