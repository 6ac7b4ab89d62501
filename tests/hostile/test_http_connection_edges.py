"""HTTP/1.1 connection edges (issue 23, defect 8, the HTTP part).

- a Content-Length over --http-max-input-size is refused when the headers arrive, not after the
  upload (the 400 and words the server gives for an oversized body; real Triton 2.51 has no such
  check before its JSON parser);
- a valid request pipelined ahead of garbage gets its answer before the 400 for the garbage;
- a client that shuts down its sending side after its request still gets the answer (after an
  interim 100 Continue, which tells a half-close from a client that is gone: the one that is
  gone resets the connection, and its request is cancelled as before).
Each on the fast path and on the ASGI app (a Content-Encoding header sends a request there).
"""

from __future__ import annotations

import json
import re
import socket
import time
from pathlib import Path

import httpx
import pytest

from conftest import KernelProcess, free_ports, running, wait_until_ok

MODELS = Path(__file__).resolve().parent / "models"
LIMIT = 100_000
TOO_LARGE = ("request body of {size} or more bytes exceeds the maximum allowed input size of 100000 bytes. "
             "Use --http-max-input-size to increase the limit.")
ROUTES = {"fast": b"", "asgi": b"Content-Encoding: identity\r\n"}


class Ports:
    def __init__(self, k: KernelProcess, sagemaker: int):
        self.k = k
        self.http = k.http_port
        self.sagemaker = sagemaker


@pytest.fixture(scope="module")
def ports():
    sm = free_ports(1)[0]
    k = KernelProcess([MODELS], f"--http-max-input-size={LIMIT}", "--allow-sagemaker=true", f"--sagemaker-port={sm}",
                      env={"SAGEMAKER_TRITON_DEFAULT_MODEL_NAME": "echo"})
    for ready in running(k):
        wait_until_ok(k, [f"http://127.0.0.1:{sm}/ping"])
        yield Ports(ready, sm)


def read_response(s: socket.socket, buf: bytearray) -> bytes:
    """One Content-Length framed answer from `s`, leaving what follows it in `buf`; interim (1xx)
    answers are skipped, as HTTP/1.1 clients do."""
    while True:
        while b"\r\n\r\n" not in buf:
            chunk = s.recv(65536)
            if not chunk:
                raise ConnectionError(f"closed after {bytes(buf)!r}")
            buf += chunk
        end = buf.index(b"\r\n\r\n") + 4
        if not buf.startswith(b"HTTP/1.1 1"):
            break
        del buf[:end]
    length = int(re.search(rb"(?i)\r\ncontent-length: *(\d+)", bytes(buf[:end])).group(1))
    while len(buf) < end + length:
        chunk = s.recv(65536)
        if not chunk:
            raise ConnectionError("closed in the body")
        buf += chunk
    out = bytes(buf[:end + length])
    del buf[:end + length]
    return out


def echo(values=(1, 2, 3), route: str = "fast", path: bytes = b"/v2/models/echo/infer") -> bytes:
    body = json.dumps({"inputs": [{"name": "IN", "shape": [len(values)], "datatype": "INT32",
                                   "data": list(values)}]}).encode()
    return (b"POST %s HTTP/1.1\r\nHost: x\r\n%sContent-Length: %d\r\n\r\n" % (path, ROUTES[route], len(body))
            + body)


def answer_data(response: bytes) -> list:
    return json.loads(response.split(b"\r\n\r\n", 1)[1])["outputs"][0]["data"]


@pytest.mark.parametrize("route", sorted(ROUTES))
def test_declared_body_over_the_limit_is_refused_at_the_headers(ports, route):
    size = 10 ** 9
    with socket.create_connection(("127.0.0.1", ports.http), timeout=10) as s:
        s.sendall(b"POST /v2/models/echo/infer HTTP/1.1\r\nHost: x\r\n%sContent-Length: %d\r\n\r\n"
                  % (ROUTES[route], size))
        answer = read_response(s, bytearray())  # no byte of the body was sent
    assert answer.startswith(b"HTTP/1.1 400"), answer
    assert json.loads(answer.split(b"\r\n\r\n", 1)[1]) == {"error": TOO_LARGE.format(size=size)}


def test_declared_body_over_the_limit_on_the_sagemaker_port(ports):
    with socket.create_connection(("127.0.0.1", ports.sagemaker), timeout=10) as s:
        s.sendall(b"POST /invocations HTTP/1.1\r\nHost: x\r\nContent-Length: 200000\r\n\r\n")
        answer = read_response(s, bytearray())
    assert answer.startswith(b"HTTP/1.1 400"), answer
    assert json.loads(answer.split(b"\r\n\r\n", 1)[1]) == {"error": TOO_LARGE.format(size=200000)}


def test_a_client_sending_the_whole_oversized_body_reads_the_refusal(ports):
    """Clients that send their whole body before they read (most do) still get the 400, not a reset."""
    r = httpx.post(f"http://{ports.k.url}/v2/models/echo/infer", content=b" " * (4 << 20), timeout=30)
    assert r.status_code == 400
    assert r.json() == {"error": TOO_LARGE.format(size=4 << 20)}
    assert httpx.post(f"http://{ports.k.url}/v2/models/echo/infer", timeout=30, json={
        "inputs": [{"name": "IN", "shape": [1], "datatype": "INT32", "data": [5]}]}).status_code == 200


@pytest.mark.parametrize("route", sorted(ROUTES))
@pytest.mark.parametrize("behind", [b"GARBAGE\r\n\r\n",
                                    b"POST /v2/models/echo/infer HTTP/1.1\r\nContent-Length: 200000\r\n\r\n"])
def test_pipelined_request_before_garbage_is_answered_first(ports, route, behind):
    with socket.create_connection(("127.0.0.1", ports.http), timeout=10) as s:
        s.sendall(echo((4, 5, 6), route) + behind)
        buf = bytearray()
        first = read_response(s, buf)
        assert first.startswith(b"HTTP/1.1 200"), first
        assert answer_data(first) == [4, 5, 6]
        while b"\r\n\r\n" not in buf:
            chunk = s.recv(4096)
            assert chunk, "closed without answering the garbage"
            buf += chunk
        assert bytes(buf).startswith(b"HTTP/1.1 400"), bytes(buf)


@pytest.mark.parametrize("route", sorted(ROUTES))
def test_a_half_closed_client_gets_its_answer(ports, route):
    with socket.create_connection(("127.0.0.1", ports.http), timeout=10) as s:
        s.sendall(echo((7, 8), route) + echo((9,), route))  # two requests, then no more
        s.shutdown(socket.SHUT_WR)
        buf = bytearray()
        assert answer_data(read_response(s, buf)) == [7, 8]
        assert answer_data(read_response(s, buf)) == [9]
        start = time.monotonic()
        assert s.recv(10) == b""  # and then the server closes
        assert time.monotonic() - start < 5
