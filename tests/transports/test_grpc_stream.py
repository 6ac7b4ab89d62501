"""ModelStreamInfer with the real tritonclient.grpc streaming API against `kernel serve`."""

from __future__ import annotations

import asyncio
import queue
import threading
import time

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as aioclient
from tritonclient.grpc import service_pb2 as tc_pb
from tritonclient.grpc import service_pb2_grpc as tc_grpc
from tritonclient.utils import InferenceServerException


def _input(name, arr, datatype=None, mod=grpcclient):
    dt = datatype or {np.int32: "INT32", np.uint32: "UINT32", np.float32: "FP32"}[arr.dtype.type]
    t = mod.InferInput(name, list(arr.shape), dt)
    t.set_data_from_numpy(arr)
    return t


def _repeat_inputs(values, delays=None, mod=grpcclient):
    ins = [_input("IN", np.array(values, np.int32), mod=mod)]
    if delays is not None:
        ins.append(_input("DELAY", np.array(delays, np.uint32), mod=mod))
    return ins


class Stream:
    """A tritonclient stream whose callback results land in a queue."""

    def __init__(self, url, headers=None):
        self.client = grpcclient.InferenceServerClient(url)
        self.results: queue.Queue = queue.Queue()
        self.client.start_stream(callback=lambda result, error: self.results.put((result, error)), headers=headers)

    def send(self, model, inputs, **kw):
        self.client.async_stream_infer(model, inputs, **kw)

    def get(self, timeout=10.0):
        return self.results.get(timeout=timeout)

    def take(self, n, timeout=10.0):
        return [self.get(timeout) for _ in range(n)]

    def assert_quiet(self, seconds=0.3):
        with pytest.raises(queue.Empty):
            self.results.get(timeout=seconds)

    def close(self, cancel=False):
        self.client.stop_stream(cancel_requests=cancel)
        self.client.close()


@pytest.fixture
def stream(server):
    s = Stream(server.grpc_url)
    yield s
    s.close()


def _final_flag(result) -> bool:
    return result.get_response().parameters["triton_final_response"].bool_param


def test_decoupled_model_sends_many_responses(stream):
    stream.send("repeat_int32", _repeat_inputs([10, 20, 30]), request_id="r1")
    got = stream.take(3)
    assert [e for _, e in got] == [None, None, None]
    assert [int(r.as_numpy("OUT")[0]) for r, _ in got] == [10, 20, 30]
    assert [int(r.as_numpy("IDX")[0]) for r, _ in got] == [0, 1, 2]
    for r, _ in got:
        response = r.get_response()
        assert response.id == "r1"
        assert response.model_name == "repeat_int32"
        assert response.model_version == "1"
        assert _final_flag(r) is False
    stream.assert_quiet()  # the FINAL flag alone is not sent unless asked for


def test_empty_final_response_when_asked(stream):
    stream.send("repeat_int32", _repeat_inputs([1, 2]), request_id="r2", enable_empty_final_response=True)
    got = stream.take(3)
    assert [_final_flag(r) for r, _ in got] == [False, False, True]
    last = got[-1][0].get_response()
    assert last.id == "r2"
    assert last.model_name == "repeat_int32"
    assert len(last.outputs) == 0


def test_zero_responses_then_final(stream):
    stream.send("repeat_int32", _repeat_inputs([]), request_id="none", enable_empty_final_response=True)
    result, error = stream.get()
    assert error is None and _final_flag(result) is True and result.get_response().id == "none"


def test_ordinary_model_over_a_stream_keeps_request_order(stream):
    for i in range(50):
        a = np.full(4, i, np.float32)
        stream.send("add_sub", [_input("INPUT0", a), _input("INPUT1", a)], request_id=str(i))
    got = stream.take(50)
    assert [r.get_response().id for r, _ in got] == [str(i) for i in range(50)]
    for i, (r, e) in enumerate(got):
        assert e is None
        assert _final_flag(r) is True
        np.testing.assert_array_equal(r.as_numpy("OUTPUT0"), np.full(4, 2 * i, np.float32))


def test_invalid_requests_then_valid_ones_on_the_same_stream(stream):
    stream.send("no_such_model", _repeat_inputs([1]), request_id="bad-model")
    stream.send("repeat_int32", [_input("IN", np.array([1.0], np.float32))], request_id="bad-dtype")
    stream.send("repeat_int32", [_input("NOPE", np.array([1], np.int32))], request_id="bad-input")
    stream.send("repeat_int32", _repeat_inputs([7, 8]), request_id="good")
    got = stream.take(5)
    errors = [e for _, e in got if e is not None]
    results = [r for r, e in got if e is None]
    assert len(errors) == 3
    messages = sorted(e.message() for e in errors)
    assert any("Request for unknown model: 'no_such_model' is not found" in m for m in messages)
    assert any("data-type is 'FP32', but model 'repeat_int32' expects 'INT32'" in m for m in messages)
    assert any("unexpected inference input 'NOPE'" in m for m in messages)
    assert [int(r.as_numpy("OUT")[0]) for r in results] == [7, 8]


def test_garbage_then_valid_over_raw_stream(server):
    """Refused requests carry their id back in an error_message; the stream carries on."""
    channel = grpc.insecure_channel(server.grpc_url)
    stub = tc_grpc.GRPCInferenceServiceStub(channel)
    I = tc_pb.ModelInferRequest.InferInputTensor
    requests = [
        tc_pb.ModelInferRequest(model_name="", id="empty"),
        tc_pb.ModelInferRequest(model_name="repeat_int32", id="no-data", inputs=[I(name="IN", datatype="INT32", shape=[1])]),
        tc_pb.ModelInferRequest(model_name="repeat_int32", model_version="abc", id="bad-version"),
        tc_pb.ModelInferRequest(
            model_name="repeat_int32", id="ok", inputs=[I(name="IN", datatype="INT32", shape=[1])],
            raw_input_contents=[np.array([5], np.int32).tobytes()],
        ),
    ]
    try:
        replies = list(stub.ModelStreamInfer(iter(requests), timeout=10))
    finally:
        channel.close()
    errors = {r.infer_response.id: r.error_message for r in replies if r.error_message}
    assert set(errors) == {"empty", "no-data", "bad-version"}
    assert errors["no-data"] == "unable to find data for input tensor 'IN' for model 'repeat_int32' in request."
    assert "version should be an integral value > 0" in errors["bad-version"]
    ok = [r for r in replies if not r.error_message]
    assert len(ok) == 1 and ok[0].infer_response.id == "ok"
    assert ok[0].infer_response.raw_output_contents[0] == np.array([5], np.int32).tobytes()


def test_error_responses_in_stream_do_not_end_it(stream):
    stream.send("stream_error", [_input("IN", np.array([1, -2, 3], np.int32))], request_id="e1")
    got = stream.take(3)
    (r0, e0), (r1, e1), (r2, e2) = got
    assert e0 is None and int(r0.as_numpy("OUT")[0]) == 1
    assert isinstance(e1, InferenceServerException) and e1.message() == "negative value -2"
    assert e2 is None and int(r2.as_numpy("OUT")[0]) == 3
    stream.send("stream_error", [_input("IN", np.array([4], np.int32))], request_id="e2")
    r, e = stream.get()
    assert e is None and int(r.as_numpy("OUT")[0]) == 4


def test_model_raising_mid_stream(stream):
    stream.send("stream_error", [_input("IN", np.array([1, 2, -999], np.int32))], request_id="x1",
                enable_empty_final_response=True)
    got = stream.take(3)
    assert [e is None for _, e in got] == [True, True, False]
    assert "stream_error was told to fail" in got[2][1].message()
    stream.assert_quiet()  # the error was the final response
    stream.send("repeat_int32", _repeat_inputs([9]), request_id="after")
    r, e = stream.get()
    assert e is None and int(r.as_numpy("OUT")[0]) == 9


def test_error_response_carries_the_final_flag(server):
    channel = grpc.insecure_channel(server.grpc_url)
    stub = tc_grpc.GRPCInferenceServiceStub(channel)
    I = tc_pb.ModelInferRequest.InferInputTensor
    request = tc_pb.ModelInferRequest(
        model_name="stream_error", id="flags", inputs=[I(name="IN", datatype="INT32", shape=[2])],
        raw_input_contents=[np.array([-1, -999], np.int32).tobytes()],
    )
    try:
        replies = list(stub.ModelStreamInfer(iter([request]), timeout=10))
    finally:
        channel.close()
    assert [r.infer_response.parameters["triton_final_response"].bool_param for r in replies] == [False, True]
    assert all(r.error_message for r in replies)
    assert all(r.infer_response.id == "flags" and r.infer_response.model_name == "stream_error" for r in replies)


def test_triton_grpc_error_header_ends_the_stream_with_a_status(server):
    s = Stream(server.grpc_url, headers={"triton_grpc_error": "true"})
    try:
        s.send("stream_error", [_input("IN", np.array([1, -2, 3], np.int32))], request_id="g1")
        (r0, e0), (r1, e1) = s.take(2)
        assert e0 is None and int(r0.as_numpy("OUT")[0]) == 1
        assert e1.status() == "StatusCode.INTERNAL"
        assert "negative value -2" in e1.message()
        s.assert_quiet()
    finally:
        s.close()


def test_half_close_waits_for_every_response(server):
    s = Stream(server.grpc_url)
    s.send("repeat_int32", _repeat_inputs([1, 2, 3], delays=[100, 100, 100]), request_id="slow")
    s.close(cancel=False)  # waits for the server to finish the stream
    got = [s.results.get_nowait() for _ in range(3)]
    assert [int(r.as_numpy("OUT")[0]) for r, e in got] == [1, 2, 3]


def test_disconnect_mid_stream_cancels_only_that_client(server):
    a = Stream(server.grpc_url)
    b = Stream(server.grpc_url)
    n = 20
    try:
        a.send("repeat_int32", _repeat_inputs(list(range(n)), delays=[50] * n), request_id="client-a")
        b.send("repeat_int32", _repeat_inputs(list(range(n)), delays=[20] * n), request_id="client-b")
        a.take(2)
        a.close(cancel=True)
        got = b.take(n)
        assert [int(r.as_numpy("OUT")[0]) for r, e in got] == list(range(n))
        assert server.wait_for_log("request 'client-a' cancelled after", timeout=10)
        assert "request 'client-b' cancelled" not in server.log()
        b.send("repeat_int32", _repeat_inputs([42]), request_id="b-again")
        r, e = b.get()
        assert e is None and int(r.as_numpy("OUT")[0]) == 42
    finally:
        b.close()


def test_stream_timeout_cancels_requests(server):
    s = Stream.__new__(Stream)
    s.client = grpcclient.InferenceServerClient(server.grpc_url)
    s.results = queue.Queue()
    s.client.start_stream(callback=lambda result, error: s.results.put((result, error)), stream_timeout=1.0)
    try:
        s.send("repeat_int32", _repeat_inputs(list(range(10)), delays=[400] * 10), request_id="timed-out")
        deadline = time.time() + 10
        error = None
        while time.time() < deadline:
            r, e = s.get()
            if e is not None:
                error = e
                break
        assert error is not None and error.status() == "StatusCode.DEADLINE_EXCEEDED"
        assert server.wait_for_log("request 'timed-out' cancelled after", timeout=10)
    finally:
        s.close()


def test_many_streams_in_parallel(server):
    streams = [Stream(server.grpc_url) for _ in range(4)]
    try:
        for k, s in enumerate(streams):
            for j in range(5):
                s.send("repeat_int32", _repeat_inputs([k * 100 + j] * 3), request_id=f"{k}-{j}")
        for k, s in enumerate(streams):
            got = s.take(15)
            assert all(e is None for _, e in got)
            assert sorted(int(r.as_numpy("OUT")[0]) for r, _ in got) == sorted([k * 100 + j for j in range(5)] * 3)
    finally:
        for s in streams:
            s.close()


def test_aio_stream_infer(server):
    async def main():
        async with aioclient.InferenceServerClient(server.grpc_url) as c:
            async def requests():
                for i in range(3):
                    yield {
                        "model_name": "repeat_int32",
                        "inputs": _repeat_inputs([i, i + 10], mod=aioclient),
                        "request_id": f"aio-{i}",
                    }

            got = []
            async for result, error in c.stream_infer(requests()):
                assert error is None
                got.append(result)
                if len(got) == 6:
                    break
            by_id = {}
            for r in got:
                assert not _final_flag(r)
                by_id.setdefault(r.get_response().id, []).append(int(r.as_numpy("OUT")[0]))
            assert by_id == {f"aio-{i}": [i, i + 10] for i in range(3)}

    asyncio.run(main())


def test_server_survives_abrupt_stream_disconnects(server):
    for _ in range(5):
        channel = grpc.insecure_channel(server.grpc_url)
        stub = tc_grpc.GRPCInferenceServiceStub(channel)
        I = tc_pb.ModelInferRequest.InferInputTensor
        req = tc_pb.ModelInferRequest(
            model_name="repeat_int32", inputs=[I(name="IN", datatype="INT32", shape=[3]), I(name="DELAY", datatype="UINT32", shape=[3])],
            raw_input_contents=[np.array([1, 2, 3], np.int32).tobytes(), np.array([100, 100, 100], np.uint32).tobytes()],
        )
        pending = threading.Event()

        def requests():
            yield req
            pending.wait(5)

        call = stub.ModelStreamInfer(requests())
        next(call)  # one response arrived
        channel.close()  # drop the connection with the request in flight
        pending.set()
    client = grpcclient.InferenceServerClient(server.grpc_url)
    assert client.is_server_live() and client.is_model_ready("repeat_int32")
    client.close()
