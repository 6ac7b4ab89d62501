"""Odd ModelInfer requests over gRPC, answered as tritonserver 2.51 answers them (issue 23, defect 8).

Checked against real tritonserver 2.51 (benchmarks/peers.py) with the same requests:

- more `raw_input_contents` than inputs: tritonserver takes the first ones, in input order, and
  ignores the rest (OK), through ModelInfer and ModelStreamInfer alike. Kernel refuses the request
  with INVALID_ARGUMENT naming both counts, as issue 23 asks: the surplus bytes were buffered for
  nothing and which bytes belong to which input is a guess (peer_checks/differences.py lists it);
- `sequence_id` as an empty string_param: a model without sequence batching ignores it (OK); a
  sequence model refuses it as it refuses 0 or no id at all, with INVALID_ARGUMENT "inference
  request to model '<m>' must specify a non-zero or non-empty correlation ID" (an in-stream error
  on ModelStreamInfer).
"""

from __future__ import annotations

from pathlib import Path

import grpc
import numpy as np
import pytest
from tritonclient.grpc import service_pb2 as tc_pb
from tritonclient.grpc import service_pb2_grpc as tc_grpc

from conftest import KernelProcess, running

MODELS = Path(__file__).resolve().parent / "models"
NO_CORRELATION_ID = "inference request to model 'seq_echo' must specify a non-zero or non-empty correlation ID"


@pytest.fixture(scope="module")
def stub():
    for k in running(KernelProcess([MODELS], "--grpc-server", "native")):
        channel = grpc.insecure_channel(k.grpc_url)
        try:
            yield tc_grpc.GRPCInferenceServiceStub(channel)
        finally:
            channel.close()


def add_sub(n_raw: int = 2) -> tc_pb.ModelInferRequest:
    req = tc_pb.ModelInferRequest(model_name="add_sub_x2")
    for name in ("INPUT0", "INPUT1"):
        t = req.inputs.add()
        t.name, t.datatype = name, "FP32"
        t.shape.append(4)
    for i in range(n_raw):
        req.raw_input_contents.append(np.full(4, i + 1, np.float32).tobytes())
    return req


def seq_echo(**sequence_id) -> tc_pb.ModelInferRequest:
    req = tc_pb.ModelInferRequest(model_name="seq_echo")
    t = req.inputs.add()
    t.name, t.datatype = "IN", "INT32"
    t.shape.append(1)
    req.raw_input_contents.append(np.array([7], np.int32).tobytes())
    for kind, value in sequence_id.items():
        setattr(req.parameters["sequence_id"], kind, value)
    req.parameters["sequence_start"].bool_param = True
    return req


def output(response, name: str) -> list:
    index = [o.name for o in response.outputs].index(name)
    return np.frombuffer(response.raw_output_contents[index], np.float32).tolist()


@pytest.mark.parametrize("n_raw", [3, 5])
def test_more_raw_contents_than_inputs_is_refused_naming_the_counts(stub, n_raw):
    with pytest.raises(grpc.RpcError) as info:
        stub.ModelInfer(add_sub(n_raw))
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert info.value.details() == (f"{n_raw} raw_input_contents given for model 'add_sub_x2', but only 2 of its "
                                    "inputs take one (each input without shared memory or 'contents' takes the next)")
    streamed = list(stub.ModelStreamInfer(iter([add_sub(n_raw), add_sub(2)])))
    assert "raw_input_contents given" in streamed[0].error_message
    assert streamed[1].error_message == ""  # the stream goes on
    assert output(streamed[1].infer_response, "OUTPUT0") == [3.0] * 4


def test_as_many_raw_contents_as_inputs_still_work(stub):
    assert output(stub.ModelInfer(add_sub(2)), "OUTPUT0") == [3.0] * 4


def test_empty_string_sequence_id_on_a_model_without_sequences_is_ignored(stub):
    req = add_sub()
    req.parameters["sequence_id"].string_param = ""
    assert output(stub.ModelInfer(req), "OUTPUT0") == [3.0] * 4


@pytest.mark.parametrize("sequence_id", [{"string_param": ""}, {"int64_param": 0}, {}], ids=["empty", "zero", "none"])
def test_empty_string_sequence_id_on_a_sequence_model_is_refused(stub, sequence_id):
    with pytest.raises(grpc.RpcError) as info:
        stub.ModelInfer(seq_echo(**sequence_id))
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert info.value.details() == NO_CORRELATION_ID
    streamed = list(stub.ModelStreamInfer(iter([seq_echo(**sequence_id)])))
    assert [r.error_message for r in streamed] == [NO_CORRELATION_ID]
