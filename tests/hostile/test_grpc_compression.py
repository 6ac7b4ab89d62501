"""A gzip bomb in a gRPC request (issue 14 item 4), against each of the three gRPC servers.

A ModelInfer message of ~200 KB gzip inflated to hundreds of MB (+409 MB of server memory;
the grpcio binding set its receive limit to -1). Every server now refuses it: Kernel's own
server and grpcio with RESOURCE_EXHAUSTED once the inflated size passes the limit (64 MiB
by default), grpclib because it implements no compression at all. The request is written
with the `h2` package, which keeps to the flow-control windows each server grants.
"""

from __future__ import annotations

import socket
import struct
import time
import zlib

import h2.config
import h2.connection
import h2.events
import pytest

from conftest import EXAMPLES, KernelProcess, running
from test_http2_limits import INFER, assert_infer_works, rss_mb

BOMB_MB = 300


@pytest.fixture(scope="module")
def bomb() -> bytes:
    """BOMB_MB of zeros, gzip-compressed (about 300 KB), as one compressed gRPC message."""
    deflater = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    zeros = bytes(1 << 20)
    body = b"".join(deflater.compress(zeros) for _ in range(BOMB_MB)) + deflater.flush()
    return b"\x01" + struct.pack(">L", len(body)) + body


@pytest.fixture(scope="module", params=["native", "grpcio", "grpclib"])
def server(request):
    yield from running(KernelProcess([EXAMPLES], "--grpc-server", request.param))


def h2_call(port: int, path: str, message: bytes, extra=(), timeout: float = 30.0) -> tuple[int, str]:
    """One gRPC call written with h2 within the server's windows: (grpc-status, grpc-message)."""
    conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True, header_encoding="utf-8"))
    sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    try:
        conn.initiate_connection()
        sid = conn.get_next_available_stream_id()
        conn.send_headers(sid, [(":method", "POST"), (":scheme", "http"), (":path", path),
                                (":authority", "localhost"), ("content-type", "application/grpc"),
                                ("te", "trailers"), *extra])
        sock.sendall(conn.data_to_send())
        pos, fields = 0, {}
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if pos < len(message):
                room = min(conn.local_flow_control_window(sid), conn.max_outbound_frame_size, len(message) - pos)
                if room > 0:
                    conn.send_data(sid, message[pos:pos + room], end_stream=pos + room == len(message))
                    pos += room
                    sock.sendall(conn.data_to_send())
                    continue
            data = sock.recv(1 << 16)
            if not data:
                break
            for event in conn.receive_data(data):
                if isinstance(event, (h2.events.ResponseReceived, h2.events.TrailersReceived)):
                    fields.update(dict(event.headers))
                if isinstance(event, (h2.events.StreamEnded, h2.events.StreamReset)) and "grpc-status" in fields:
                    return int(fields["grpc-status"]), fields.get("grpc-message", "")
            sock.sendall(conn.data_to_send())
            if "grpc-status" in fields and pos >= len(message):
                return int(fields["grpc-status"]), fields.get("grpc-message", "")
        raise AssertionError(f"no grpc-status (got {fields})")
    finally:
        sock.close()


def test_gzip_bomb_is_refused_with_bounded_memory(server, bomb):
    port = server.grpc_port
    before = rss_mb(server.proc.pid)
    code, message = h2_call(port, INFER, bomb, extra=[("grpc-encoding", "gzip")])
    if "grpclib" in server.proc.args:
        assert code != 0  # grpclib has no decompression: refused, nothing inflated
    else:
        assert code == 8, (code, message)  # RESOURCE_EXHAUSTED
    grown = rss_mb(server.proc.pid) - before
    assert grown < 120, f"server RSS grew {grown:.0f} MB"
    assert_infer_works(server.grpc_url)
