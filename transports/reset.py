"""Dropping a client that stopped reading: a TCP reset, not a close.

`transport.abort()` discards what asyncio still buffers, but the kernel then closes the socket
gracefully: whatever already sits in its send buffer (up to several MiB per connection) stays
there, orphaned, as long as the peer keeps acknowledging zero-window probes, which a client that
never reads does forever. The peer also sees nothing: no FIN can pass the unsent data. With
SO_LINGER on and a zero timeout the close sends RST at once, frees the send buffer and tells
the client its answer was cut. Used where the held-output account (kernel.core.holding) or the
exit timeout gives up on a client; never for ordinary closes, which must let answers drain.
"""

from __future__ import annotations

import socket
import struct

_LINGER_ZERO = struct.pack("ii", 1, 0)


def reset(transport) -> None:
    """Abort `transport` with a TCP reset (where it has a TCP socket; a plain abort otherwise)."""
    if transport is None:
        return
    sock = transport.get_extra_info("socket")
    if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _LINGER_ZERO)
        except OSError:  # already closed under us: abort() below is all there is to do
            pass
    transport.abort()
