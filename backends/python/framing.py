"""Length-prefixed msgpack framing over a stream socket, as an asyncio Protocol.

A Protocol (not streams) because it is the cheapest way to move bytes on
uvloop: one callback per read, no await per message.
"""

from __future__ import annotations

import asyncio
from typing import Callable, Optional

import msgspec

_HEADER = 4


def frame(message) -> bytes:
    """One message as it goes on the wire (for a write before a channel exists: worker_links.py)."""
    payload = msgspec.msgpack.encode(message)
    return len(payload).to_bytes(_HEADER, "little") + payload


class MessageChannel(asyncio.Protocol):
    """Decodes framed messages into `on_message`, encodes with `send`."""

    def __init__(self, decode_type, on_message: Callable, on_lost: Callable[[Exception | None], None],
                 on_undecodable: Optional[Callable[[bytes, Exception], None]] = None):
        """on_undecodable(frame, error): a whole frame that does not decode as `decode_type`; without
        it the error propagates (the connection is broken: the peer speaks another protocol)."""
        self._decoder = msgspec.msgpack.Decoder(decode_type)
        self._on_undecodable = on_undecodable
        self._encoder = msgspec.msgpack.Encoder()
        self._on_message = on_message
        self._on_lost = on_lost
        self._buffer = bytearray()
        self.transport: asyncio.Transport | None = None
        self.closed = False

    # asyncio.Protocol

    def connection_made(self, transport) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        for msg in self._decode(data):
            self._on_message(msg)

    def _decode(self, data: bytes) -> list:
        """Append data to the buffer and return the whole messages it now holds."""
        buf = self._buffer
        buf += data
        pos, end = 0, len(buf)
        messages = []
        with memoryview(buf) as view:  # released before the buffer is resized
            while end - pos >= _HEADER:
                size = int.from_bytes(view[pos : pos + _HEADER], "little")
                if end - pos - _HEADER < size:
                    break
                start = pos + _HEADER
                try:
                    messages.append(self._decoder.decode(view[start : start + size]))
                except (msgspec.DecodeError, msgspec.ValidationError) as exc:
                    if self._on_undecodable is None:
                        raise
                    self._on_undecodable(bytes(view[start : start + size]), exc)
                pos = start + size
        if pos:
            del buf[:pos]
        return messages

    def connection_lost(self, exc) -> None:
        self.closed = True
        self._on_lost(exc)

    # sending

    def send(self, message) -> None:
        if self.closed or self.transport is None:
            raise ConnectionError("channel is closed")
        payload = self._encoder.encode(message)
        self.transport.write(len(payload).to_bytes(_HEADER, "little") + payload)
