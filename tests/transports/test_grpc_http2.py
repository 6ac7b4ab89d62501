"""HTTP/2 details of Kernel's own gRPC server, driven frame by frame over a raw socket.

tritonclient only ever exercises the happy path of HTTP/2; these tests cover
what other gRPC clients and proxies may send: padding, CONTINUATION frames,
tiny flow-control windows, pings, resets, deadlines, compression, stray
methods and content types, and a graceful shutdown.
"""

from __future__ import annotations

import gzip
import json
import os
import socket
import struct
import time

import hpack
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.grpc import service_pb2 as tc_pb

pytestmark = pytest.mark.skipif(
    os.environ.get("KERNEL_GRPC_SERVER", "native") != "native",
    reason="frame-level tests of Kernel's own HTTP/2 server",
)

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
DATA, HEADERS, PRIORITY, RST_STREAM, SETTINGS, PUSH_PROMISE, PING, GOAWAY, WINDOW_UPDATE, CONTINUATION = range(10)
END_STREAM, ACK, END_HEADERS, PADDED = 0x1, 0x1, 0x4, 0x8


def frame(kind, flags, stream_id, payload=b""):
    n = len(payload)
    return struct.pack(">HBBBL", n >> 8, n & 0xFF, kind, flags, stream_id) + payload


def grpc_message(msg) -> bytes:
    body = msg.SerializeToString()
    return b"\x00" + struct.pack(">L", len(body)) + body


class RawClient:
    """Just enough of an HTTP/2 client to speak to the server frame by frame."""

    def __init__(self, port, settings=(), window_update=True):
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        self.encoder = hpack.Encoder()
        self.decoder = hpack.Decoder()
        self.buf = b""
        payload = b"".join(struct.pack(">HL", k, v) for k, v in settings)
        self.sock.sendall(PREFACE + frame(SETTINGS, 0, 0, payload))
        self.server_settings = None
        self.window_update = window_update

    def send(self, data: bytes):
        self.sock.sendall(data)

    def headers_block(self, path, extra=(), method="POST", content_type="application/grpc"):
        headers = [(":method", method), (":scheme", "http"), (":path", path), (":authority", "localhost"),
                   ("te", "trailers"), ("content-type", content_type), *extra]
        return self.encoder.encode(headers)

    def request(self, stream_id, path, message: bytes, extra=(), **kw):
        self.send(frame(HEADERS, END_HEADERS, stream_id, self.headers_block(path, extra, **kw)))
        self.send(frame(DATA, END_STREAM, stream_id, message))

    def read_frame(self, timeout=10.0):
        self.sock.settimeout(timeout)
        while len(self.buf) < 9 or len(self.buf) < 9 + (self.buf[0] << 16 | self.buf[1] << 8 | self.buf[2]):
            chunk = self.sock.recv(1 << 20)
            if not chunk:
                raise ConnectionError("server closed the connection")
            self.buf += chunk
        n = self.buf[0] << 16 | self.buf[1] << 8 | self.buf[2]
        kind, flags = self.buf[3], self.buf[4]
        stream_id = struct.unpack(">L", self.buf[5:9])[0] & 0x7FFFFFFF
        payload = self.buf[9 : 9 + n]
        self.buf = self.buf[9 + n :]
        if kind == SETTINGS and not flags & ACK:
            self.server_settings = payload
            self.send(frame(SETTINGS, ACK, 0))
        return kind, flags, stream_id, payload

    def call(self, stream_id, timeout=10.0, ack_data=True, arrivals=None):
        """Read frames until stream_id ends; returns (headers, [data payloads], trailers).
        `arrivals`: a list that gets the time.monotonic() each payload was read at, in step."""
        headers, data, trailers = None, [], None
        deadline = time.time() + timeout
        while time.time() < deadline:
            kind, flags, sid, payload = self.read_frame(deadline - time.time())
            if sid != stream_id:
                continue
            if kind == HEADERS:
                block = dict(self.decoder.decode(payload))
                if headers is None:
                    headers = block
                    if flags & END_STREAM:
                        return headers, data, block
                else:
                    return headers, data, block
            elif kind == DATA:
                data.append(payload)
                if arrivals is not None:
                    arrivals.append(time.monotonic())
                if ack_data and payload:
                    self.send(frame(WINDOW_UPDATE, 0, 0, struct.pack(">L", len(payload)))
                              + frame(WINDOW_UPDATE, 0, stream_id, struct.pack(">L", len(payload))))
                if flags & END_STREAM:
                    return headers, data, trailers
            elif kind == RST_STREAM:
                return headers, data, {"rst": struct.unpack(">L", payload)[0]}
        raise TimeoutError(f"stream {stream_id} did not finish")

    def close(self):
        self.sock.close()


def _messages(data_payloads):
    body = b"".join(data_payloads)
    out = []
    while body:
        n = struct.unpack(">L", body[1:5])[0]
        out.append(body[5 : 5 + n])
        body = body[5 + n :]
    return out


LIVE = "/inference.GRPCInferenceService/ServerLive"
INFER = "/inference.GRPCInferenceService/ModelInfer"


@pytest.fixture
def raw(server):
    c = RawClient(server.grpc_port)
    yield c
    c.close()


def test_settings_and_ping(raw):
    raw.send(frame(PING, 0, 0, b"12345678"))
    seen = []
    while True:
        kind, flags, sid, payload = raw.read_frame()
        seen.append(kind)
        if kind == PING and flags & ACK:
            assert payload == b"12345678"
            break
    assert seen[0] == SETTINGS and raw.server_settings is not None


def test_unary_call(raw):
    raw.request(1, LIVE, grpc_message(tc_pb.ServerLiveRequest()))
    headers, data, trailers = raw.call(1)
    assert headers[":status"] == "200" and headers["content-type"] == "application/grpc"
    assert trailers["grpc-status"] == "0"
    assert tc_pb.ServerLiveResponse.FromString(_messages(data)[0]).live is True


def test_padding_continuation_and_split_message(raw):
    block = raw.headers_block(LIVE)
    half = len(block) // 2
    pad = 7
    raw.send(frame(HEADERS, PADDED, 3, bytes([pad]) + block[:half] + b"\0" * pad))
    raw.send(frame(CONTINUATION, END_HEADERS, 3, block[half:]))
    msg = grpc_message(tc_pb.ServerLiveRequest())  # 5 bytes: split across two DATA frames
    raw.send(frame(DATA, PADDED, 3, bytes([3]) + msg[:2] + b"\0\0\0"))
    raw.send(frame(PRIORITY, 0, 3, b"\0\0\0\0\x10"))  # ignored
    raw.send(frame(0x42, 0, 0, b"unknown frame types are ignored"))
    raw.send(frame(DATA, END_STREAM, 3, msg[2:]))
    headers, data, trailers = raw.call(3)
    assert trailers["grpc-status"] == "0"
    assert tc_pb.ServerLiveResponse.FromString(_messages(data)[0]).live is True


def test_flow_control_with_a_tiny_client_window(server):
    c = RawClient(server.grpc_port, settings=[(0x4, 1000), (0x5, 16384)])  # INITIAL_WINDOW_SIZE=1000
    try:
        data = np.arange(100_000, dtype=np.float32)  # 400 KB back: far more than any window granted
        I = tc_pb.ModelInferRequest.InferInputTensor
        request = tc_pb.ModelInferRequest(model_name="dtype_echo", inputs=[I(name="IN_FP32", datatype="FP32", shape=[len(data)])],
                                          raw_input_contents=[data.tobytes()])
        c.request(1, INFER, grpc_message(request))
        stream_window, conn_window = 1000, 65535
        payloads = []
        deadline = time.time() + 30
        trailers = None
        while trailers is None and time.time() < deadline:
            kind, flags, sid, payload = c.read_frame()
            if sid != 1:
                continue
            if kind == DATA:
                assert len(payload) <= min(stream_window, conn_window, 16384)
                stream_window -= len(payload)
                conn_window -= len(payload)
                payloads.append(payload)
                if stream_window == 0 or conn_window < 1000:
                    # grant a little more, as a slow reader would
                    c.send(frame(WINDOW_UPDATE, 0, 1, struct.pack(">L", 3000))
                           + frame(WINDOW_UPDATE, 0, 0, struct.pack(">L", 60000)))
                    stream_window += 3000
                    conn_window += 60000
            elif kind == HEADERS and flags & END_STREAM:
                trailers = dict(c.decoder.decode(payload))
            elif kind == HEADERS:
                c.decoder.decode(payload)
        assert trailers is not None and trailers["grpc-status"] == "0"
        reply = tc_pb.ModelInferResponse.FromString(_messages(payloads)[0])
        assert np.frombuffer(reply.raw_output_contents[0], np.float32).tolist() == data.tolist()
    finally:
        c.close()


def test_large_message_in_frames_split_across_reads_with_window_updates(server):
    """A 20 MB request, more than the 16 MiB window the server grants at first: sent in 1 MiB DATA
    frames (the server's SETTINGS_MAX_FRAME_SIZE), some written in pieces so that a frame's payload
    arrives over several reads, one padded, and never past the windows the server has granted.
    The echo must be exact: the payload goes to the message as views of each read."""
    c = RawClient(server.grpc_port, settings=[(0x4, 16 << 20), (0x5, 1 << 20)])
    try:
        c.send(frame(WINDOW_UPDATE, 0, 0, struct.pack(">L", (16 << 20) - 65535)))
        settings = None
        while settings is None:
            kind, flags, sid, payload = c.read_frame()
            if kind == SETTINGS and not flags & ACK:
                settings = dict(struct.unpack(">HL", payload[i : i + 6]) for i in range(0, len(payload), 6))
        max_frame, window = settings[0x5], settings[0x4]
        assert max_frame >= 1 << 20 and window >= 16 << 20
        conn_window = stream_window = window  # the server's connection WINDOW_UPDATE follows its SETTINGS
        data = np.random.default_rng(7).random(5_000_000, dtype=np.float32)
        I = tc_pb.ModelInferRequest.InferInputTensor
        request = tc_pb.ModelInferRequest(model_name="dtype_echo", inputs=[I(name="IN_FP32", datatype="FP32",
                                          shape=[len(data)])], raw_input_contents=[data.tobytes()])
        body = grpc_message(request)
        c.send(frame(HEADERS, END_HEADERS, 1, c.headers_block(INFER)))
        pos = n = 0
        while pos < len(body):
            chunk = body[pos : pos + max_frame - 8]
            pos += len(chunk)
            padded = n == 3
            size = len(chunk) + (8 if padded else 0)
            while min(conn_window, stream_window) < size:  # wait for credit
                kind, flags, sid, payload = c.read_frame()
                if kind == WINDOW_UPDATE:
                    inc = struct.unpack(">L", payload)[0]
                    if sid == 0:
                        conn_window += inc
                    else:
                        stream_window += inc
            payload = bytes([7]) + chunk + b"\0" * 7 if padded else chunk
            f = frame(DATA, (END_STREAM if pos == len(body) else 0) | (PADDED if padded else 0), 1, payload)
            if n % 4 == 1:  # in pieces: the frame's payload arrives over several reads
                for i in range(0, len(f), 300_000):
                    c.send(f[i : i + 300_000])
                    time.sleep(0.005)
            else:
                c.send(f)
            conn_window -= size
            stream_window -= size
            n += 1
        assert n > 16
        headers, payloads, trailers = c.call(1, timeout=60)
        assert trailers["grpc-status"] == "0"
        reply = tc_pb.ModelInferResponse.FromString(_messages(payloads)[0])
        assert reply.raw_output_contents[0] == data.tobytes()
    finally:
        c.close()


def _echo_request(data):
    I = tc_pb.ModelInferRequest.InferInputTensor
    return tc_pb.ModelInferRequest(model_name="dtype_echo", inputs=[I(name="IN_FP32", datatype="FP32",
                                   shape=[len(data)])], raw_input_contents=[data.tobytes()])


def test_large_compressed_message_read_in_place_and_a_body_ending_inside_one(raw):
    """A 1.6 MB gzip message (read into a buffer of its own, then inflated), a second call on
    the same connection whose body ends half-way through such a message (INTERNAL), and a third
    that is reset half-way: the connection goes on serving."""
    data = np.random.default_rng(3).random(400_000, dtype=np.float32)
    body = gzip.compress(tc_pb.ModelInferRequest.SerializeToString(_echo_request(data)))
    message = b"\x01" + struct.pack(">L", len(body)) + body
    raw.send(frame(HEADERS, END_HEADERS, 1, raw.headers_block(INFER, [("grpc-encoding", "gzip")])))
    for i in range(0, len(message), 16384):
        raw.send(frame(DATA, END_STREAM if i + 16384 >= len(message) else 0, 1, message[i : i + 16384]))
    headers, payloads, trailers = raw.call(1, timeout=30)
    assert trailers["grpc-status"] == "0"
    assert tc_pb.ModelInferResponse.FromString(_messages(payloads)[0]).raw_output_contents[0] == data.tobytes()
    half = grpc_message(_echo_request(data))[:800_000]
    raw.send(frame(HEADERS, END_HEADERS, 3, raw.headers_block(INFER)))
    raw.send(frame(DATA, 0, 3, half[:16384]) + frame(DATA, END_STREAM, 3, half[16384:32768]))
    headers, _, trailers = raw.call(3)
    assert (trailers or headers)["grpc-status"] == "13"
    assert "ended inside a message" in (trailers or headers)["grpc-message"]
    raw.send(frame(HEADERS, END_HEADERS, 5, raw.headers_block(INFER)))
    raw.send(frame(DATA, 0, 5, half[:16384]) + frame(RST_STREAM, 0, 5, struct.pack(">L", 8)))
    raw.request(7, LIVE, grpc_message(tc_pb.ServerLiveRequest()))
    _, payloads, trailers = raw.call(7)
    assert trailers["grpc-status"] == "0" and tc_pb.ServerLiveResponse.FromString(_messages(payloads)[0]).live


def test_bandwidth_probe_pings_are_answered_not_punished(server):
    """grpc C-core clients grow their receive window only when the PINGs they send on receiving
    DATA (BDP probes, one outstanding at a time) are acknowledged promptly: over a 4 MB answer
    that a small window releases frame by frame, every probe gets its ACK, and no
    GOAWAY(too_many_pings) (DATA released by a WINDOW_UPDATE counts as data sent)."""
    c = RawClient(server.grpc_port, settings=[(0x4, 1 << 20)])
    try:
        data = np.random.default_rng(5).random(1_000_000, dtype=np.float32)
        body = grpc_message(_echo_request(data))
        c.send(frame(HEADERS, END_HEADERS, 1, c.headers_block(INFER)))
        for i in range(0, len(body), 1 << 20):  # frames within the server's SETTINGS_MAX_FRAME_SIZE
            c.send(frame(DATA, END_STREAM if i + (1 << 20) >= len(body) else 0, 1, body[i : i + (1 << 20)]))
        payloads, acks, pings, trailers = [], 0, 0, None
        deadline = time.time() + 30
        while trailers is None and time.time() < deadline:
            kind, flags, sid, payload = c.read_frame()
            assert kind != GOAWAY, payload
            if kind == DATA and sid == 1:
                payloads.append(payload)
                probe = b""
                if acks == pings:  # the previous probe came back: start the next one
                    pings += 1
                    probe = frame(PING, 0, 0, struct.pack(">Q", pings))
                c.send(probe + frame(WINDOW_UPDATE, 0, 0, struct.pack(">L", len(payload)))
                       + frame(WINDOW_UPDATE, 0, 1, struct.pack(">L", len(payload))))
            elif kind == PING and flags & ACK:
                acks += 1
            elif kind == HEADERS and sid == 1:
                block = dict(c.decoder.decode(payload))
                if flags & END_STREAM:
                    trailers = block
        assert trailers["grpc-status"] == "0" and pings > 10
        while acks < pings:
            kind, flags, sid, payload = c.read_frame()
            assert kind != GOAWAY
            acks += kind == PING and bool(flags & ACK)
        reply = tc_pb.ModelInferResponse.FromString(_messages(payloads)[0])
        assert reply.raw_output_contents[0] == data.tobytes()
    finally:
        c.close()


def test_http_level_refusals(raw):
    raw.request(1, LIVE, b"", method="GET")
    headers, _, _ = raw.call(1)
    assert headers[":status"] == "405"
    raw.request(3, LIVE, b"", content_type="application/json")
    headers, _, _ = raw.call(3)
    assert headers[":status"] == "415"
    raw.request(5, "/inference.GRPCInferenceService/Nope", grpc_message(tc_pb.ServerLiveRequest()))
    headers, _, trailers = raw.call(5)
    assert headers["grpc-status"] == "12"  # trailers-only UNIMPLEMENTED


def test_error_status_is_percent_encoded(raw):
    request = tc_pb.ModelInferRequest(model_name="ünknown-model")
    raw.request(1, INFER, grpc_message(request))
    headers, data, trailers = raw.call(1)
    assert data == [] and headers["grpc-status"] != "0"
    assert "%C3%BC" in headers["grpc-message"]


def test_rst_stream_cancels_the_request(server, raw):
    tag = b"raw-rst"
    I = tc_pb.ModelInferRequest.InferInputTensor
    request = tc_pb.ModelInferRequest(model_name="cancel_watcher", inputs=[I(name="TAG", datatype="BYTES", shape=[1])],
                                      raw_input_contents=[struct.pack("<I", len(tag)) + tag])
    raw.request(1, INFER, grpc_message(request))
    time.sleep(0.3)
    raw.send(frame(RST_STREAM, 0, 1, struct.pack(">L", 0x8)))
    assert server.wait_for_log("cancel_watcher saw cancellation of raw-rst", timeout=10)
    raw.request(3, LIVE, grpc_message(tc_pb.ServerLiveRequest()))  # the connection is still fine
    assert raw.call(3)[2]["grpc-status"] == "0"


def test_dropped_connection_cancels_the_request(server):
    c = RawClient(server.grpc_port)
    tag = b"raw-drop"
    I = tc_pb.ModelInferRequest.InferInputTensor
    request = tc_pb.ModelInferRequest(model_name="cancel_watcher", inputs=[I(name="TAG", datatype="BYTES", shape=[1])],
                                      raw_input_contents=[struct.pack("<I", len(tag)) + tag])
    c.request(1, INFER, grpc_message(request))
    time.sleep(0.3)
    c.close()  # no RST_STREAM, no GOAWAY: the TCP connection just goes away
    assert server.wait_for_log("cancel_watcher saw cancellation of raw-drop", timeout=10)


def test_grpc_timeout_header(server, raw):
    tag = b"raw-timeout"
    I = tc_pb.ModelInferRequest.InferInputTensor
    request = tc_pb.ModelInferRequest(model_name="cancel_watcher", inputs=[I(name="TAG", datatype="BYTES", shape=[1])],
                                      raw_input_contents=[struct.pack("<I", len(tag)) + tag])
    raw.request(1, INFER, grpc_message(request), extra=[("grpc-timeout", "300m")])
    headers, data, trailers = raw.call(1)
    assert (trailers or headers)["grpc-status"] == "4"
    assert server.wait_for_log("cancel_watcher saw cancellation of raw-timeout", timeout=10)


def test_gzip_compressed_request(raw):
    body = tc_pb.ServerLiveRequest().SerializeToString() + b""
    packed = gzip.compress(body)
    raw.request(1, LIVE, b"\x01" + struct.pack(">L", len(packed)) + packed, extra=[("grpc-encoding", "gzip")])
    headers, data, trailers = raw.call(1)
    assert trailers["grpc-status"] == "0"


@pytest.mark.parametrize("algorithm", ["gzip", "deflate"])
def test_tritonclient_compression(server, algorithm):
    client = grpcclient.InferenceServerClient(server.grpc_url)
    a = np.arange(4, dtype=np.float32)
    inputs = []
    for name in ("INPUT0", "INPUT1"):
        t = grpcclient.InferInput(name, [4], "FP32")
        t.set_data_from_numpy(a)
        inputs.append(t)
    result = client.infer("add_sub", inputs, compression_algorithm=algorithm)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), 2 * a)
    client.close()


def test_bad_preface_closes_the_connection(server):
    s = socket.create_connection(("127.0.0.1", server.grpc_port), timeout=5)
    s.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
    received = b""
    while True:  # the server's own SETTINGS may come first; then the connection closes
        chunk = s.recv(4096)
        if not chunk:
            break
        received += chunk
    assert len(received) < 100
    s.close()


def test_protocol_error_gets_goaway(raw):
    raw.send(frame(HEADERS, END_HEADERS | END_STREAM, 2, raw.headers_block(LIVE)))  # even id: clients use odd ids
    kinds = []
    try:
        while True:
            kind, flags, sid, payload = raw.read_frame(5)
            kinds.append(kind)
            if kind == GOAWAY:
                assert struct.unpack(">LL", payload[:8])[1] == 0x1  # PROTOCOL_ERROR
                break
    except ConnectionError:
        pass
    assert GOAWAY in kinds


def test_streaming_over_raw_frames(raw):
    path = "/inference.GRPCInferenceService/ModelStreamInfer"
    raw.send(frame(HEADERS, END_HEADERS, 1, raw.headers_block(path)))
    I = tc_pb.ModelInferRequest.InferInputTensor
    for i in range(3):
        req = tc_pb.ModelInferRequest(model_name="repeat_int32", id=f"s{i}", inputs=[I(name="IN", datatype="INT32", shape=[2])],
                                      raw_input_contents=[np.array([i, i], np.int32).tobytes()])
        raw.send(frame(DATA, 0, 1, grpc_message(req)))
    raw.send(frame(DATA, END_STREAM, 1, b""))
    headers, data, trailers = raw.call(1)
    assert trailers["grpc-status"] == "0"
    replies = [tc_pb.ModelStreamInferResponse.FromString(m) for m in _messages(data)]
    assert sorted(r.infer_response.id for r in replies) == ["s0", "s0", "s1", "s1", "s2", "s2"]


def _bytes_element(value: bytes) -> bytes:
    return struct.pack("<I", len(value)) + value


def _stream_call(raw, stream_id, requests):
    """Sends `requests` on one ModelStreamInfer call and ends its input; reads the call to its
    trailers. Returns (trailers, [(arrival time, payload)] of its non-empty DATA frames)."""
    raw.send(frame(HEADERS, END_HEADERS, stream_id, raw.headers_block("/inference.GRPCInferenceService/ModelStreamInfer")))
    raw.send(b"".join(frame(DATA, 0, stream_id, grpc_message(r)) for r in requests) + frame(DATA, END_STREAM, stream_id))
    arrivals: list = []
    _, data, trailers = raw.call(stream_id, timeout=30.0, arrivals=arrivals)
    return trailers, [(t, p) for t, p in zip(arrivals, data) if p]


def test_stream_writes_are_paced_when_a_model_streams_faster_than_the_interval(raw):
    """tiny_lm streams a token every few tens of microseconds. Written each loop turn, 2000 tokens
    took 265-433 writes here (and as many wake-ups of the client's gRPC threads); paced
    (--grpc-stream-write-interval-ms, 1 by default) the tokens that follow a write within the
    interval leave together an interval later: about one write per millisecond. Every token
    arrives, in order, the last one marked final."""
    I = tc_pb.ModelInferRequest.InferInputTensor
    params = json.dumps({"max_tokens": 2000, "ignore_eos": True, "temperature": 0}).encode()
    request = tc_pb.ModelInferRequest(
        model_name="tiny_lm", id="fast",
        inputs=[I(name="text_input", datatype="BYTES", shape=[1]), I(name="stream", datatype="BOOL", shape=[1]),
                I(name="sampling_parameters", datatype="BYTES", shape=[1])],
        raw_input_contents=[_bytes_element(b"the cat"), b"\x01", _bytes_element(params)])
    trailers, frames = _stream_call(raw, 1, [request])
    assert trailers.get("grpc-status") == "0", trailers
    replies = [tc_pb.ModelStreamInferResponse.FromString(m) for m in _messages([p for _, p in frames])]
    assert [r.error_message for r in replies if r.error_message] == []
    assert len(replies) == 2000 and all(r.infer_response.id == "fast" for r in replies)
    final = [r.infer_response.parameters["triton_final_response"].bool_param for r in replies]
    assert final == [False] * 1999 + [True]
    elapsed_ms = (frames[-1][0] - frames[0][0]) * 1000
    assert len(frames) <= 4 + 2 * elapsed_ms, f"{len(frames)} writes in {elapsed_ms:.1f} ms for 2000 tokens"


def test_a_stream_slower_than_the_interval_is_never_held(raw):
    """Responses 20 ms apart each leave as they come, one write each."""
    I = tc_pb.ModelInferRequest.InferInputTensor
    request = tc_pb.ModelInferRequest(
        model_name="repeat_int32", id="slow",
        inputs=[I(name="IN", datatype="INT32", shape=[5]), I(name="DELAY", datatype="UINT32", shape=[5])],
        raw_input_contents=[np.arange(5, dtype=np.int32).tobytes(), np.full(5, 20, np.uint32).tobytes()])
    trailers, frames = _stream_call(raw, 1, [request])
    assert trailers.get("grpc-status") == "0", trailers
    assert [len(_messages([p])) for _, p in frames] == [1] * 5
    gaps = [(b[0] - a[0]) * 1000 for a, b in zip(frames, frames[1:])]
    assert min(gaps) > 10, gaps  # arriving as the model sent them, not gathered at the end


# ---------------------------------------------------------------- in-process server: keepalive, shutdown


@pytest.fixture
def inproc(tmp_path):
    from test_grpc import _InProcessGrpc

    servers = []

    def make(**settings):
        srv = _InProcessGrpc(tmp_path, server_library="native", **settings)
        servers.append(srv)
        return srv

    yield make
    for srv in servers:
        srv.close()


def test_keepalive_pings_and_closes_a_silent_peer(inproc):
    srv = inproc(keepalive_time_ms=200, keepalive_timeout_ms=300, keepalive_permit_without_calls=True)
    c = RawClient(srv.port)
    try:
        start = time.time()
        got_ping = False
        with pytest.raises(ConnectionError):
            while time.time() - start < 5:
                kind, flags, sid, payload = c.read_frame(5)
                if kind == PING and not flags & ACK:
                    got_ping = True  # and never answer it
        assert got_ping
        assert time.time() - start < 3
    finally:
        c.close()


def test_no_keepalive_pings_without_calls_by_default(inproc):
    srv = inproc(keepalive_time_ms=100, keepalive_timeout_ms=100)
    c = RawClient(srv.port)
    try:
        c.send(frame(PING, 0, 0, b"abcdefgh"))
        end = time.time() + 0.6
        while time.time() < end:
            try:
                kind, flags, sid, payload = c.read_frame(max(0.01, end - time.time()))
            except socket.timeout:
                break
            assert not (kind == PING and not flags & ACK), "server pinged with no call in flight"
    finally:
        c.close()


def test_graceful_stop_sends_goaway(inproc):
    import asyncio

    srv = inproc()
    c = RawClient(srv.port)
    try:
        c.request(1, LIVE, grpc_message(tc_pb.ServerLiveRequest()))
        assert c.call(1)[2]["grpc-status"] == "0"
        asyncio.run_coroutine_threadsafe(srv.transport.stop(), srv.loop).result(10)
        kinds = []
        with pytest.raises(ConnectionError):
            while True:
                kinds.append(c.read_frame(5)[0])
        assert GOAWAY in kinds
    finally:
        c.close()
