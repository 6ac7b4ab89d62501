"""Clients of a generate_stream that read slower than the model sends (or not at all).

A model sends without waiting for its client, so a stream's responses wait in the front until the
client takes them: 256 responses of 1 MiB to a client that never read kept 251 MiB of the
worker's shared memory, were in no account (--max-held-output-bytes 16 MiB did not refuse the
next request) and stayed until the stall timeout of the connection, however many more the model
sent. Now a stream is a holder in the held-output account, and past 16 MiB waiting for its client
the request is cancelled, later responses are dropped and the stream ends with an error event.
"""

from __future__ import annotations

import json
import socket
import time

import httpx
import pytest

from conftest import TEST_MODELS, KernelProcess, running
from test_slow_readers import held_memory_kb, read_all

MIB = 1 << 20
LIMIT = 64 * MIB
STALL_S = 2


@pytest.fixture(scope="module")
def server():
    yield from running(KernelProcess([TEST_MODELS / "openai_bounds"], f"--max-held-output-bytes={LIMIT}",
                                     f"--client-stall-timeout-secs={STALL_S}"))


def stream_request(count: int, size: int) -> bytes:
    """generate_stream of blob_lm: `count` responses of `size` letters, sent as fast as the model can."""
    body = json.dumps({"text_input": f"{count} {size}"}).encode()
    return (b"POST /v2/models/blob_lm/generate_stream HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n" % len(body)) + body


def reader(server) -> socket.socket:
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 16 * 1024)
    s.connect(("127.0.0.1", server.http_port))
    return s


def small_generate(server) -> httpx.Response:
    return httpx.post(f"http://{server.url}/v2/models/blob_lm/generate", json={"text_input": "x"}, timeout=30)


def test_a_stream_nobody_reads_is_bounded_and_cut(server):
    assert small_generate(server).status_code == 200  # the worker and its arena are up
    before = held_memory_kb(server.proc.pid)
    peak = before
    s = reader(server)
    s.sendall(stream_request(256, MIB))  # 256 MiB of responses
    start = time.monotonic()
    while time.monotonic() < start + STALL_S + 2:  # reads nothing past the stall timeout
        peak = max(peak, held_memory_kb(server.proc.pid))
        time.sleep(0.05)
    assert small_generate(server).status_code == 200  # everyone else is served meanwhile
    got, closed = read_all(s, time.monotonic() + 15)
    s.close()
    assert closed, f"a stream nobody read was not cut ({len(got)} bytes sent to it)"
    assert len(got) < 4 * MIB and b"too slowly" not in got  # cut (reset): it never got the rest
    grew_mib = (peak - before) / 1024
    # 16 MiB may wait for the client, plus the arena's growth step and the connection's buffers;
    # unbounded, this one stream pinned ~251 MiB.
    assert grew_mib < 160, f"memory grew by {grew_mib:.0f} MiB for one stream nobody read"
    assert server.wait_for_log("cutting a client", timeout=10)
    assert small_generate(server).status_code == 200


def test_a_stream_read_too_slowly_ends_with_an_error_event(server):
    s = reader(server)
    s.sendall(stream_request(128, MIB))
    time.sleep(0.5)  # the model sends all 128 MiB meanwhile; the client has read nothing
    got, closed = read_all(s, time.monotonic() + 30)
    s.close()
    assert closed and got.startswith(b"HTTP/1.1 200")
    events = [e for e in got.split(b"\n\n") if b"data: " in e]
    assert 1 < len(events) < 64, f"{len(events)} events for a client 128 MiB behind"
    last = json.loads(events[-1][events[-1].index(b"data: ") + 6:])
    assert "read the stream too slowly" in last["error"] and "16777216 bytes" in last["error"]
    assert small_generate(server).status_code == 200
