"""HTTP clients that do not read their answers (issue 23, defect 3, the HTTP/1.1 part).

An answer that does not fit the socket waits in the connection's write buffer, and with it the
arena region it is a view of: 40 readers of a 32 MiB answer that never read kept 1.28 GB. Now
those bytes are counted (--max-held-output-bytes): while the count is over the bound new infer
requests get 503 naming it, a client that makes no progress for --client-stall-timeout-secs is
cut (which frees what it held), and everyone else is served meanwhile. Both HTTP routes are
covered: the fast path and the ASGI app (a Content-Encoding header sends a request there).
"""

from __future__ import annotations

import json
import re
import socket
import time
from pathlib import Path

import httpx
import numpy as np
import pytest

from conftest import KernelProcess, running

MODELS = Path(__file__).resolve().parent / "models"
MIB = 1 << 20
LIMIT = 8 * MIB
STALL_S = 2
ANSWER = 16 * MIB


@pytest.fixture(scope="module")
def server():
    yield from running(KernelProcess([MODELS], f"--max-held-output-bytes={LIMIT}",
                                     f"--client-stall-timeout-secs={STALL_S}"))


def echo_request(n: int, route: str = "fast") -> bytes:
    """echo's UINT8 input U of n bytes as binary data, its UOUT asked for as binary data."""
    header = json.dumps({"inputs": [{"name": "U", "shape": [n], "datatype": "UINT8",
                                     "parameters": {"binary_data_size": n}}],
                         "outputs": [{"name": "UOUT", "parameters": {"binary_data": True}}]}).encode()
    data = (np.arange(n) % 251).astype(np.uint8).tobytes()
    extra = b"Content-Encoding: identity\r\n" if route == "asgi" else b""
    return (b"POST /v2/models/echo/infer HTTP/1.1\r\nHost: x\r\n%sInference-Header-Content-Length: %d\r\n"
            b"Content-Length: %d\r\n\r\n" % (extra, len(header), len(header) + n)) + header + data


def small_infer(server) -> httpx.Response:
    body = {"inputs": [{"name": "IN", "shape": [3], "datatype": "INT32", "data": [1, 2, 3]}]}
    return httpx.post(f"http://{server.url}/v2/models/echo/infer", json=body, timeout=30)


def never_reading(server) -> socket.socket:
    """A connection whose client reads nothing: a small receive buffer, so the answer stays with the server."""
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 16 * 1024)
    s.connect(("127.0.0.1", server.http_port))
    s.settimeout(30)
    return s


def read_all(s: socket.socket, deadline: float) -> tuple[bytes, bool]:
    """Everything the server sends until it closes (True) or the deadline passes (False)."""
    out = bytearray()
    while time.monotonic() < deadline:
        s.settimeout(max(0.1, deadline - time.monotonic()))
        try:
            chunk = s.recv(1 << 20)
        except socket.timeout:
            return bytes(out), False
        except ConnectionResetError:
            return bytes(out), True
        if not chunk:
            return bytes(out), True
        out += chunk
    return bytes(out), False


def _kb(path: str, key: str) -> int:
    with open(path) as f:
        return next(int(line.split()[1]) for line in f if line.startswith(key))


def held_memory_kb(pid: int) -> int:
    """The front's resident memory plus the size of every worker's memfd arena mappings."""
    total = _kb(f"/proc/{pid}/status", "VmRSS:")
    with open(f"/proc/{pid}/task/{pid}/children") as f:
        children = [int(c) for c in f.read().split()]
    for child in children:
        try:
            with open(f"/proc/{child}/maps") as f:
                for line in f:
                    if "memfd:" in line:
                        start, end = (int(x, 16) for x in line.split()[0].split("-"))
                        total += (end - start) // 1024
        except FileNotFoundError:
            pass
    return total


@pytest.mark.parametrize("route", ["fast", "asgi"])
def test_readers_that_never_read_are_cut_and_memory_stays_bounded(server, route):
    assert small_infer(server).status_code == 200  # the worker and its arena are up
    before = held_memory_kb(server.proc.pid)
    peak = before
    clients = []
    start = time.monotonic()
    for _ in range(24):  # unbounded, this pinned 24 x 16 MiB
        s = never_reading(server)
        s.sendall(echo_request(ANSWER, route))
        clients.append(s)
        peak = max(peak, held_memory_kb(server.proc.pid))
    # Everyone else is still served: answered at once (503 while over the bound), and with 200
    # once the stalled readers are cut.
    ok = False
    while time.monotonic() < start + 30:
        r = small_infer(server)
        assert r.status_code in (200, 503), r.text
        peak = max(peak, held_memory_kb(server.proc.pid))
        if r.status_code == 200 and time.monotonic() > start + STALL_S:
            ok = True
            break
        time.sleep(0.1)
    assert ok, "a normal client was not served while readers stalled"
    # Each stalled reader is cut once it made no progress for the stall timeout.
    deadline = time.monotonic() + STALL_S + 15
    for s in clients:
        got, closed = read_all(s, deadline)
        assert closed, f"a reader that never read was not cut ({len(got)} bytes sent to it)"
        assert len(got) < ANSWER or got.startswith(b"HTTP/1.1 503"), "a never-reading client got everything"
        s.close()
    grew_mib = (peak - before) / 1024
    # Bounded, not growing with the number of readers: the 8 MiB bound, plus what memory management
    # keeps around it (the arena grows in 64 MiB steps; the allocator keeps freed request buffers,
    # of which the ASGI route makes a few per body). Measured here: ~100 MiB on the fast path,
    # ~145 MiB on the ASGI route; unbounded, these 24 readers pinned ~785 MiB.
    bound_mib = 256
    assert grew_mib < bound_mib, f"memory grew by {grew_mib:.0f} MiB holding answers for clients that never read"
    assert small_infer(server).status_code == 200


def test_over_the_bound_new_requests_get_503_naming_it(server):
    """A reader that is slow but moving is never cut; while it keeps the count over the bound,
    new infer requests are refused with 503 and the bound in Triton's error shape."""
    s = socket.create_connection(("127.0.0.1", server.http_port))
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * 1024)
    raw = echo_request(ANSWER)
    s.sendall(raw)
    received = bytearray()
    refused = None
    deadline = time.monotonic() + 20
    while refused is None and time.monotonic() < deadline:
        received += s.recv(64 * 1024)  # ~0.6 MB/s: moving, but far slower than the server
        r = small_infer(server)
        if r.status_code == 503:
            refused = r
        else:
            assert r.status_code == 200, r.text
        time.sleep(0.1)
    assert refused is not None, "no request was refused while the held answers were over the bound"
    assert refused.headers["content-type"] == "application/json"
    message = refused.json()["error"]
    assert f"over its limit of {LIMIT} bytes" in message, message
    # The slow reader still gets all of its answer, byte for byte.
    s.settimeout(30)
    head_end = -1
    while head_end < 0:
        received += s.recv(1 << 20)
        head_end = received.find(b"\r\n\r\n")
    header = bytes(received[:head_end])
    assert header.startswith(b"HTTP/1.1 200"), header
    json_length = int(re.search(rb"(?i)\r\ninference-header-content-length: *(\d+)", header).group(1))
    length = int(re.search(rb"(?i)\r\ncontent-length: *(\d+)", header).group(1))
    while len(received) < head_end + 4 + length:
        chunk = s.recv(1 << 20)
        assert chunk, "the slow reader was cut"
        received += chunk
    data = bytes(received[head_end + 4 + json_length:])
    assert data == (np.arange(ANSWER) % 251).astype(np.uint8).tobytes()
    s.close()
    # Once it is delivered, requests are served again.
    deadline = time.monotonic() + 10
    while small_infer(server).status_code != 200:
        assert time.monotonic() < deadline, "requests were still refused after the answer was delivered"
        time.sleep(0.1)


def test_a_cut_reader_gets_a_reset_at_once(server):
    """The cut was an abort() the kernel turned into a graceful close: the bytes already in its send
    buffer (MiBs) stayed, orphaned, while the client acknowledged zero-window probes, and the client
    saw neither the end nor its answer (the soak's readers waited 60 s on a silent socket). A cut is
    now a TCP reset: the kernel frees that buffer and the client learns at its next read."""
    s = never_reading(server)
    s.sendall(echo_request(ANSWER))
    time.sleep(STALL_S + 3)  # the stall timeout runs out while nothing is read
    s.settimeout(5)
    with pytest.raises(ConnectionResetError):
        while s.recv(1 << 20):  # what the socket already holds, then the reset
            pass
    s.close()
    assert small_infer(server).status_code == 200
