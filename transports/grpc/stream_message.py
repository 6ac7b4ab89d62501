"""A ModelStreamInfer response message too large to join on the event loop.

Why: a stream response's serialized fields come with the outputs' bytes as the backend handed
them over, and joining them copies it all on the loop with the interpreter lock held (bytes.join of
memoryviews): ~22 ms per 32 MiB response, and a decoupled model's four quick sends froze the front
~90 ms. Over JOIN_BYTES the message stays in its pieces: the native server frames them where they
lie, as it does a unary answer's; the compressed path deflates them; the grpcio and grpclib bindings,
which take one bytes object per message, join them. The outputs' bytes are fixed from the moment the
model hands them over (backends/python/handover.py), so sending them later sends the same answer.
"""

from __future__ import annotations

# A stream response larger than this is kept in its pieces; a smaller one is joined (cheap).
JOIN_BYTES = 1 << 20


class StreamMessage:
    """A serialized ModelStreamInferResponse as its pieces, in order, and their total size."""

    __slots__ = ("parts", "size")

    def __init__(self, parts: list, size: int):
        self.parts = parts
        self.size = size

    def __len__(self) -> int:
        return self.size

    def joined(self) -> bytes:
        return b"".join(self.parts)


def pieces(message) -> list:
    """The pieces of a stream message: a StreamMessage's, or [message] for bytes."""
    return message.parts if type(message) is StreamMessage else [message]
