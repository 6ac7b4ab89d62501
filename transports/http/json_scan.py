"""JSON text read without decoding it: which bytes lie inside strings, in windows, with numpy.

Why: a large KServe request is decoded beside the event loop (large_json), and msgspec holds the
interpreter lock for the whole of each call, so one call over millions of values freezes the
front (issue 31: 24 MiB of `[],[],...` in a parameter froze it 1.9 s, 600 000 inputs 1.0 s). What
a body holds must be known, and its work cut into pieces, before anything is decoded. A comma,
bracket or colon means something only outside strings, and strings may hold any of them, so the
quotes that open and close strings are found first (a quote after an odd run of backslashes is
escaped): each window of WINDOW_BYTES is a handful of numpy calls, and `Strings` carries what one
window leaves open (a string, a run of backslashes) into the next, so every byte is read once.
"""

from __future__ import annotations

import msgspec
import numpy as np

WINDOW_BYTES = 1 << 20
_QUOTE, _BACKSLASH = 0x22, 0x5C


class Strings:
    """Where strings are, window after window of one text (each window follows the last)."""

    __slots__ = ("inside", "run")

    def __init__(self) -> None:
        self.inside = False  # the window starts inside a string
        self.run = 0  # backslashes that end the previous window

    def quotes(self, w: np.ndarray) -> np.ndarray:
        """The positions in `w` of the quotes that open or close a string; moves past `w`."""
        quotes = np.flatnonzero(w == _QUOTE)
        if quotes.size:
            after_backslash = w[quotes - 1] == _BACKSLASH
            if quotes[0] == 0:
                after_backslash[0] = self.run > 0
            if after_backslash.any():
                quotes = quotes[~_escaped(w, quotes, after_backslash, self.run)]
        self.inside ^= bool(quotes.size & 1)
        tail = w.size - 1 - _last_not_backslash(w)
        self.run = tail + self.run if tail == w.size else tail
        return quotes

    def outside(self, positions: np.ndarray, quotes: np.ndarray, inside: bool) -> np.ndarray:
        """Which `positions` (of bytes that are not quotes) lie outside strings, for a window that
        starts `inside` one or not and has these `quotes`."""
        return (np.searchsorted(quotes, positions) & 1) == inside


def _escaped(w: np.ndarray, quotes: np.ndarray, after_backslash: np.ndarray, run: int) -> np.ndarray:
    """Which `quotes` follow an odd run of backslashes (`run` of them end the window before)."""
    candidates = quotes[after_backslash]
    plain = np.flatnonzero(w != _BACKSLASH)
    before = np.searchsorted(plain, candidates) - 1  # the last byte that is not a backslash
    last = np.where(before >= 0, plain[np.maximum(before, 0)] if plain.size else -1, -1)
    runs = candidates - 1 - last + np.where(last < 0, run, 0)
    escaped = np.zeros(quotes.size, dtype=bool)
    escaped[np.flatnonzero(after_backslash)] = (runs & 1) == 1
    return escaped


def _last_not_backslash(w: np.ndarray) -> int:
    if w.size == 0 or w[-1] != _BACKSLASH:
        return w.size - 1
    plain = np.flatnonzero(w != _BACKSLASH)
    return int(plain[-1]) if plain.size else -1


def count_outside(text, chars: bytes, window: int = 0) -> list[int]:
    """How many of each byte in `chars` lie outside strings in `text` (window by window)."""
    window = window or WINDOW_BYTES
    a = np.frombuffer(text, dtype=np.uint8)
    strings = Strings()
    counts = [0] * len(chars)
    for start in range(0, a.size, window):
        w = a[start:start + window]
        inside = strings.inside
        quotes = strings.quotes(w)
        for i, c in enumerate(chars):
            found = np.flatnonzero(w == c)
            if found.size:
                counts[i] += int(np.count_nonzero(strings.outside(found, quotes, inside)))
    return counts


def last_outside(w: np.ndarray, c: int, strings: Strings) -> int:
    """The position in window `w` of its last byte `c` outside strings (-1: none); moves past `w`."""
    inside = strings.inside
    quotes = strings.quotes(w)
    found = np.flatnonzero(w == c)
    if found.size == 0:
        return -1
    out = found[strings.outside(found, quotes, inside)]
    return int(out[-1]) if out.size else -1


def outside_mask(a: np.ndarray) -> np.ndarray:
    """Per byte of `a` (which starts outside any string): True where it lies outside strings and
    is not a quote."""
    quotes = Strings().quotes(a)
    opened = np.zeros(a.size + 1, dtype=np.int32)
    opened[quotes + 1] = 1
    depth = np.cumsum(opened[:-1], dtype=np.int32)  # quotes before each byte
    mask = (depth & 1) == 0
    mask[quotes] = False
    return mask


# ---- the arrays a decoder need not see ------------------------------------------------

# Containers nested deeper than this are refused before anything is decoded, as msgspec refuses
# them (its limit is the interpreter's recursion limit, 1000, less the stack it is called from).
MAX_DEPTH = 900
# Windows of the structure scan: a handful of numpy calls each, a few milliseconds at most.
SCAN_WINDOW_BYTES = 256 * 1024
_KEY_BYTES = 256  # a key longer than this is none of the kept ones


class TooDeep(Exception):
    """Containers nested deeper than MAX_DEPTH."""


def arrays_to_cut(text, kept: frozenset, window: int = 0) -> list[tuple[int, int]]:
    """(start, end) of the arrays that can be cut out of a JSON object `text` before it is
    decoded, in order, `end` the index of the closing bracket: each member array of the root
    whose key is not in `kept`, and every outermost array below the root's members, but for the
    elements of a kept member array (a decoder refuses the first that is an array, at once). All
    of `text` when the root is an array. TooDeep when containers nest deeper than MAX_DEPTH.

    Why: what is left (the objects and the scalars around the arrays) is what a decoder builds
    objects of; the arrays (a tensor's data, a shape, a parameter's value) are read afterwards,
    each on its own and in pieces. Each one cut is an object member's value, so there are no more
    of them than members."""
    window = window or SCAN_WINDOW_BYTES
    a = np.frombuffer(text, dtype=np.uint8)
    first = np.flatnonzero(~_BLANK[a[:_KEY_BYTES]])
    if first.size and a[first[0]] == ord("["):
        return [(int(first[0]), a.size - 1)]
    strings = Strings()
    depth = 0  # containers open
    nesting = 0  # arrays open below the root's members (only the outermost one starts a span)
    member_cut: list = []  # for each member array of the root open: whether it is cut
    member_array = False  # whether the root's member open is an array
    start = None  # the outermost array being cut, opened in an earlier window
    spans: list = []
    for base in range(0, a.size, window):
        w = a[base:base + window]
        inside = strings.inside
        quotes = strings.quotes(w)
        folded = w & 0xDF  # '[' and '{' alike, ']' and '}' alike
        pos = np.flatnonzero((folded == 0x5B) | (folded == 0x5D))
        if pos.size:
            pos = pos[strings.outside(pos, quotes, inside)]
        if pos.size == 0:
            continue
        b = w[pos]
        opening = (b & 0xDF) == 0x5B
        after = depth + np.cumsum(np.where(opening, 1, -1))
        if after.max() > MAX_DEPTH:
            raise TooDeep()
        if after.min() < 0:
            break  # closes more than it opened: not JSON, which the decoder says
        depth = int(after[-1])
        level = after - opening  # containers around the bracket's own
        array = (b & 0x20) == 0
        nested = array & (level >= 2)
        members = np.flatnonzero(level == 1)
        for j in members[array[members]].tolist():  # the root's member arrays: cut unless kept
            if opening[j]:
                member_cut.append(key_before(text, base + int(pos[j])) not in kept)
                nested[j] = member_cut[-1]
            else:
                nested[j] = member_cut.pop() if member_cut else True
        # an element of a member array that is an array itself is left to the decoder, with all it holds
        opened = members[opening[members]]
        around = np.searchsorted(opened, np.arange(pos.size)) - 1
        in_array = np.where(around >= 0, array[opened][np.maximum(around, 0)], member_array) if opened.size \
            else np.full(pos.size, member_array)
        if opened.size:
            member_array = bool(array[opened[-1]])
        left = nested & (level == 2) & in_array
        open_after = nesting + np.cumsum(np.where(nested, np.where(opening, 1, -1), 0))
        nesting = int(open_after[-1])
        starts = (base + pos[nested & ~left & opening & (open_after == 1)]).tolist()
        ends = (base + pos[nested & ~left & ~opening & (open_after == 0)]).tolist()
        if start is not None and ends:
            spans.append((start, ends.pop(0)))
            start = None
        spans += zip(starts, ends)
        if len(starts) > len(ends):
            start = starts[-1]
    return spans


_BLANK = np.zeros(256, dtype=bool)
_BLANK[list(b" \t\r\n")] = True


def key_before(text, pos: int):
    """The key of the object member whose value starts at `pos` (None if it is not a member's
    value, or its key is longer than _KEY_BYTES)."""
    whole = pos <= _KEY_BYTES  # the key's text starts within what is read here
    before = bytes(text[max(0, pos - _KEY_BYTES):pos]).rstrip(b" \t\r\n")
    if not before.endswith(b":"):
        return None
    before = before[:-1].rstrip(b" \t\r\n")
    if not before.endswith(b'"'):
        return None
    i = len(before) - 1
    while True:  # back to the quote that opens the key: the first one not escaped
        i = before.rfind(b'"', 0, i)
        if i < 0:
            return None
        run = i - len(before[:i].rstrip(b"\\"))
        if run == i and not whole:
            return None  # backslashes back to where the reading starts: their number is unknown
        if run % 2 == 0:
            break
    if before[:i].rstrip(b" \t\r\n")[-1:] not in (b"{", b","):
        return None
    try:
        return _KEY.decode(before[i:])
    except (msgspec.DecodeError, UnicodeDecodeError):
        return None


_KEY = msgspec.json.Decoder(str)
