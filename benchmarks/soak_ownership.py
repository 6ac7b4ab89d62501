"""The soak's ownership loops (issue 23): every answer is the client's own, and slow clients are bounded.

benchmarks/soak.py runs these beside its mixed load when given --ownership:

- buffer-reusing models (benchmarks/model_repo_soak): `reuse_sender` answers every request of a
  dynamic batch through its response sender from one reused buffer; `reuse_stream` refills one
  1 MiB buffer on a thread and sends it four times per request; `identity_keep` returns its input
  and zeroes the array it kept when the next request comes. Each client sends its own values and
  checks every byte of what comes back: a wrong answer is counted as one, never as an error;
- slow readers: raw HTTP/1.1 sockets and raw HTTP/2 connections with a zero receive window ask
  `make_big` for 32 MiB answers and never read them; the server must cut them once the stall
  timeout passes (counted "cut", expected), and a slow-but-steady reader must get every byte;
- stalled uploads: an HTTP body and a gRPC message sent half-way, then nothing: cut after the
  body / stall timeout.

Everything here speaks to the server over loopback; nothing imports Kernel.
"""

from __future__ import annotations

import asyncio
import random
import socket
import struct
import time

import numpy as np

# ---------------------------------------------------------------------------- HTTP/1.1 by hand


def http_request(path: str, body: bytes, headers: dict[str, str] | None = None, length: int | None = None) -> bytes:
    head = [f"POST {path} HTTP/1.1", "Host: soak", f"Content-Length: {len(body) if length is None else length}"]
    head += [f"{k}: {v}" for k, v in (headers or {}).items()]
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body


def make_big_body(n: int, seed: int) -> tuple[bytes, dict[str, str]]:
    """A KServe binary-data request for make_big: a JSON header and two 8-byte inputs."""
    header = (b'{"inputs":[{"name":"N","shape":[1],"datatype":"INT64","parameters":{"binary_data_size":8}},'
              b'{"name":"SEED","shape":[1],"datatype":"INT64","parameters":{"binary_data_size":8}}],'
              b'"outputs":[{"name":"OUT","parameters":{"binary_data":true}}]}')
    return header + struct.pack("<qq", n, seed), {"Inference-Header-Content-Length": str(len(header))}


def read_http_response(sock: socket.socket, deadline: float, pace_bytes_s: float = 0.0) -> tuple[int, dict, bytes]:
    """Status, headers and body of one response (Content-Length framed), read at `pace_bytes_s` if given."""
    buf = b""
    while b"\r\n\r\n" not in buf:
        sock.settimeout(max(0.1, deadline - time.monotonic()))
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError("closed before the headers")
        buf += chunk
    head, rest = buf.split(b"\r\n\r\n", 1)
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    headers = {k.strip().lower(): v.strip() for k, v in (ln.split(":", 1) for ln in lines[1:])}
    length = int(headers.get("content-length", "0"))
    body = bytearray(rest)
    step = 65536
    while len(body) < length:
        if time.monotonic() > deadline:
            raise TimeoutError(f"read {len(body)} of {length} bytes in time")
        sock.settimeout(max(0.1, deadline - time.monotonic()))
        chunk = sock.recv(min(step, length - len(body)))
        if not chunk:
            raise ConnectionError(f"closed after {len(body)} of {length} bytes")
        body += chunk
        if pace_bytes_s:
            time.sleep(len(chunk) / pace_bytes_s)
    return status, headers, bytes(body)


def never_read(port: int, request: bytes, stall_s: float) -> str:
    """Send `request` on a socket with a tiny receive buffer, read nothing while the stall timeout
    runs out, then read: the server must have cut us (EOF or a reset before the whole answer came)."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            s.sendall(request)
            time.sleep(stall_s + 5)
            status, _, data = read_http_response(s, time.monotonic() + 120)
    except TimeoutError:
        return "HELD PAST THE STALL TIMEOUT (neither cut nor delivered)"
    except OSError:  # EOF or a reset
        return "cut (expected)"
    if status != 200:
        return f"{status} {data[:120].decode('latin-1')}"
    return "HELD PAST THE STALL TIMEOUT"


def binary_output(headers: dict, body: bytes) -> bytes:
    json_len = int(headers.get("inference-header-content-length", len(body)))
    return body[json_len:]


# ---------------------------------------------------------------------------- HTTP/2 by hand

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
DATA, HEADERS, RST_STREAM, SETTINGS, PING, GOAWAY, WINDOW_UPDATE = 0, 1, 3, 4, 6, 7, 8


def h2_frame(kind: int, flags: int, stream: int, payload: bytes = b"") -> bytes:
    return struct.pack(">I", len(payload))[1:] + bytes((kind, flags)) + struct.pack(">I", stream) + payload


def grpc_infer_message(model: str, inputs: list[tuple[str, str, list[int], bytes]]) -> bytes:
    """A length-prefixed ModelInferRequest (protobuf from tritonclient's generated classes)."""
    from tritonclient.grpc import service_pb2

    req = service_pb2.ModelInferRequest(model_name=model)
    for name, datatype, shape, raw in inputs:
        t = req.inputs.add()
        t.name, t.datatype = name, datatype
        t.shape.extend(shape)
        req.raw_input_contents.append(raw)
    msg = req.SerializeToString()
    return b"\0" + struct.pack(">I", len(msg)) + msg


def grpc_headers(port: int) -> bytes:
    import hpack

    return hpack.Encoder().encode([
        (":method", "POST"), (":scheme", "http"), (":path", "/inference.GRPCInferenceService/ModelInfer"),
        (":authority", f"127.0.0.1:{port}"), ("content-type", "application/grpc"), ("te", "trailers"),
    ])


class H2Outcome:
    """What became of a raw HTTP/2 connection the server was expected to cut."""

    def __init__(self) -> None:
        self.resets = 0
        self.ended = 0  # streams the server ended with trailers (a gRPC status, e.g. RESOURCE_EXHAUSTED)
        self.goaway = False
        self.closed = False

    def cut(self, streams: int) -> bool:
        return self.goaway or self.closed or self.resets + self.ended >= streams


def watch_h2(sock: socket.socket, deadline: float, streams: int) -> H2Outcome:
    """Read frames (never granting window) until every stream is reset or ended, GOAWAY, close, or the deadline.

    A stream the server gives up on may end with trailers (HEADERS with END_STREAM) rather than
    RST_STREAM: with a zero window no DATA can precede them, so an END_STREAM HEADERS frame here is
    always a trailers-only end, the status the server chose (HPACK hides its text)."""
    out = H2Outcome()
    buf = b""
    while time.monotonic() < deadline:
        sock.settimeout(max(0.1, min(1.0, deadline - time.monotonic())))
        try:
            chunk = sock.recv(65536)
        except socket.timeout:
            continue
        except OSError:
            out.closed = True
            return out
        if not chunk:
            out.closed = True
            return out
        buf += chunk
        while len(buf) >= 9:
            n = int.from_bytes(buf[:3], "big")
            if len(buf) < 9 + n:
                break
            kind = buf[3]
            if kind == RST_STREAM:
                out.resets += 1
            elif kind == GOAWAY:
                out.goaway = True
            elif kind == HEADERS and buf[4] & 1:
                out.ended += 1
            buf = buf[9 + n:]
        if out.cut(streams):
            return out
    return out


# ---------------------------------------------------------------------------- the loops


class Ownership:
    """The issue-23 loops; `soak` is the Soak (its ledger, running(), ports)."""

    def __init__(self, soak, stall_timeout_s: float, body_timeout_s: float):
        self.soak = soak
        self.stall_s = stall_timeout_s
        self.body_s = body_timeout_s

    def tasks(self) -> list:
        out = [self.reuse_sender_loop(i) for i in range(8)]
        out += [self.reuse_stream_loop(), self.identity_keep_loop(0), self.identity_keep_loop(1)]
        out += [self.slow_http_loop(), self.steady_reader_loop(), self.h2_zero_window_loop(), self.stalled_upload_loop()]
        return out

    async def _thread(self, fn, *args):
        return await asyncio.get_running_loop().run_in_executor(None, fn, *args)

    async def reuse_sender_loop(self, i: int) -> None:
        import tritonclient.grpc.aio as grpcclient
        from tritonclient.utils import InferenceServerException

        ledger = self.soak.ledger
        client = grpcclient.InferenceServerClient(self.soak.grpc)
        rng = np.random.default_rng(1000 + i)
        try:
            while self.soak.running():
                x = rng.integers(-2**40, 2**40, size=(1, 16), dtype=np.int64)
                t = grpcclient.InferInput("IN", [1, 16], "INT64")
                t.set_data_from_numpy(x)
                ledger.send("reuse_sender")
                try:
                    r = await client.infer("reuse_sender", [t], client_timeout=60)
                except InferenceServerException as exc:
                    ledger.answer("reuse_sender", f"error {exc.status()}", exc.message() or "")
                    continue
                ok = np.array_equal(r.as_numpy("OUT"), 2 * x + 1)
                ledger.answer("reuse_sender", "OK" if ok else "WRONG ANSWER")
        finally:
            await client.close()

    async def reuse_stream_loop(self) -> None:
        await self._thread(self._reuse_stream_thread)

    def _reuse_stream_thread(self) -> None:
        import queue

        import tritonclient.grpc as grpcclient

        ledger = self.soak.ledger
        client = grpcclient.InferenceServerClient(self.soak.grpc)
        answers: queue.Queue = queue.Queue()
        client.start_stream(callback=lambda result, error: answers.put((result, error)))
        v = 0
        try:
            while self.soak.running():
                v = (v + 1) % 100000
                t = grpcclient.InferInput("IN", [1], "INT32")
                t.set_data_from_numpy(np.array([v], np.int32))
                ledger.send("reuse_stream")
                client.async_stream_infer("reuse_stream", [t], request_id=str(v), enable_empty_final_response=True)
                got, verdict = [], None
                deadline = time.monotonic() + 60
                while verdict is None:
                    try:
                        result, error = answers.get(timeout=max(0.0, deadline - time.monotonic()))
                    except queue.Empty:
                        verdict = "LOST"
                        break
                    if error is not None:
                        verdict = f"error {error}"
                    elif result.get_response().parameters["triton_final_response"].bool_param:
                        expected = [np.full(1 << 18, v * 10 + i, np.int32) for i in range(4)]
                        right = len(got) == 4 and all(np.array_equal(a, b) for a, b in zip(got, expected))
                        verdict = "OK" if right else "WRONG ANSWER"
                    else:
                        got.append(result.as_numpy("OUT"))
                if verdict == "LOST":
                    ledger.lose("reuse_stream", "no final response in 60 s")
                else:
                    ledger.answer("reuse_stream", verdict.split(" ", 1)[0] if verdict.startswith("error") else verdict,
                                  verdict)
                if verdict != "OK":
                    client.stop_stream(cancel_requests=True)
                    answers = queue.Queue()
                    client.start_stream(callback=lambda result, error, q=answers: q.put((result, error)))
        finally:
            client.stop_stream(cancel_requests=True)
            client.close()

    async def identity_keep_loop(self, i: int) -> None:
        await self._thread(self._identity_keep_thread, i)

    def _identity_keep_thread(self, i: int) -> None:
        """4-8 MiB of random bytes through identity_keep; every other answer read after a pause."""
        ledger = self.soak.ledger
        rng = np.random.default_rng(2000 + i)
        k = 0
        while self.soak.running():
            k += 1
            n = int(rng.integers(4 << 20, 8 << 20))
            data = rng.integers(0, 256, n, dtype=np.uint8).tobytes()
            header = (b'{"inputs":[{"name":"IN","shape":[%d],"datatype":"UINT8","parameters":{"binary_data_size":%d}}],'
                      b'"outputs":[{"name":"OUT","parameters":{"binary_data":true}}]}' % (n, n))
            ledger.send("identity_keep")
            try:
                with socket.create_connection(("127.0.0.1", self.soak.http_port), timeout=60) as s:
                    s.sendall(http_request("/v2/models/identity_keep/infer", header + data,
                                           {"Inference-Header-Content-Length": str(len(header))}))
                    if k % 2:
                        time.sleep(1.0)  # the model meanwhile zeroes what it kept for the other client's request
                    status, headers, body = read_http_response(s, time.monotonic() + 60)
            except (OSError, TimeoutError, ConnectionError) as exc:
                ledger.lose("identity_keep", type(exc).__name__)
                continue
            if status != 200:
                ledger.answer("identity_keep", f"{status}", body[:160].decode("latin-1"))
            else:
                ledger.answer("identity_keep", "OK" if binary_output(headers, body) == data else "WRONG ANSWER")

    async def slow_http_loop(self) -> None:
        """Every 20 s, six HTTP clients ask for 32 MiB each and never read: each must be cut in time."""
        while self.soak.running():
            results = await asyncio.gather(*(self._thread(self._never_read_http, j) for j in range(6)))
            for verdict in results:
                self.soak.ledger.send("slow_reader")
                self.soak.ledger.answer("slow_reader", verdict)
            await asyncio.sleep(20)

    def _never_read_http(self, j: int) -> str:
        body, headers = make_big_body(32 << 20, j)
        return never_read(self.soak.http_port, http_request("/v2/models/make_big/infer", body, headers), self.stall_s)

    async def steady_reader_loop(self) -> None:
        """A reader that takes 8 MiB at 1 MiB/s must get every byte (steady is not stalled)."""
        while self.soak.running():
            self.soak.ledger.send("steady_reader")
            verdict = await self._thread(self._steady_read)
            if verdict.startswith("LOST"):
                self.soak.ledger.lose("steady_reader", verdict)
            else:
                self.soak.ledger.answer("steady_reader", verdict)
            await asyncio.sleep(5)

    def _steady_read(self) -> str:
        seed = random.randrange(1000)
        body, headers = make_big_body(8 << 20, seed)
        try:
            with socket.create_connection(("127.0.0.1", self.soak.http_port), timeout=10) as s:
                s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 65536)
                s.sendall(http_request("/v2/models/make_big/infer", body, headers))
                status, hdrs, data = read_http_response(s, time.monotonic() + 60, pace_bytes_s=1 << 20)
        except (OSError, TimeoutError, ConnectionError) as exc:
            return f"LOST {type(exc).__name__}: {exc}"
        if status != 200:
            return f"{status}"
        out = binary_output(hdrs, data)
        return "OK" if len(out) == 8 << 20 and out == bytes([seed % 251]) * (8 << 20) else "WRONG ANSWER"

    async def h2_zero_window_loop(self) -> None:
        """Every 30 s, one HTTP/2 connection with a zero window asks for 20 x 32 MiB: cut in time."""
        while self.soak.running():
            self.soak.ledger.send("h2_zero_window")
            self.soak.ledger.answer("h2_zero_window", await self._thread(self._h2_zero_window))
            await asyncio.sleep(30)

    def _h2_zero_window(self) -> str:
        port = self.soak.grpc_port
        streams = 20
        msg = grpc_infer_message("make_big", [("N", "INT64", [1], struct.pack("<q", 32 << 20)),
                                              ("SEED", "INT64", [1], struct.pack("<q", 7))])
        block = grpc_headers(port)
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
                # SETTINGS_INITIAL_WINDOW_SIZE = 0: no DATA may come our way until we say so (we never do).
                s.sendall(PREFACE + h2_frame(SETTINGS, 0, 0, struct.pack(">HI", 4, 0)))
                for k in range(streams):
                    sid = 1 + 2 * k
                    s.sendall(h2_frame(HEADERS, 0x4, sid, block) + h2_frame(DATA, 0x1, sid, msg))
                out = watch_h2(s, time.monotonic() + self.stall_s + 30, streams)
        except OSError as exc:
            return f"LOST {type(exc).__name__}"
        return "cut (expected)" if out.cut(streams) else "HELD PAST THE STALL TIMEOUT"

    async def stalled_upload_loop(self) -> None:
        """Every 30 s: an HTTP body and a gRPC message sent half-way, then nothing: each cut in time."""
        while self.soak.running():
            for name, fn in (("stalled_upload_http", self._stalled_http), ("stalled_upload_grpc", self._stalled_grpc)):
                self.soak.ledger.send(name)
                self.soak.ledger.answer(name, await self._thread(fn))
            await asyncio.sleep(30)

    def _stalled_http(self) -> str:
        try:
            with socket.create_connection(("127.0.0.1", self.soak.http_port), timeout=10) as s:
                s.sendall(http_request("/v2/models/identity_keep/infer", b"{" + b" " * (8 << 20), length=16 << 20))
                s.settimeout(self.body_s + 30)
                try:
                    first = s.recv(64)
                except socket.timeout:
                    return "HELD PAST THE BODY TIMEOUT"
                return "cut (expected)" if (not first or first.startswith(b"HTTP/1.1 408")) else first[:20].decode()
        except (ConnectionResetError, BrokenPipeError):
            return "cut (expected)"
        except OSError as exc:
            return f"LOST {type(exc).__name__}"

    def _stalled_grpc(self) -> str:
        port = self.soak.grpc_port
        msg = grpc_infer_message("identity_keep", [("IN", "UINT8", [16 << 20], b"\1" * (16 << 20))])
        part = 3 << 20  # within the initial 4 MiB stream window: nothing the server could call a flow-control error
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
                s.sendall(PREFACE + h2_frame(SETTINGS, 0, 0))
                s.sendall(h2_frame(HEADERS, 0x4, 1, grpc_headers(port)))
                sent = 0
                while sent < part:
                    piece = msg[sent:sent + 16384]
                    s.sendall(h2_frame(DATA, 0, 1, piece))
                    sent += len(piece)
                out = watch_h2(s, time.monotonic() + self.stall_s + 30, 1)
        except OSError as exc:
            return f"LOST {type(exc).__name__}"
        return "cut (expected)" if out.cut(1) else "HELD PAST THE STALL TIMEOUT"
