"""A synchronous execute runs inline on the worker's loop: what a model may do there still works.

The worker pumps its channel while such an execute waits for the front, so a model
can stream a decoupled BLS call, pass a BLS input too big to ride in the message
(the shared-memory arena), make blocking BLS calls from threads that execute
joins, run its own asyncio loop, and answer through a response sender from its
own thread, all from a plain `def execute`.
"""

from __future__ import annotations

import textwrap

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from conftest import TEST_MODELS, copy_model, serving

PROBE = '''
import asyncio
import concurrent.futures
import threading

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            mode = pb_utils.get_input_tensor_by_name(request, "MODE").as_numpy()[0].decode()
            data = pb_utils.get_input_tensor_by_name(request, "DATA").as_numpy()
            if mode == "stream":
                bls = pb_utils.InferenceRequest(
                    model_name="repeat_int32", requested_output_names=["OUT"],
                    inputs=[pb_utils.Tensor("IN", data.astype(np.int32)),
                            pb_utils.Tensor("DELAY", np.full(data.shape, 5, dtype=np.uint32))])
                total = 0.0
                for part in bls.exec(decoupled=True):
                    if part.has_error():
                        raise pb_utils.TritonModelException(part.error().message())
                    out = pb_utils.get_output_tensor_by_name(part, "OUT")
                    if out is not None:
                        total += float(out.as_numpy().sum())
            elif mode == "big":
                bls = pb_utils.InferenceRequest(
                    model_name="double", requested_output_names=["Y"], inputs=[pb_utils.Tensor("X", data)])
                answer = bls.exec()
                if answer.has_error():
                    raise pb_utils.TritonModelException(answer.error().message())
                total = float(pb_utils.get_output_tensor_by_name(answer, "Y").as_numpy().sum())
            elif mode == "pool":
                # Blocking BLS calls made by the model's own threads while execute joins them.
                def call(chunk):
                    bls = pb_utils.InferenceRequest(
                        model_name="double", requested_output_names=["Y"], inputs=[pb_utils.Tensor("X", chunk)])
                    return float(pb_utils.get_output_tensor_by_name(bls.exec(), "Y").as_numpy().sum())
                with concurrent.futures.ThreadPoolExecutor(4) as pool:
                    total = sum(pool.map(call, np.array_split(data, 8)))
            elif mode == "asyncio":
                async def twice(x):
                    await asyncio.sleep(0.001)
                    return 2 * x
                total = asyncio.run(twice(float(data.sum())))
            elif mode == "sender":
                sender = request.get_response_sender()
                value = float(data.sum())

                def answer(sender=sender, value=value):
                    sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("SUM", np.array([value], np.float64))]),
                                flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)

                threading.Timer(0.05, answer).start()
                responses = None
                continue
            else:
                total = float(data.sum())
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("SUM", np.array([total], np.float64))]))
        return responses
'''

PROBE_CONFIG = '''
backend: "python"
input [{ name: "MODE", data_type: TYPE_STRING, dims: [ 1 ] },
       { name: "DATA", data_type: TYPE_FP32, dims: [ -1 ] }]
output [{ name: "SUM", data_type: TYPE_FP64, dims: [ 1 ] }]
'''

DOUBLE = '''
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor("Y", 2 * pb_utils.get_input_tensor_by_name(r, "X").as_numpy())])
                for r in requests]
'''

DOUBLE_CONFIG = '''
backend: "python"
input [{ name: "X", data_type: TYPE_FP32, dims: [ -1 ] }]
output [{ name: "Y", data_type: TYPE_FP32, dims: [ -1 ] }]
'''


def _model(repo, name: str, code: str, config: str) -> None:
    (repo / name / "1").mkdir(parents=True)
    (repo / name / "1" / "model.py").write_text(textwrap.dedent(code))
    (repo / name / "config.pbtxt").write_text(textwrap.dedent(config))


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    repo = tmp_path_factory.mktemp("inline-execute") / "repo"
    repo.mkdir()
    _model(repo, "inline_probe", PROBE, PROBE_CONFIG)
    _model(repo, "double", DOUBLE, DOUBLE_CONFIG)
    copy_model(TEST_MODELS / "good" / "repeat_int32", repo)
    yield from serving([repo])


def _infer(client, module, mode: str, data: np.ndarray) -> float:
    mode_in = module.InferInput("MODE", [1], "BYTES")
    mode_in.set_data_from_numpy(np.array([mode.encode()], dtype=np.object_))
    data_in = module.InferInput("DATA", list(data.shape), "FP32")
    data_in.set_data_from_numpy(data)
    result = client.infer("inline_probe", [mode_in, data_in])
    return float(result.as_numpy("SUM")[0])


@pytest.fixture(params=["http", "grpc"])
def client(request, server):
    if request.param == "http":
        c = httpclient.InferenceServerClient(server.url, network_timeout=60)
        yield c, httpclient
    else:
        c = grpcclient.InferenceServerClient(server.grpc_url)
        yield c, grpcclient
    c.close()


def test_decoupled_bls_streams_into_a_sync_execute(client):
    c, module = client
    assert _infer(c, module, "stream", np.arange(1, 6, dtype=np.float32)) == 15.0


def test_bls_input_through_the_arena(client):
    c, module = client
    data = np.ones(200_000, dtype=np.float32)  # 800 kB: travels through shared memory, not the message
    assert _infer(c, module, "big", data) == 400_000.0


def test_blocking_bls_from_threads_that_execute_joins(client):
    c, module = client
    assert _infer(c, module, "pool", np.arange(64, dtype=np.float32)) == 2.0 * 2016
    assert _infer(c, module, "pool", np.ones(1_000_000, dtype=np.float32)) == 2_000_000.0  # through the arena


def test_model_runs_its_own_asyncio_loop(client):
    c, module = client
    assert _infer(c, module, "asyncio", np.array([1.5, 2.5], dtype=np.float32)) == 8.0


def test_response_sender_from_a_thread_then_plain_requests(client):
    c, module = client
    assert _infer(c, module, "sender", np.array([3.0, 4.0], dtype=np.float32)) == 7.0
    assert _infer(c, module, "plain", np.array([1.0, 1.0], dtype=np.float32)) == 2.0
    assert _infer(c, module, "stream", np.array([2.0, 2.0], dtype=np.float32)) == 4.0
    assert _infer(c, module, "sender", np.array([5.0], dtype=np.float32)) == 5.0
