"""The classification extension: an output asked for with a class count comes back as its top
classes, "<value>:<index>[:<label>]" BYTES, as tritonserver 2.51 answers (HTTP and gRPC)."""

from __future__ import annotations

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from conftest import EXAMPLES

SCORES_CONFIG = """
name: "scores"
backend: "python"
max_batch_size: 4
input [{ name: "IN", data_type: TYPE_FP32, dims: [ -1 ] }]
output [
  { name: "OUT", data_type: TYPE_FP32, dims: [ -1 ], label_filename: "labels.txt" },
  { name: "OUT_INT", data_type: TYPE_INT32, dims: [ -1 ] }
]
"""
SCORES_PY = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        out = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
            out.append(pb_utils.InferenceResponse(output_tensors=[
                pb_utils.Tensor("OUT", x), pb_utils.Tensor("OUT_INT", (x * 10).astype(np.int32))]))
        return out
"""


@pytest.fixture(scope="module")
def kernel(tmp_path_factory):
    from conftest import KernelProcess, running

    repo = tmp_path_factory.mktemp("classification")
    (repo / "scores" / "1").mkdir(parents=True)
    (repo / "scores" / "config.pbtxt").write_text(SCORES_CONFIG)
    (repo / "scores" / "labels.txt").write_text("cat\ndog\nbird\n")  # no label for index 3
    (repo / "scores" / "1" / "model.py").write_text(SCORES_PY)
    yield from running(KernelProcess([repo, EXAMPLES]))


def _input(module, values):
    t = module.InferInput("IN", list(values.shape), "FP32")
    t.set_data_from_numpy(values)
    return t


@pytest.mark.parametrize("module", [httpclient, grpcclient], ids=["http", "grpc"])
def test_top_classes_with_labels_per_batch_item(kernel, module):
    client = module.InferenceServerClient(kernel.url if module is httpclient else kernel.grpc_url)
    x = np.array([[0.1, 0.7, 0.2, 0.9], [0.5, 0.25, 0.125, 0.0625]], np.float32)
    result = client.infer("scores", [_input(module, x)], outputs=[
        module.InferRequestedOutput("OUT", class_count=2), module.InferRequestedOutput("OUT_INT", class_count=9)])
    out = result.as_numpy("OUT")
    assert out.shape == (2, 2)
    assert out.tolist() == [[b"0.900000:3", b"0.700000:1:dog"], [b"0.500000:0:cat", b"0.250000:1:dog"]]
    ints = result.as_numpy("OUT_INT")  # no label file; integer values as integers; at most 4 classes
    assert ints.shape == (2, 4)
    assert ints[0].tolist() == [b"9:3", b"7:1", b"2:2", b"1:0"]
    got = result.get_output("OUT")
    assert (got["datatype"] if module is httpclient else got.datatype) == "BYTES"


@pytest.mark.parametrize("module", [httpclient, grpcclient], ids=["http", "grpc"])
def test_non_batching_model_and_unsupported_type(kernel, module):
    client = module.InferenceServerClient(kernel.url if module is httpclient else kernel.grpc_url)
    inputs = []
    for name in ("INPUT0", "INPUT1"):
        t = module.InferInput(name, [4], "FP32")
        t.set_data_from_numpy(np.array([1, 2, 3, 4], np.float32))
        inputs.append(t)
    result = client.infer("add_sub", inputs, outputs=[module.InferRequestedOutput("OUTPUT0", class_count=2)])
    assert result.as_numpy("OUTPUT0").tolist() == [b"8.000000:3", b"6.000000:2"]  # as tritonserver 2.51
    s = module.InferInput("INPUT0", [1, 1], "BYTES")
    s.set_data_from_numpy(np.array([[b"x"]], dtype=np.object_))
    with pytest.raises(InferenceServerException) as info:
        client.infer("string_identity", [s], outputs=[module.InferRequestedOutput("OUTPUT0", class_count=1)])
    assert "class result not available for output due to unsupported type 'BYTES'" in info.value.message()
