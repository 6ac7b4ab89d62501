"""The HTTP front's fast path for infer requests (kernel/transports/http/fast.py, issue 17).

Two real servers on the same models, one with the fast path and one with it off
(KERNEL_HTTP_FAST_PATH=0: every request through the ASGI app), get the same raw requests
over sockets; their answers must match byte for byte but for the Date header. Then what the
fast path must keep: keep-alive, pipelined requests answered in order (mixed with ASGI
routes), HTTP/1.0 and Connection: close, a client that goes away cancelling its request,
and the header limit on the infer route.
"""

from __future__ import annotations

import json
import os
import re
import socket
import struct
import time

import numpy as np
import pytest
import tritonclient.http as httpclient

from conftest import EXAMPLES, TEST_MODELS, KernelProcess, free_port, running


@pytest.fixture(scope="module")
def fast():
    yield from running(KernelProcess([EXAMPLES, TEST_MODELS / "good"], "--http-max-header-size=16384",
                                     "--http-max-input-size=100000", "--http-body-timeout-secs=2"))


@pytest.fixture(scope="module")
def asgi():
    env = {**os.environ, "KERNEL_HTTP_FAST_PATH": "0"}
    yield from running(KernelProcess([EXAMPLES, TEST_MODELS / "good"], "--http-max-header-size=16384",
                                     "--http-max-input-size=100000", "--http-body-timeout-secs=2", env=env))


def read_response(s: socket.socket, buf: bytearray) -> bytes:
    """One HTTP response from `s` (Content-Length framed), leaving what follows it in `buf`."""
    while b"\r\n\r\n" not in buf:
        chunk = s.recv(65536)
        if not chunk:
            raise ConnectionError(f"closed after {bytes(buf)!r}")
        buf += chunk
    head_end = buf.index(b"\r\n\r\n") + 4
    if buf.startswith(b"HTTP/1.1 100 "):  # an interim answer: no body
        out = bytes(buf[:head_end])
        del buf[:head_end]
        return out
    length = int(re.search(rb"(?i)\r\ncontent-length: *(\d+)", bytes(buf[:head_end])).group(1))
    while len(buf) < head_end + length:
        chunk = s.recv(65536)
        if not chunk:
            raise ConnectionError("closed in the body")
        buf += chunk
    out = bytes(buf[:head_end + length])
    del buf[:head_end + length]
    return out


def exchange(port: int, raw: bytes, count: int = 1) -> list[bytes]:
    with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
        s.sendall(raw)
        buf = bytearray()
        return [read_response(s, buf) for _ in range(count)]


def undated(response: bytes) -> bytes:
    return re.sub(rb"\r\ndate: [^\r]*", b"\r\ndate: -", response)


def post(path: str, body: bytes, *extra: bytes, version: bytes = b"1.1") -> bytes:
    head = b"POST %s HTTP/%s\r\nHost: x\r\nContent-Length: %d\r\n" % (path.encode(), version, len(body))
    return head + b"".join(h + b"\r\n" for h in extra) + b"\r\n" + body


def add_sub_json(a=(1, 2, 3, 4), b=(1, 1, 1, 1), **top) -> bytes:
    doc = {"inputs": [{"name": "INPUT0", "shape": [4], "datatype": "FP32", "data": list(a)},
                      {"name": "INPUT1", "shape": [4], "datatype": "FP32", "data": list(b)}], **top}
    return json.dumps(doc).encode()


def add_sub_binary(binary_out: bool) -> tuple[bytes, bytes]:
    doc = {"inputs": [{"name": n, "shape": [4], "datatype": "FP32", "parameters": {"binary_data_size": 16}}
                      for n in ("INPUT0", "INPUT1")],
           "parameters": {"binary_data_output": binary_out}, "id": "req-7"}
    header = json.dumps(doc).encode()
    data = struct.pack("<4f", 1, 2, 3, 4) + struct.pack("<4f", 0.5, 0.5, 0.5, 0.5)
    return header + data, b"Inference-Header-Content-Length: %d" % len(header)


def cases() -> dict[str, bytes]:
    binary_body, binary_len = add_sub_binary(True)
    json_out_body, json_out_len = add_sub_binary(False)
    big = np.arange(20000, dtype=np.float32).tobytes()  # arrives in several reads
    big_header = json.dumps({"inputs": [{"name": "IN_FP32", "shape": [20000], "datatype": "FP32",
                                         "parameters": {"binary_data_size": len(big)}}]}).encode()
    return {
        "json": post("/v2/models/add_sub/infer", add_sub_json(id="a1")),
        "version": post("/v2/models/add_sub/versions/1/infer", add_sub_json()),
        "binary_in_out": post("/v2/models/add_sub/infer", binary_body, binary_len),
        "binary_in_json_out": post("/v2/models/add_sub/infer", json_out_body, json_out_len),
        "big_binary": post("/v2/models/dtype_echo/infer", big_header + big,
                           b"Inference-Header-Content-Length: %d" % len(big_header)),
        "raw_body": post("/v2/models/dtype_echo/infer", b"", b"Inference-Header-Content-Length: 0"),
        "expect_continue": post("/v2/models/dtype_echo/infer", big_header + big, b"Expect: 100-continue",
                                b"Inference-Header-Content-Length: %d" % len(big_header)),
        "http10": post("/v2/models/add_sub/infer", add_sub_json(), version=b"1.0"),
        "close": post("/v2/models/add_sub/infer", add_sub_json(), b"Connection: close"),
        "unknown_model": post("/v2/models/nope/infer", add_sub_json()),
        "unknown_version": post("/v2/models/add_sub/versions/9/infer", add_sub_json()),
        "not_json": post("/v2/models/add_sub/infer", b"{not json"),
        "wrong_shape": post("/v2/models/add_sub/infer", add_sub_json(a=(1, 2))),
        "bad_header_length": post("/v2/models/add_sub/infer", add_sub_json(), b"Inference-Header-Content-Length: 9999"),
        "decoupled": post("/v2/models/repeat_int32/infer", add_sub_json()),
        "model_error": post("/v2/models/error_response/infer", json.dumps(
            {"inputs": [{"name": "INPUT0", "shape": [1], "datatype": "FP32", "data": [1]}]}).encode()),
        "model_raises": post("/v2/models/raises/infer", json.dumps(
            {"inputs": [{"name": "INPUT0", "shape": [1], "datatype": "FP32", "data": [1]}]}).encode()),
        "too_large": post("/v2/models/add_sub/infer", b" " * 100001),
        "empty": post("/v2/models/add_sub/infer", b""),
        "get_infer": b"GET /v2/models/add_sub/infer HTTP/1.1\r\nHost: x\r\n\r\n",
    }


@pytest.mark.parametrize("case", sorted(cases()))
def test_fast_path_answers_byte_for_byte_as_asgi(fast, asgi, case):
    raw = cases()[case]
    count = 2 if b"Expect: 100-continue" in raw else 1  # 100 Continue, then the answer
    got, want = exchange(fast.http_port, raw, count), exchange(asgi.http_port, raw, count)
    assert [undated(a) for a in got] == [undated(a) for a in want]
    if count == 2:
        assert got[0] == b"HTTP/1.1 100 Continue\r\n\r\n" and got[1].startswith(b"HTTP/1.1 200")


def test_pipelined_requests_are_answered_in_order(fast):
    health = b"GET /v2/health/ready HTTP/1.1\r\nHost: x\r\n\r\n"
    raw = b"".join([post("/v2/models/add_sub/infer", add_sub_json(a=(i, 0, 0, 0), id=f"p{i}")) if i % 3 else health
                    for i in range(1, 10)])
    answers = exchange(fast.http_port, raw, 9)
    for i, answer in zip(range(1, 10), answers):
        assert answer.startswith(b"HTTP/1.1 200"), answer
        if i % 3:
            doc = json.loads(answer.split(b"\r\n\r\n", 1)[1])
            assert doc["id"] == f"p{i}" and doc["outputs"][0]["data"][0] == i + 1


def test_keep_alive_serves_many_requests_on_one_connection(fast):
    client = httpclient.InferenceServerClient(fast.url, concurrency=1)
    a = np.arange(4, dtype=np.float32)
    for i in range(50):
        inputs = [httpclient.InferInput(n, [4], "FP32") for n in ("INPUT0", "INPUT1")]
        inputs[0].set_data_from_numpy(a + i, binary_data=bool(i % 2))
        inputs[1].set_data_from_numpy(a, binary_data=True)
        result = client.infer("add_sub", inputs)
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + i + a)
    client.close()


def test_http10_and_connection_close_close_the_connection(fast):
    for raw in (cases()["http10"], cases()["close"]):
        with socket.create_connection(("127.0.0.1", fast.http_port), timeout=30) as s:
            s.sendall(raw)
            buf = bytearray()
            answer = read_response(s, buf)
            assert answer.startswith(b"HTTP/1.1 200") and b"\r\nconnection: close\r\n" in answer
            assert s.recv(10) == b""


def test_client_going_away_cancels_its_request(fast):
    tag = f"fast-disconnect-{time.time()}"
    data = tag.encode()
    body = json.dumps({"inputs": [{"name": "TAG", "shape": [1], "datatype": "BYTES", "data": [tag]}]}).encode()
    assert data in body
    s = socket.create_connection(("127.0.0.1", fast.http_port), timeout=30)
    s.sendall(post("/v2/models/cancel_watcher/infer", body))
    time.sleep(0.5)  # the request is in the model
    s.close()
    assert fast.wait_for_log(f"cancel_watcher saw cancellation of {tag}", timeout=10)


def test_header_limit_holds_on_the_infer_route(fast):
    raw = post("/v2/models/add_sub/infer", add_sub_json(), b"X-Big: " + b"a" * 20000)
    with socket.create_connection(("127.0.0.1", fast.http_port), timeout=30) as s:
        s.sendall(raw)
        answer = s.recv(4096)
    assert answer.startswith(b"HTTP/1.1 431"), answer
    assert exchange(fast.http_port, cases()["json"])[0].startswith(b"HTTP/1.1 200")


def test_large_body_read_past_the_parser_then_more_requests(fast):
    """A body of 64 KiB or more is read straight into its buffer; the requests after it on the
    connection (pipelined in the same write, or sent later in pieces) are still parsed right."""
    big, small = cases()["big_binary"], cases()["json"]
    want_big, want_small = (undated(a) for a in exchange(fast.http_port, big + small, 2))
    assert want_big.startswith(b"HTTP/1.1 200") and want_small.startswith(b"HTTP/1.1 200")
    with socket.create_connection(("127.0.0.1", fast.http_port), timeout=30) as s:
        buf = bytearray()
        for _ in range(3):
            for i in range(0, len(big), 7000):  # many reads, one of them carrying the next request's start
                s.sendall(big[i:i + 7000])
                time.sleep(0.002)
            assert undated(read_response(s, buf)) == want_big
            s.sendall(small[:20])
            time.sleep(0.01)
            s.sendall(small[20:])
            assert undated(read_response(s, buf)) == want_small


def test_large_body_that_stops_is_cut_with_408(fast):
    big = cases()["big_binary"]
    with socket.create_connection(("127.0.0.1", fast.http_port), timeout=30) as s:
        s.sendall(big[:len(big) // 2])
        start = time.monotonic()
        answer = s.recv(4096)
    assert answer.startswith(b"HTTP/1.1 408"), answer
    assert time.monotonic() - start < 10


def test_expect_100_continue_waits_for_the_go_ahead(fast):
    """A client that sends only its headers and waits (curl does for large uploads) gets 100 Continue."""
    raw = cases()["expect_continue"]
    head_end = raw.index(b"\r\n\r\n") + 4
    with socket.create_connection(("127.0.0.1", fast.http_port), timeout=30) as s:
        s.sendall(raw[:head_end])
        buf = bytearray()
        assert read_response(s, buf) == b"HTTP/1.1 100 Continue\r\n\r\n"
        s.sendall(raw[head_end:])
        assert read_response(s, buf).startswith(b"HTTP/1.1 200")


def test_uvloop_reads_a_large_body_straight_into_its_buffer(tmp_path, monkeypatch):
    """The front's own HTTP transport on uvloop, in this process: a 4 MiB infer body must reach
    the request with httptools seeing no more of it than came in the read with the headers.

    uvloop reads with get_buffer only from an object that is not an asyncio.Protocol; given the
    connection itself (an asyncio.Protocol through uvicorn's class) it read every body in 256 KiB
    bytes objects through httptools, three copies on the loop, and a 24 MiB body held the loop
    30-100 ms at a time (fast.BufferedReads). The answer is the unknown model's 404, sent once
    the whole body is in."""
    import asyncio

    import uvloop

    from kernel.core.server import ServerOptions
    from kernel.serve.compose import compose_server
    from kernel.transports.http import fast
    from kernel.transports.http.transport import HttpTransport

    through_parser: list[int] = []
    body_received = fast.FastInferProtocol.body_received

    def counted(self, body: bytes) -> None:
        through_parser.append(len(body))
        body_received(self, body)

    monkeypatch.setattr(fast.FastInferProtocol, "body_received", counted)
    header = json.dumps({"inputs": [{"name": "IN", "shape": [1], "datatype": "BYTES", "parameters":
                                     {"binary_data_size": 4 << 20}}]}).encode()
    body = header + os.urandom(4 << 20)
    request = (b"POST /v2/models/absent/infer HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n"
               b"Inference-Header-Content-Length: %d\r\n\r\n" % (len(body), len(header))) + body

    async def exchange_in_process() -> bytes:
        server = compose_server(ServerOptions(model_repositories=[tmp_path]), {})
        await server.start()
        port = free_port()
        transport = HttpTransport(server, "127.0.0.1", port)
        await transport.start()
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(request)
            answer = await asyncio.wait_for(reader.readuntil(b'"}'), 30)
            writer.close()
            return answer
        finally:
            await transport.stop()
            await transport.close()

    answer = uvloop.run(exchange_in_process())
    assert answer.startswith(b"HTTP/1.1 404") and b"Request for unknown model: 'absent' is not found" in answer, answer
    assert sum(through_parser) <= fast.READ_BUFFER_BYTES, (
        f"httptools saw {sum(through_parser)} of the body's {len(body)} bytes in {len(through_parser)} pieces")
