"""Hostile HTTP/2 against Kernel's own gRPC server (issue 14 items 5 and 6), frame by frame.

Each test writes the attack as raw frames (built by hand, headers with `hpack`: real
clients refuse to send most of these) to a real `kernel serve --grpc-server native`,
checks the HTTP/2 answer (GOAWAY or RST_STREAM and its error code), that the server's
memory stayed bounded and that a normal tritonclient ModelInfer still works.
Timeouts the command line does not set (handshake, idle) are tested on an
in-process server with short limits.
"""

from __future__ import annotations

import asyncio
import socket
import struct
import threading
import time
from pathlib import Path

import hpack
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.grpc import service_pb2 as tc_pb

from conftest import EXAMPLES, KernelProcess, running

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
DATA, HEADERS, PRIORITY, RST_STREAM, SETTINGS, PUSH_PROMISE, PING, GOAWAY, WINDOW_UPDATE, CONTINUATION = range(10)
END_STREAM, ACK, END_HEADERS, PADDED = 0x1, 0x1, 0x4, 0x8
NO_ERROR, PROTOCOL_ERROR, FLOW_CONTROL_ERROR, STREAM_CLOSED, REFUSED_STREAM, CANCEL = 0x0, 0x1, 0x3, 0x5, 0x7, 0x8
ENHANCE_YOUR_CALM = 0xB
SETTINGS_MAX_CONCURRENT_STREAMS, SETTINGS_MAX_HEADER_LIST_SIZE = 0x3, 0x6

INFER = "/inference.GRPCInferenceService/ModelInfer"
LIVE = "/inference.GRPCInferenceService/ServerLive"


def frame(kind: int, flags: int, stream_id: int, payload: bytes = b"") -> bytes:
    n = len(payload)
    return struct.pack(">HBBBL", n >> 8, n & 0xFF, kind, flags, stream_id) + payload


def grpc_message(msg) -> bytes:
    body = msg.SerializeToString()
    return b"\x00" + struct.pack(">L", len(body)) + body


def add_sub_request() -> "tc_pb.ModelInferRequest":
    req = tc_pb.ModelInferRequest(model_name="add_sub")
    for name in ("INPUT0", "INPUT1"):
        t = req.inputs.add()
        t.name, t.datatype = name, "FP32"
        t.shape.append(4)
        req.raw_input_contents.append(np.arange(4, dtype=np.float32).tobytes())
    return req


class Goaway(Exception):
    def __init__(self, last_stream_id: int, code: int, debug: bytes):
        super().__init__(f"GOAWAY code {code} last stream {last_stream_id} {debug!r}")
        self.code, self.last_stream_id, self.debug = code, last_stream_id, debug


class RawH2:
    """One connection: the preface and SETTINGS on open; frames written and read by hand."""

    def __init__(self, port: int, preface: bool = True):
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        self.encoder = hpack.Encoder()
        self.buf = b""
        self.settings: dict[int, int] = {}
        self.statuses: dict[int, int] = {}  # grpc-status of every call grpc_status() saw end
        if preface:
            self.send(PREFACE + frame(SETTINGS, 0, 0))

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def headers(self, stream_id: int, path: str = LIVE, extra=(), end_stream: bool = False) -> bytes:
        block = self.encoder.encode([(":method", "POST"), (":scheme", "http"), (":path", path),
                                     (":authority", "localhost"), ("content-type", "application/grpc"),
                                     ("te", "trailers"), *extra])
        return frame(HEADERS, END_HEADERS | (END_STREAM if end_stream else 0), stream_id, block)

    def call(self, stream_id: int, path: str, message: bytes) -> bytes:
        return self.headers(stream_id, path) + frame(DATA, END_STREAM, stream_id, message)

    def read_frame(self, timeout: float = 10.0):
        """(kind, flags, stream id, payload); GOAWAY raises Goaway; ConnectionError once closed."""
        self.sock.settimeout(timeout)
        while len(self.buf) < 9 or len(self.buf) < 9 + int.from_bytes(self.buf[:3], "big"):
            chunk = self.sock.recv(1 << 20)
            if not chunk:
                raise ConnectionError("the server closed the connection")
            self.buf += chunk
        n = int.from_bytes(self.buf[:3], "big")
        kind, flags = self.buf[3], self.buf[4]
        stream_id = struct.unpack(">L", self.buf[5:9])[0] & 0x7FFFFFFF
        payload, self.buf = self.buf[9:9 + n], self.buf[9 + n:]
        if kind == SETTINGS and not flags & ACK:
            for off in range(0, len(payload), 6):
                key, value = struct.unpack(">HL", payload[off:off + 6])
                self.settings[key] = value
        if kind == GOAWAY:
            last, code = struct.unpack(">LL", payload[:8])
            raise Goaway(last & 0x7FFFFFFF, code, payload[8:])
        return kind, flags, stream_id, payload

    def wait_goaway(self, timeout: float = 20.0) -> Goaway:
        """Read until the server's GOAWAY (failing if the connection ends without one)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                self.read_frame(max(0.1, deadline - time.monotonic()))
            except Goaway as goaway:
                return goaway
        raise AssertionError("no GOAWAY")

    def wait_rst(self, stream_id: int, timeout: float = 10.0) -> int:
        """The error code of the server's RST_STREAM for `stream_id`."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            kind, _, sid, payload = self.read_frame(max(0.1, deadline - time.monotonic()))
            if kind == RST_STREAM and sid == stream_id:
                return struct.unpack(">L", payload)[0]
        raise AssertionError(f"no RST_STREAM for stream {stream_id}")

    def grpc_status(self, stream_id: int, timeout: float = 10.0) -> tuple[int, str]:
        """(grpc-status, grpc-message) of the call on `stream_id`."""
        decoder = hpack.Decoder()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            kind, flags, sid, payload = self.read_frame(max(0.1, deadline - time.monotonic()))
            if kind == HEADERS:
                fields = dict(decoder.decode(payload))
                if "grpc-status" in fields:
                    self.statuses[sid] = int(fields["grpc-status"])
                    if sid == stream_id:
                        return int(fields["grpc-status"]), fields.get("grpc-message", "")
        raise AssertionError(f"no grpc-status for stream {stream_id}")

    def closed_by_server(self, timeout: float = 10.0) -> bool:
        """Whether the server closes the connection within `timeout` (frames before that are skipped)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                self.read_frame(max(0.1, deadline - time.monotonic()))
            except Goaway:
                continue
            except (ConnectionError, OSError):
                return True
        return False

    def close(self) -> None:
        self.sock.close()


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS")


def assert_infer_works(grpc_url: str) -> None:
    """A normal tritonclient ModelInfer still gets its answer."""
    client = grpcclient.InferenceServerClient(grpc_url)
    try:
        a = np.arange(4, dtype=np.float32)
        inputs = [grpcclient.InferInput("INPUT0", [4], "FP32"), grpcclient.InferInput("INPUT1", [4], "FP32")]
        inputs[0].set_data_from_numpy(a)
        inputs[1].set_data_from_numpy(a)
        result = client.infer("add_sub", inputs, client_timeout=20)
        assert result.as_numpy("OUTPUT0").tolist() == (a + a).tolist()
    finally:
        client.close()


# ---------------------------------------------------------------- servers


@pytest.fixture(scope="module")
def native():
    yield from running(KernelProcess([EXAMPLES], "--grpc-server", "native"))


@pytest.fixture(scope="module")
def no_ping_strikes():
    """Ping policing off (tritonserver's --grpc-http2-max-ping-strikes 0): floods meet the output bound."""
    yield from running(KernelProcess([EXAMPLES], "--grpc-server", "native", "--grpc-http2-max-ping-strikes", "0"))


class InProcess:
    """Only the gRPC transport, with HTTP/2 limits the command line does not set, on a loop in a thread."""

    def __init__(self, repo: Path, **limits):
        from kernel.core.server import ServerOptions
        from kernel.serve.compose import compose_server
        from kernel.transports.grpc import GrpcTransport
        from kernel.transports.grpc.http2.limits import Http2Limits

        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.server = compose_server(ServerOptions(model_repositories=[repo]), {})
        age = limits.pop("max_connection_age_ms", None), limits.pop("max_connection_age_grace_ms", None)
        self.transport = GrpcTransport(self.server, "127.0.0.1", 0, server_library="native",
                                       http2=Http2Limits(**limits), max_connection_age_ms=age[0],
                                       max_connection_age_grace_ms=age[1])

        async def start():
            await self.server.start()
            return await self.transport.start()

        self.port = int(asyncio.run_coroutine_threadsafe(start(), self.loop).result(30).rsplit(":", 1)[1])

    def assert_live(self) -> None:
        client = grpcclient.InferenceServerClient(f"127.0.0.1:{self.port}")
        try:
            assert client.is_server_live(client_timeout=10)
        finally:
            client.close()

    def close(self) -> None:
        asyncio.run_coroutine_threadsafe(self.transport.stop(), self.loop).result(30)
        asyncio.run_coroutine_threadsafe(self.transport.close(), self.loop).result(30)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


@pytest.fixture
def inproc(tmp_path):
    servers = []

    def make(**limits) -> InProcess:
        servers.append(InProcess(tmp_path, **limits))
        return servers[-1]

    yield make
    for srv in servers:
        srv.close()


class Bounded:
    """Server RSS before and after an attack; afterwards a normal infer must still work."""

    def __init__(self, server, limit_mb: float):
        self.server, self.limit_mb = server, limit_mb

    def __enter__(self):
        self.before = rss_mb(self.server.proc.pid)
        return self

    def __exit__(self, *exc):
        if exc[0] is None:
            grown = rss_mb(self.server.proc.pid) - self.before
            assert grown < self.limit_mb, f"server RSS grew {grown:.0f} MB"
            assert_infer_works(self.server.grpc_url)


# ---------------------------------------------------------------- headers (item 5)


def test_advertised_limits(native):
    c = RawH2(native.grpc_port)
    try:
        c.send(c.call(1, LIVE, grpc_message(tc_pb.ServerLiveRequest())))
        assert c.grpc_status(1) == (0, "")
        assert c.settings[SETTINGS_MAX_CONCURRENT_STREAMS] == 256
        assert c.settings[SETTINGS_MAX_HEADER_LIST_SIZE] == 16 * 1024
    finally:
        c.close()


def test_header_block_over_the_hard_limit_gets_goaway(native):
    """Blocks of ~1 MiB were decoded and 256 of them cached per connection (+404 MB each)."""
    with Bounded(native, 40):
        for _ in range(8):
            c = RawH2(native.grpc_port)
            value = "v" * (1000 * 1024)
            block = c.encoder.encode([(":method", "POST"), (":path", LIVE), ("x-pad", value)], huffman=False)
            frames = frame(HEADERS, 0, 1, block[:16384])
            rest = block[16384:]
            while rest:
                part, rest = rest[:16384], rest[16384:]
                frames += frame(CONTINUATION, 0 if rest else END_HEADERS, 1, part)
            try:
                c.send(frames)
            except OSError:
                pass  # the server may close before it has read everything
            assert c.wait_goaway().code == ENHANCE_YOUR_CALM
            c.close()


def test_header_list_over_the_advertised_size_fails_the_call(native):
    c = RawH2(native.grpc_port)
    try:
        c.send(frame(HEADERS, END_HEADERS, 1, c.encoder.encode(
            [(":method", "POST"), (":scheme", "http"), (":path", LIVE), (":authority", "localhost"),
             ("content-type", "application/grpc"), ("x-pad", "v" * (20 * 1024))], huffman=False))
               + frame(DATA, END_STREAM, 1, grpc_message(tc_pb.ServerLiveRequest())))
        code, message = c.grpc_status(1)
        assert code == 8 and "header list" in message  # RESOURCE_EXHAUSTED
        c.send(c.call(3, LIVE, grpc_message(tc_pb.ServerLiveRequest())))  # the connection goes on
        assert c.grpc_status(3) == (0, "")
    finally:
        c.close()


def test_continuation_flood_gets_goaway(native):
    """Empty CONTINUATION frames never ended a header block (9.4 s of CPU in 10 s)."""
    with Bounded(native, 20):
        c = RawH2(native.grpc_port)
        try:
            c.send(frame(HEADERS, 0, 1, c.encoder.encode([(":method", "POST"), (":path", LIVE)])))
            try:
                c.send(frame(CONTINUATION, 0, 1) * 100_000)
            except OSError:
                pass
            assert c.wait_goaway().code == ENHANCE_YOUR_CALM
        finally:
            c.close()


# ---------------------------------------------------------------- streams, messages, windows (item 6)


def test_max_concurrent_streams_refuses_the_rest(native):
    """20,000 half-open streams were accepted; 2,000 of them holding 64 KiB each cost +121 MB."""
    with Bounded(native, 60):
        c = RawH2(native.grpc_port)
        try:
            partial = b"\x00" + struct.pack(">L", 1 << 20) + b"x" * (64 * 1024 - 5)
            out = b""
            for i in range(300):
                out += c.headers(2 * i + 1, INFER) + frame(DATA, 0, 2 * i + 1, partial)
            c.send(out)
            refused = set()
            deadline = time.monotonic() + 20
            while len(refused) < 300 - 256 and time.monotonic() < deadline:
                kind, _, sid, payload = c.read_frame()
                if kind == RST_STREAM:
                    assert struct.unpack(">L", payload)[0] == REFUSED_STREAM
                    refused.add(sid)
            assert refused == {2 * i + 1 for i in range(256, 300)}
        finally:
            c.close()


def test_four_gib_length_prefix_refused_at_once(native):
    with Bounded(native, 20):
        c = RawH2(native.grpc_port)
        try:
            c.send(c.headers(1, INFER) + frame(DATA, 0, 1, b"\x00\xff\xff\xff\xff" + b"x" * 1024))
            code, message = c.grpc_status(1, timeout=5)
            assert code == 8 and "larger than max" in message  # RESOURCE_EXHAUSTED
        finally:
            c.close()


def test_unary_call_keeps_one_message(native):
    with Bounded(native, 20):
        c = RawH2(native.grpc_port)
        try:
            msg = grpc_message(tc_pb.ServerLiveRequest())
            c.send(c.headers(1, LIVE) + frame(DATA, 0, 1, msg * 100_000))
            assert c.grpc_status(1)[0] == 13  # INTERNAL: exactly one request message
        finally:
            c.close()


def test_data_past_the_window_is_a_flow_control_error(inproc):
    """200 MiB were buffered on one stream: the advertised windows were never enforced."""
    srv = inproc(initial_window=65_535)  # (frames may still be 1 MiB: one frame can pass the window)
    c = RawH2(srv.port)
    try:
        c.send(c.headers(1, INFER) + frame(DATA, 0, 1, b"\x00" + struct.pack(">L", 64 << 20))
               + frame(DATA, 0, 1, b"x" * 200_000))
        codes = set()
        deadline = time.monotonic() + 10
        while not codes and time.monotonic() < deadline:
            try:
                kind, _, _, payload = c.read_frame()
                if kind == RST_STREAM:
                    codes.add(struct.unpack(">L", payload)[0])
            except Goaway as goaway:
                codes.add(goaway.code)
        assert codes == {FLOW_CONTROL_ERROR}
    finally:
        c.close()
    srv.assert_live()


# ---------------------------------------------------------------- floods


def test_ping_flood_gets_goaway(native):
    with Bounded(native, 20):
        c = RawH2(native.grpc_port)
        try:
            c.send(frame(PING, 0, 0, b"12345678") * 10)
            goaway = c.wait_goaway()
            assert goaway.code == ENHANCE_YOUR_CALM and goaway.debug == b"too_many_pings"
        finally:
            c.close()


def test_settings_flood_gets_goaway(native):
    with Bounded(native, 20):
        c = RawH2(native.grpc_port)
        try:
            c.send(frame(SETTINGS, 0, 0) * 10_000)
            assert c.wait_goaway().code == ENHANCE_YOUR_CALM
        finally:
            c.close()


def _flood_without_reading(sock: socket.socket, payload: bytes, limit_bytes: int, seconds: float) -> int:
    """Send `payload` over and over, never reading, until the server stops taking it; bytes sent."""
    sock.settimeout(0.5)
    sent = 0
    deadline = time.monotonic() + seconds
    try:
        while sent < limit_bytes and time.monotonic() < deadline:
            sent += sock.send(payload)
    except (socket.timeout, OSError):
        pass
    return sent


@pytest.mark.parametrize("kind", [PING, SETTINGS])
def test_flood_from_a_client_that_never_reads(no_ping_strikes, kind):
    """PING/SETTINGS acknowledgements queued for a client that never reads grew memory without end."""
    with Bounded(no_ping_strikes, 60):
        c = RawH2(no_ping_strikes.grpc_port)
        try:
            payload = (frame(PING, 0, 0, b"12345678") if kind == PING else frame(SETTINGS, 0, 0)) * 4096
            sent = _flood_without_reading(c.sock, payload, 200 << 20, 15)
            assert sent < 200 << 20, "the server kept reading a client that never reads"
            try:
                assert c.wait_goaway().code == ENHANCE_YOUR_CALM
            except (ConnectionError, OSError):
                pass  # dropped after the GOAWAY went unread: also an answer
            assert c.closed_by_server(), "the connection stayed open"
        finally:
            c.close()


def _executions(grpc_url: str) -> int:
    client = grpcclient.InferenceServerClient(grpc_url)
    try:
        stats = client.get_inference_statistics("add_sub", as_json=True)
        return int(stats["model_stats"][0].get("execution_count", 0))
    finally:
        client.close()


def test_rapid_reset_gets_goaway_and_runs_nothing(native):
    """HEADERS+DATA+RST_STREAM (CVE-2023-44487): 20,000 streams were all executed on the model."""
    before = _executions(native.grpc_url)
    with Bounded(native, 60):
        c = RawH2(native.grpc_port)
        try:
            msg = grpc_message(add_sub_request())
            out = []
            for i in range(20_000):
                sid = 2 * i + 1  # (after the first, each header block is a few bytes from the HPACK table)
                out.append(c.headers(sid, INFER) + frame(DATA, END_STREAM, sid, msg)
                           + frame(RST_STREAM, 0, sid, struct.pack(">L", CANCEL)))
            data = b"".join(out)
            try:
                for off in range(0, len(data), 1 << 20):
                    c.send(data[off:off + (1 << 20)])
            except OSError:
                pass  # closed after the GOAWAY
            assert c.wait_goaway().code == ENHANCE_YOUR_CALM
        finally:
            c.close()
    ran = _executions(native.grpc_url) - before - 1  # (Bounded ran one infer)
    assert ran < 100, f"{ran} reset requests were executed"


# ---------------------------------------------------------------- protocol errors (RFC 9113)


def test_spec_deviations(native):
    live = grpc_message(tc_pb.ServerLiveRequest())
    with Bounded(native, 20):
        # stream WINDOW_UPDATE that overflows the window: FLOW_CONTROL_ERROR; zero increment: PROTOCOL_ERROR
        c = RawH2(native.grpc_port)
        c.send(c.headers(1, LIVE) + frame(WINDOW_UPDATE, 0, 1, struct.pack(">L", 2**31 - 1)))
        assert c.wait_rst(1) == FLOW_CONTROL_ERROR
        c.send(c.headers(3, LIVE) + frame(WINDOW_UPDATE, 0, 3, struct.pack(">L", 0)))
        assert c.wait_rst(3) == PROTOCOL_ERROR
        # HEADERS on a closed stream: STREAM_CLOSED
        c.send(c.call(5, LIVE, live))
        assert c.grpc_status(5) == (0, "")
        c.send(c.headers(5, LIVE))
        assert c.wait_rst(5) == STREAM_CLOSED
        # connection WINDOW_UPDATE of zero: PROTOCOL_ERROR for the connection
        c.send(frame(WINDOW_UPDATE, 0, 0, struct.pack(">L", 0)))
        assert c.wait_goaway().code == PROTOCOL_ERROR
        c.close()
        # RST_STREAM on an idle stream
        c = RawH2(native.grpc_port)
        c.send(frame(RST_STREAM, 0, 99, struct.pack(">L", CANCEL)))
        assert c.wait_goaway().code == PROTOCOL_ERROR
        c.close()
        # a new stream id lower than an earlier one
        c = RawH2(native.grpc_port)
        c.send(c.call(7, LIVE, live))
        assert c.grpc_status(7) == (0, "")
        c.send(c.call(3, LIVE, live))
        assert c.wait_goaway().code == PROTOCOL_ERROR
        c.close()


# ---------------------------------------------------------------- timeouts


def test_connection_without_preface_is_closed(inproc):
    srv = inproc(handshake_timeout=0.5)
    silent = socket.create_connection(("127.0.0.1", srv.port), timeout=10)
    half = socket.create_connection(("127.0.0.1", srv.port), timeout=10)
    try:
        half.sendall(PREFACE[:10])
        start = time.monotonic()
        for sock in (silent, half):
            assert sock.recv(1 << 16) is not None  # (the server's SETTINGS, or the close)
            while sock.recv(1 << 16):
                pass
        assert time.monotonic() - start < 5
    finally:
        silent.close()
        half.close()
    srv.assert_live()


def test_idle_connection_gets_goaway(inproc):
    srv = inproc(idle_timeout=0.5)
    c = RawH2(srv.port)
    try:
        c.send(c.call(1, LIVE, grpc_message(tc_pb.ServerLiveRequest())))
        assert c.grpc_status(1) == (0, "")
        assert c.wait_goaway(timeout=5).code == NO_ERROR
        assert c.closed_by_server()
    finally:
        c.close()
    srv.assert_live()


def test_max_connection_age_and_grace(inproc):
    srv = inproc(max_connection_age_ms=300, max_connection_age_grace_ms=300)
    c = RawH2(srv.port)
    try:
        c.send(c.headers(1, LIVE))  # a call that never sends its request
        goaway = c.wait_goaway(timeout=5)
        assert goaway.code == NO_ERROR and goaway.last_stream_id == 1
        assert c.closed_by_server(5)
    finally:
        c.close()
    srv.assert_live()


def test_command_line_sets_ping_policing_and_connection_age():
    from kernel.serve.cli import build_parser
    from kernel.transports.grpc import GrpcOptions

    args = build_parser().parse_args([
        "serve", "--model-repository", "/tmp", "--grpc-http2-max-ping-strikes", "5",
        "--grpc-http2-min-recv-ping-interval-without-data", "1000", "--grpc-max-connection-age", "60000",
        "--grpc-max-connection-age-grace", "5000",
    ])
    limits = GrpcOptions.from_args(args).http2_limits()
    assert (limits.max_ping_strikes, limits.min_recv_ping_interval_without_data) == (5, 1.0)
    assert (limits.max_connection_age, limits.max_connection_age_grace) == (60.0, 5.0)


@pytest.mark.parametrize("flood", ["empty DATA", "PRIORITY", "unknown type"])
def test_frames_that_do_nothing_get_goaway(native, flood):
    """Empty DATA / PRIORITY / unknown frames cost work and answer nothing (CVE-2019-9518)."""
    with Bounded(native, 20):
        c = RawH2(native.grpc_port)
        try:
            one = {"empty DATA": frame(DATA, 0, 1), "PRIORITY": frame(PRIORITY, 0, 1, bytes(5)),
                   "unknown type": frame(0x42, 0, 0, b"x")}[flood]
            c.send(c.headers(1, LIVE))
            try:
                c.send(one * 50_000)
            except OSError:
                pass
            goaway = c.wait_goaway()
            assert goaway.code == ENHANCE_YOUR_CALM and goaway.debug == b"flood"
        finally:
            c.close()


def test_partial_messages_per_connection_are_bounded(native):
    """Partial messages on one connection hold at most 1 GiB (one message alone up to the message limit)."""
    with Bounded(native, 20):
        c = RawH2(native.grpc_port)
        try:
            start = b"\x00" + struct.pack(">L", 600 << 20) + b"x" * 1024  # 600 MiB announced, 1 KiB sent
            c.send(c.headers(1, INFER) + frame(DATA, 0, 1, start))
            c.send(c.headers(3, INFER) + frame(DATA, 0, 3, start))
            code, message = c.grpc_status(3, timeout=5)
            assert code == 8 and "on this connection" in message  # RESOURCE_EXHAUSTED
            c.send(frame(RST_STREAM, 0, 1, struct.pack(">L", CANCEL)))  # frees what stream 1 held
            c.send(c.headers(5, INFER) + frame(DATA, 0, 5, start))
            c.send(c.call(7, LIVE, grpc_message(tc_pb.ServerLiveRequest())))
            assert c.grpc_status(7) == (0, "")
            assert 5 not in c.statuses  # admitted: it is still waiting for the rest of its message
        finally:
            c.close()
