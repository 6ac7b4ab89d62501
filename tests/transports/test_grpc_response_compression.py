"""--grpc-infer-response-compression-level (issue 25, part 3), on each of the three gRPC servers.

What tritonserver 2.51 sends, read frame by frame from it (see transports/grpc/compression.py):
the level picks gzip or deflate among the algorithms of the client's grpc-accept-encoding (both
accepted: gzip at low, deflate at medium and high; none accepted: identity, no grpc-encoding);
only ModelInfer and ModelStreamInfer answers are compressed; a message goes compressed (flag 1)
only when that makes it smaller, under the grpc-encoding header either way; the compressed bytes
are zlib's at its default level. The tests read the raw frames (h2) and check what tritonclient
(sync and asyncio, with and without request compression) makes of them.
"""

from __future__ import annotations

import asyncio
import queue
import shutil
import socket
import struct
import threading
import time
import zlib

import h2.config
import h2.connection
import h2.events
import h2.settings
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as aioclient
from tritonclient.grpc import service_pb2 as pb

from conftest import EXAMPLES, TEST_MODELS, KernelProcess, free_ports, running

SERVICE = "/inference.GRPCInferenceService/"
LIBRARIES = ["native", "grpcio", "grpclib"]
FLAG = "--grpc-infer-response-compression-level"


@pytest.fixture(scope="module")
def repo(tmp_path_factory):
    """add_sub, an FP32 identity model (OUT = IN, any length) and a decoupled one (repeat_int32)."""
    root = tmp_path_factory.mktemp("compression_repo")
    shutil.copytree(EXAMPLES / "add_sub", root / "add_sub")
    shutil.copytree(TEST_MODELS / "handover" / "identity", root / "identity")
    shutil.copytree(TEST_MODELS / "good" / "repeat_int32", root / "repeat_int32")
    return root


@pytest.fixture(scope="module", params=LIBRARIES)
def high(request, repo):
    """A server per gRPC library at level high (spelt in capitals: tritonserver reads any case)."""
    yield from running(KernelProcess([repo], "--grpc-server", request.param, f"{FLAG}=HIGH"))


@pytest.fixture(scope="module")
def servers(repo):
    """Kernel's own server at each level (the default server stands for `none`)."""
    procs = {"default": KernelProcess([repo])}
    for level in ("none", "low", "medium"):
        procs[level] = KernelProcess([repo], FLAG, level)
    try:
        for k in procs.values():
            k.wait_ready()
        yield procs
    finally:
        for k in procs.values():
            k.stop()


# ---- raw frames ---------------------------------------------------------------------------------


def call(port: int, rpc: str, messages: list[bytes], accept=None, timeout: float = 60.0):
    """One gRPC call over a fresh connection, written with h2: (response headers, trailers,
    [(compressed flag, message bytes as sent)]). `accept`: the grpc-accept-encoding to send."""
    conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True, header_encoding="utf-8"))
    sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    try:
        conn.initiate_connection()
        conn.update_settings({h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: (1 << 31) - 1})
        conn.increment_flow_control_window((1 << 31) - 1 - 65535)
        extra = [] if accept is None else [("grpc-accept-encoding", accept)]
        sid = conn.get_next_available_stream_id()
        conn.send_headers(sid, [(":method", "POST"), (":scheme", "http"), (":path", SERVICE + rpc),
                                (":authority", "localhost"), ("content-type", "application/grpc"),
                                ("te", "trailers"), *extra])
        body = b"".join(b"\x00" + struct.pack(">L", len(m)) + m for m in messages)
        sock.sendall(conn.data_to_send())
        pos = 0
        headers, trailers, data = {}, {}, bytearray()
        deadline = time.monotonic() + timeout
        ended = False
        while not ended and time.monotonic() < deadline:
            if pos < len(body):
                room = min(conn.local_flow_control_window(sid), conn.max_outbound_frame_size, len(body) - pos)
                if room > 0:
                    conn.send_data(sid, body[pos:pos + room], end_stream=pos + room == len(body))
                    pos += room
                    sock.sendall(conn.data_to_send())
                    continue
            chunk = sock.recv(1 << 20)
            if not chunk:
                break
            for event in conn.receive_data(chunk):
                if isinstance(event, h2.events.ResponseReceived):
                    headers = dict(event.headers)
                elif isinstance(event, h2.events.TrailersReceived):
                    trailers = dict(event.headers)
                elif isinstance(event, h2.events.DataReceived):
                    data += event.data
                    conn.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
                elif isinstance(event, (h2.events.StreamEnded, h2.events.StreamReset)):
                    ended = True
            sock.sendall(conn.data_to_send())
        assert ended, f"the call did not end (headers {headers})"
    finally:
        sock.close()
    out, at = [], 0
    while at < len(data):
        n = struct.unpack(">L", data[at + 1:at + 5])[0]
        out.append((data[at], bytes(data[at + 5:at + 5 + n])))
        at += 5 + n
    return headers, trailers, out


def add_sub_request() -> bytes:
    r = pb.ModelInferRequest(model_name="add_sub")
    for name in ("INPUT0", "INPUT1"):
        t = r.inputs.add(name=name, datatype="FP32", shape=[4])
        r.raw_input_contents.append(np.arange(4, dtype=np.float32).tobytes())
    return r.SerializeToString()


def identity_request(data: np.ndarray, request_id: str = "") -> bytes:
    r = pb.ModelInferRequest(model_name="identity", id=request_id)
    r.inputs.add(name="IN", datatype="FP32", shape=[data.size])
    r.raw_input_contents.append(data.tobytes())
    return r.SerializeToString()


def inflate(algorithm: str, flag: int, body: bytes) -> bytes:
    if not flag:
        return body
    return zlib.decompress(body, 16 + zlib.MAX_WBITS if algorithm == "gzip" else zlib.MAX_WBITS)


def zlib_default(algorithm: str, plain: bytes) -> bytes:
    deflater = zlib.compressobj(6, zlib.DEFLATED, 16 + zlib.MAX_WBITS if algorithm == "gzip" else zlib.MAX_WBITS)
    return deflater.compress(plain) + deflater.flush()


# tritonserver 2.51's choice per level and grpc-accept-encoding (None: no grpc-encoding header).
CHOICES = {
    None: {"none": None, "low": None, "medium": None, "high": None},
    "identity": {"none": None, "low": None, "medium": None, "high": None},
    "gzip": {"none": None, "low": "gzip", "medium": "gzip", "high": "gzip"},
    "deflate": {"none": None, "low": "deflate", "medium": "deflate", "high": "deflate"},
    "gzip,deflate": {"none": None, "low": "gzip", "medium": "deflate", "high": "deflate"},
    "identity, deflate, gzip": {"none": None, "low": "gzip", "medium": "deflate", "high": "deflate"},
    "snappy,gzip": {"none": None, "low": "gzip", "medium": "gzip", "high": "gzip"},
    "GZIP": {"none": None, "low": None, "medium": None, "high": None},  # names are exact
}


@pytest.mark.parametrize("accept", list(CHOICES), ids=str)
def test_each_level_picks_the_algorithm_grpc_core_picks(servers, high, accept):
    """The level chooses among what the client accepts; the answer still reads as add_sub's."""
    plain = None
    levels = {**servers, "high": high} if "native" in high.proc.args else {"high": high}
    for level, k in levels.items():
        expected = CHOICES[accept]["none" if level == "default" else level]
        headers, trailers, messages = call(k.grpc_port, "ModelInfer", [add_sub_request()], accept)
        assert trailers["grpc-status"] == "0"
        assert headers.get("grpc-encoding") == expected, (level, headers)
        [(flag, body)] = messages
        assert flag == (expected is not None), (level, flag)  # add_sub's 88 bytes deflate to 60-72
        answer = inflate(expected, flag, body)
        if plain is None:
            plain = answer
        assert answer == plain
        assert len(plain) == 88 and (not flag or body == zlib_default(expected, plain))
    np.testing.assert_array_equal(
        np.frombuffer(pb.ModelInferResponse.FromString(plain).raw_output_contents[0], np.float32),
        2 * np.arange(4, dtype=np.float32),
    )


def test_only_infer_answers_are_compressed(high):
    """As tritonserver: the other RPCs answer plainly (Kernel's own server and grpclib; grpcio
    compresses every answer, see grpcio_server.py), errors before a message name no encoding."""
    for rpc, message in (("ModelMetadata", pb.ModelMetadataRequest(name="identity")),
                         ("ModelConfig", pb.ModelConfigRequest(name="identity")),
                         ("ServerLive", pb.ServerLiveRequest())):
        headers, trailers, messages = call(high.grpc_port, rpc, [message.SerializeToString()], "gzip")
        assert trailers["grpc-status"] == "0"
        if "grpcio" in high.proc.args:
            assert headers.get("grpc-encoding") == "gzip"
        else:
            assert "grpc-encoding" not in headers and messages[0][0] == 0, (rpc, headers)
    missing = pb.ModelInferRequest(model_name="nosuch").SerializeToString()
    headers, trailers, messages = call(high.grpc_port, "ModelInfer", [missing], "gzip")
    status = {**headers, **trailers}
    assert status["grpc-status"] == "5" and "grpc-encoding" not in headers and not messages


@pytest.mark.parametrize("kind", ["incompressible", "tiny"])
def test_a_message_compression_would_not_shrink_goes_as_it_is(high, kind):
    """Flag 0 and the plain message, under the grpc-encoding header, as grpc C-core does."""
    if kind == "tiny":
        data = np.zeros(1, np.float32)
    else:  # random bits: deflate makes it larger; 64 KiB is over the size compressed on the loop
        data = np.random.default_rng(7).integers(0, 2**32, 16384, dtype=np.uint32).view(np.float32)
    for rpc in ("ModelInfer", "ModelStreamInfer"):
        headers, trailers, messages = call(high.grpc_port, rpc, [identity_request(data)], "gzip")
        assert trailers["grpc-status"] == "0" and headers.get("grpc-encoding") == "gzip"
        [(flag, body)] = messages
        assert flag == 0
        answer = pb.ModelInferResponse.FromString(body) if rpc == "ModelInfer" else \
            pb.ModelStreamInferResponse.FromString(body).infer_response
        assert answer.raw_output_contents[0] == data.tobytes()


def test_stream_answers_are_compressed_each_and_in_order(high):
    """Small and large (deflated beside the loop) answers of one ModelStreamInfer call, each
    compressed on its own, come in the order of their requests."""
    sizes = [4, 1 << 20, 16, 300_000, 8, 2 << 20, 4]
    requests = [identity_request(np.full(n, i, np.float32), f"r{i}") for i, n in enumerate(sizes)]
    headers, trailers, messages = call(high.grpc_port, "ModelStreamInfer", requests, "deflate")
    assert trailers["grpc-status"] == "0" and headers.get("grpc-encoding") == "deflate"
    assert len(messages) == len(sizes)
    for i, (flag, body) in enumerate(messages):
        assert flag == 1
        answer = pb.ModelStreamInferResponse.FromString(inflate("deflate", flag, body)).infer_response
        assert answer.id == f"r{i}"
        assert answer.raw_output_contents[0] == np.full(sizes[i], i, np.float32).tobytes()


def test_decoupled_answers_are_compressed(high):
    """Each answer of a decoupled model is a message of its own under the call's grpc-encoding."""
    r = pb.ModelInferRequest(model_name="repeat_int32", id="d")
    r.inputs.add(name="IN", datatype="INT32", shape=[5])
    r.raw_input_contents.append(np.arange(5, dtype=np.int32).tobytes())
    headers, trailers, messages = call(high.grpc_port, "ModelStreamInfer", [r.SerializeToString()], "gzip")
    assert trailers["grpc-status"] == "0" and headers.get("grpc-encoding") == "gzip"
    assert len(messages) == 5
    for i, (flag, body) in enumerate(messages):
        answer = pb.ModelStreamInferResponse.FromString(inflate("gzip", flag, body)).infer_response
        assert flag == (len(zlib_default("gzip", inflate("gzip", flag, body))) < len(inflate("gzip", flag, body)))
        assert answer.id == "d" and np.frombuffer(answer.raw_output_contents[0], np.int32).tolist() == [i]


# ---- tritonclient -------------------------------------------------------------------------------


def identity_input(module, data: np.ndarray):
    t = module.InferInput("IN", [data.size], "FP32")
    t.set_data_from_numpy(data)
    return t


ANSWERS = {  # payloads of every size class: tiny, compressed on the loop, beside it, incompressible
    "add_sub": None,
    "zeros_16k": np.zeros(4096, np.float32),
    "ramp_4m": np.arange(1 << 20, dtype=np.float32),
    "noise_1m": np.random.default_rng(1).random(1 << 18, dtype=np.float32),
    "bits_256k": np.random.default_rng(2).integers(0, 2**32, 1 << 16, dtype=np.uint32).view(np.float32),
}


def check_answer(name: str, result) -> None:
    if name == "add_sub":
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), 2 * np.arange(4, dtype=np.float32))
        np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), np.zeros(4, np.float32))
    else:
        assert result.as_numpy("OUT").tobytes() == ANSWERS[name].tobytes()


def inputs_for(module, name: str) -> list:
    if name != "add_sub":
        return [identity_input(module, ANSWERS[name])]
    out = []
    for n in ("INPUT0", "INPUT1"):
        t = module.InferInput(n, [4], "FP32")
        t.set_data_from_numpy(np.arange(4, dtype=np.float32))
        out.append(t)
    return out


# grpclib reads no compressed requests at all (tests/hostile/test_grpc_compression.py).
WITH_REQUEST_COMPRESSION = [(library, algorithm) for library in LIBRARIES
                            for algorithm in (None, "gzip", "deflate") if library != "grpclib" or not algorithm]


@pytest.mark.parametrize("high, request_compression", WITH_REQUEST_COMPRESSION, indirect=["high"])
def test_tritonclient_reads_every_answer(high, request_compression):
    """Sync client: infer and stream_infer, each payload, with and without compressed requests."""
    client = grpcclient.InferenceServerClient(high.grpc_url)
    try:
        for name in ANSWERS:
            model = "add_sub" if name == "add_sub" else "identity"
            check_answer(name, client.infer(model, inputs_for(grpcclient, name),
                                            compression_algorithm=request_compression))
        results: queue.Queue = queue.Queue()
        client.start_stream(lambda result, error: results.put((result, error)),
                            compression_algorithm=request_compression)
        for name in ANSWERS:
            client.async_stream_infer("add_sub" if name == "add_sub" else "identity", inputs_for(grpcclient, name),
                                      request_id=name)
        for name in ANSWERS:
            result, error = results.get(timeout=60)
            assert error is None, error
            assert result.get_response().id == name  # in order
            check_answer(name, result)
        client.stop_stream()
    finally:
        client.close()


@pytest.mark.parametrize("high, request_compression", WITH_REQUEST_COMPRESSION, indirect=["high"])
def test_tritonclient_reads_decoupled_answers(high, request_compression):
    """A decoupled model's many answers per request (some sent together, some apart) and its empty
    final answer, each a compressed message of one ModelStreamInfer call, read by tritonclient."""
    values = np.arange(40, dtype=np.int32)
    delays = np.zeros(40, np.uint32)
    delays[::8] = 20  # answers come in several flushes
    results: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(high.grpc_url)
    try:
        client.start_stream(lambda result, error: results.put((result, error)),
                            compression_algorithm=request_compression)
        for request_id in ("a", "b"):
            inputs = [grpcclient.InferInput("IN", [40], "INT32"), grpcclient.InferInput("DELAY", [40], "UINT32")]
            inputs[0].set_data_from_numpy(values)
            inputs[1].set_data_from_numpy(delays)
            client.async_stream_infer("repeat_int32", inputs, request_id=request_id, enable_empty_final_response=True)
        got: dict = {"a": [], "b": []}
        finals = 0
        while finals < 2:
            result, error = results.get(timeout=60)
            assert error is None, error
            response = result.get_response()
            if response.parameters["triton_final_response"].bool_param:
                finals += 1
                assert not response.outputs
                continue
            got[response.id].append((int(result.as_numpy("IDX")[0]), int(result.as_numpy("OUT")[0])))
        client.stop_stream()
    finally:
        client.close()
    assert got["a"] == got["b"] == [(i, i) for i in range(40)]  # every answer, in order


@pytest.mark.parametrize("high, request_compression", [p for p in WITH_REQUEST_COMPRESSION if p[1] != "deflate"],
                         indirect=["high"])
def test_tritonclient_aio_reads_every_answer(high, request_compression):
    async def main():
        async with aioclient.InferenceServerClient(high.grpc_url) as client:
            for name in ANSWERS:
                model = "add_sub" if name == "add_sub" else "identity"
                check_answer(name, await client.infer(model, inputs_for(aioclient, name),
                                                      compression_algorithm=request_compression))

            async def requests():
                for name in ANSWERS:
                    yield {"model_name": "add_sub" if name == "add_sub" else "identity",
                           "inputs": inputs_for(aioclient, name), "request_id": name}

            seen = []
            async for result, error in client.stream_infer(requests(), compression_algorithm=request_compression):
                assert error is None, error
                name = result.get_response().id
                check_answer(name, result)
                seen.append(name)
            assert seen == list(ANSWERS)  # every answer, in order

    asyncio.run(main())


# Not grpcio: gRPC C-core compresses there, on the thread that runs the event loop (documented
# in grpcio_server.py; `kernel serve` warns when the flag is used with it).
@pytest.mark.parametrize("high", ["native", "grpclib"], indirect=True)
def test_large_answers_do_not_stop_other_clients(high):
    """A 16 MiB answer takes a second or more to deflate here; meanwhile other calls on other
    connections are answered (it is deflated beside the event loop)."""
    data = np.random.default_rng(3).random(4 << 20, dtype=np.float32)  # deflates slowly, to ~90%
    big_done = threading.Event()
    failures: list = []

    def big():
        client = grpcclient.InferenceServerClient(high.grpc_url)
        try:
            out = client.infer("identity", [identity_input(grpcclient, data)]).as_numpy("OUT")
            if out.tobytes() != data.tobytes():
                failures.append("the large answer came back different")
        except Exception as exc:  # noqa: BLE001 - reported by the assertion below
            failures.append(exc)
        finally:
            client.close()
            big_done.set()

    small = grpcclient.InferenceServerClient(high.grpc_url)
    small.infer("add_sub", inputs_for(grpcclient, "add_sub"))  # connected
    thread = threading.Thread(target=big)
    began = time.monotonic()
    thread.start()
    worst, calls = 0.0, 0
    try:
        while not big_done.is_set():
            t0 = time.monotonic()
            check_answer("add_sub", small.infer("add_sub", inputs_for(grpcclient, "add_sub")))
            worst = max(worst, time.monotonic() - t0)
            calls += 1
    finally:
        thread.join(120)
        small.close()
    big_s = time.monotonic() - began
    assert not failures, failures
    # Deflated on the loop, one add_sub call would wait about as long as the deflate, most of big_s.
    assert worst < big_s / 3, f"an add_sub call waited {worst:.2f}s of the large call's {big_s:.2f}s"
    assert calls >= 3


def test_request_decompression_limit_holds(high):
    """A compressed request that inflates past the limit is still refused (RESOURCE_EXHAUSTED;
    grpclib reads no compressed requests at all) with response compression on."""
    deflater = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    zeros = bytes(1 << 20)
    bomb = b"".join(deflater.compress(zeros) for _ in range(80)) + deflater.flush()  # 80 MiB > 64 MiB
    conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True, header_encoding="utf-8"))
    sock = socket.create_connection(("127.0.0.1", high.grpc_port), timeout=30)
    try:
        conn.initiate_connection()
        conn.send_headers(1, [(":method", "POST"), (":scheme", "http"), (":path", SERVICE + "ModelInfer"),
                              (":authority", "localhost"), ("content-type", "application/grpc"),
                              ("te", "trailers"), ("grpc-encoding", "gzip"), ("grpc-accept-encoding", "gzip")])
        message = b"\x01" + struct.pack(">L", len(bomb)) + bomb
        conn.send_data(1, message[:16384], end_stream=len(message) <= 16384)
        sock.sendall(conn.data_to_send())
        pos, fields = 16384, {}
        while "grpc-status" not in fields:
            if pos < len(message):
                room = min(conn.local_flow_control_window(1), conn.max_outbound_frame_size, len(message) - pos)
                if room > 0:
                    conn.send_data(1, message[pos:pos + room], end_stream=pos + room >= len(message))
                    pos += room
                    sock.sendall(conn.data_to_send())
                    continue
            chunk = sock.recv(1 << 16)
            assert chunk, f"connection closed without a status ({fields})"
            for event in conn.receive_data(chunk):
                if isinstance(event, (h2.events.ResponseReceived, h2.events.TrailersReceived)):
                    fields.update(dict(event.headers))
            sock.sendall(conn.data_to_send())
    finally:
        sock.close()
    if "grpclib" in high.proc.args:
        assert fields["grpc-status"] != "0"
    else:
        assert fields["grpc-status"] == "8", fields


# ---- PyTriton's TritonConfig --------------------------------------------------------------------


def doubled(requests):
    return [{"y": r["x"] * 2} for r in requests]


def test_triton_config_sets_the_level(tmp_path):
    """TritonConfig(grpc_infer_response_compression_level=...) reaches the server as the flag does."""
    from kernel.model_config import ModelConfig, Tensor
    from kernel.triton import Triton, TritonConfig

    http, grpc, metrics = free_ports(3)
    config = TritonConfig(http_port=http, grpc_port=grpc, metrics_port=metrics,
                          grpc_infer_response_compression_level="medium")
    with Triton(config=config, workspace=tmp_path / "ws") as triton:
        triton.bind("doubled", doubled, [Tensor(name="x", dtype=np.float32, shape=(-1,))],
                    [Tensor(name="y", dtype=np.float32, shape=(-1,))], config=ModelConfig(batching=False))
        triton.run()
        r = pb.ModelInferRequest(model_name="doubled")
        r.inputs.add(name="x", datatype="FP32", shape=[1024])
        r.raw_input_contents.append(np.ones(1024, np.float32).tobytes())
        headers, trailers, messages = call(grpc, "ModelInfer", [r.SerializeToString()], "gzip,deflate")
        assert trailers["grpc-status"] == "0" and headers.get("grpc-encoding") == "deflate"
        [(flag, body)] = messages
        answer = pb.ModelInferResponse.FromString(inflate("deflate", flag, body))
        assert flag == 1 and answer.raw_output_contents[0] == np.full(1024, 2, np.float32).tobytes()
