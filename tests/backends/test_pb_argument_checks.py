"""pb_utils argument checking, compared with what Triton 2.51's bindings raise.

The pb_checks model (tests/models/model_process/pb_checks) calls pb_utils with
wrong argument types, in initialize and in execute, and reports the exception
type and message of each call. TRITON holds what real tritonserver 2.51
reported for the same model: the type always, the message where it is
Triton's own wording (pybind11's generic "incompatible function arguments"
texts are not matched; the type is what model code catches).
"""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import tritonclient.http as httpclient
from conftest import TEST_MODELS, serving

# label: (exception type name, message or None when only the type is compared); ("", None): no exception.
TRITON = {
    'Tensor name int': ('TypeError', None),
    'Tensor name None': ('TypeError', None),
    'Tensor name bytes': ('', None),
    'Tensor array list': ('TypeError', None),
    'Tensor array str': ('TypeError', None),
    'Tensor array None': ('TypeError', None),
    'Tensor array int': ('TypeError', None),
    'Tensor missing array': ('TypeError', None),
    'Tensor from_dlpack name int': ('TypeError', None),
    'Tensor from_dlpack int': ('TritonModelException', 'Provided tensor is not supported. Tensor must be a DLPack capsule         or have `__dlpack__` and `__dlpack_device__` attributes'),
    'Request model_name int': ('TypeError', None),
    'Request model_name None': ('TypeError', None),
    'Request missing model_name': ('TypeError', None),
    'Request inputs int item': ('TypeError', None),
    'Request inputs str': ('TypeError', None),
    'Request inputs None': ('TypeError', None),
    'Request inputs tuple': ('', None),
    'Request outputs int item': ('TypeError', None),
    'Request outputs str': ('TypeError', None),
    'Request outputs None': ('TypeError', None),
    'Request correlation_id float': ('TritonModelException', 'Correlation ID must be integer or string'),
    'Request correlation_id negative': ('RuntimeError', 'Unable to cast Python instance to C++ type (#define PYBIND11_DETAILED_ERROR_MESSAGES or compile in debug mode for details)'),
    'Request correlation_id None': ('TypeError', None),
    'Request correlation_id list': ('TritonModelException', 'Correlation ID must be integer or string'),
    'Request request_id int': ('TypeError', None),
    'Request model_version str': ('TypeError', None),
    'Request flags str': ('TypeError', None),
    'Request flags negative': ('TypeError', None),
    'Request flags float': ('TypeError', None),
    'Request timeout negative': ('TypeError', None),
    'Request timeout str': ('TypeError', None),
    'Request parameters list': ('TritonModelException', "Expect N8pybind114dictE, got <class 'list'>"),
    'Request parameters str': ('TritonModelException', "Expect N8pybind114dictE, got <class 'str'>"),
    'Request parameters int key': ('TritonModelException', "Expect parameters keys to have type str, found type <class 'int'>"),
    'Request parameters float value': ('TritonModelException', "Expect parameters values to have type bool/int/str, found type <class 'float'>"),
    'Request preferred_memory int': ('TypeError', None),
    'Request trace int': ('TypeError', None),
    'Request set_flags str': ('TypeError', None),
    'Request exec decoupled str': ('TypeError', None),
    'Request exec decoupled int': ('TritonModelException', "BLS is only supported during the 'execute' function."),
    'Response tensors int item': ('TypeError', None),
    'Response tensors str': ('TypeError', None),
    'Response tensors None item': ('TritonModelException', 'Output tensor for inference response should not be empty.'),
    'Response tensors None': ('TypeError', None),
    'Response no arguments': ('', None),
    'Response error str': ('TypeError', None),
    'Response parameters list value': ('TypeError', None),
    'TritonError message int': ('TypeError', None),
    'TritonError code str': ('TypeError', None),
    'TritonError code 99': ('TypeError', None),
    'TritonError no arguments': ('TypeError', None),
    'Logger log level 7': ('TypeError', None),
    'Logger log level str': ('TypeError', None),
    'Logger log message int': ('TypeError', None),
    'Logger log message None': ('TypeError', None),
    'Logger log_info int': ('TypeError', None),
    'Logger log_warn None': ('TypeError', None),
    'Logger log_error bytes': ('', None),
    'Logger log_verbose list': ('TypeError', None),
    'PreferredMemory type float': ('TypeError', None),
    'PreferredMemory type str': ('TypeError', None),
    'PreferredMemory device str': ('TypeError', None),
    'MetricFamily name int': ('TypeError', None),
    'MetricFamily kind 5': ('TypeError', None),
    'MetricFamily kind str': ('TypeError', None),
    'TritonError code int': ('TypeError', None),
    'TritonError code enum': ('', None),
    'Logger log level int': ('TypeError', None),
    'Logger log level enum': ('', None),
    'PreferredMemory type int': ('TypeError', None),
    'PreferredMemory device negative': ('', None),
    'MetricFamily kind int': ('TypeError', None),
    'Response parameters float value': ('TypeError', None),
    'Response parameters int key': ('TypeError', None),
    'Response parameters str': ('TypeError', None),
    'Response parameters None': ('TypeError', None),
    'Response error None': ('', None),
    'Request parameters None': ('', None),
    'Request set_flags negative': ('TypeError', None),
    'Request exec decoupled None': ('TypeError', None),
    'Request exec decoupled float': ('TritonModelException', "BLS is only supported during the 'execute' function."),
    'Request exec decoupled list': ('TypeError', None),
    'Request correlation_id bool': ('', None),
    'Request correlation_id bytes': ('TritonModelException', 'Correlation ID must be integer or string'),
    'Request model_name bytes': ('', None),
    'Request request_id bytes': ('', None),
    'Request flags bool': ('', None),
    'Tensor name empty': ('TritonModelException', 'Tensor name cannot be an empty string.'),
    'Tensor name empty array None': ('TypeError', None),  # Triton's QA model argument_validation checks it
    'Tensor from_dlpack name empty None': ('TritonModelException', 'Tensor name cannot be an empty string.'),
    'Metric increment str': ('TypeError', None),
    'Metric increment int': ('', None),
    'Metric set str': ('TypeError', None),
    'Metric set None': ('TypeError', None),
    'Metric observe str': ('TypeError', None),
    'Metric observe int': ('', None),
    'load_model name int': ('TypeError', None),
    'unload_model name int': ('TypeError', None),
    'is_model_ready name int': ('TypeError', None),
    'Sender send str': ('TypeError', None),
    'Sender send flags str': ('TypeError', None),
    'Sender send flags negative': ('TypeError', None),
    'Sender send flags float': ('TypeError', None),
    'Sender send flags 5': ('TritonModelException', 'Unable to send response. Unsupported flag provided.'),
    'Request set_release_flags str': ('TypeError', None),
    'Request is_cancelled argument': ('TypeError', None),
}

# Deliberate differences. Triton 2.51's InferenceResponse has no `parameters` argument at all
# (TypeError for any); Kernel accepts the response parameters of later Python backends, checked
# like a request's.
KERNEL_ONLY = {
    "Response parameters list value": ("TritonModelException",
                                       "Expect parameters values to have type bool/int/str, found type <class 'list'>"),
    "Response parameters float value": ("TritonModelException",
                                        "Expect parameters values to have type bool/int/str, found type <class 'float'>"),
    "Response parameters int key": ("TritonModelException",
                                    "Expect parameters keys to have type str, found type <class 'int'>"),
    "Response parameters str": ("TritonModelException", "Expect N8pybind114dictE, got <class 'str'>"),
    "Response parameters None": ("", None),
    # pybind11's conversion failure (a negative id for its unsigned correlation id) is a RuntimeError
    # with pybind11's text there; Kernel raises the same type with its own words.
    "Request correlation_id negative": ("RuntimeError", None),
}
EXPECTED = {**TRITON, **KERNEL_ONLY}


@pytest.fixture(scope="module")
def reported(tmp_path_factory):
    repo = tmp_path_factory.mktemp("repo")
    shutil.copytree(TEST_MODELS / "model_process" / "pb_checks", repo / "pb_checks")
    gen = serving([repo])
    server = next(gen)
    try:
        client = httpclient.InferenceServerClient(server.url)
        tensor = httpclient.InferInput("IN", [1], "FP32")
        tensor.set_data_from_numpy(np.array([1.0], np.float32))
        yield json.loads(client.infer("pb_checks", [tensor]).as_numpy("REPORT")[0])
    finally:
        gen.close()


def test_every_case_was_run(reported):
    assert sorted(reported) == sorted(EXPECTED)


@pytest.mark.parametrize("label", sorted(EXPECTED))
def test_raises_what_triton_raises(reported, label):
    kind, message = EXPECTED[label]
    got_kind, got_message = reported[label]
    assert got_kind == kind, f"{label}: {got_kind}: {got_message}"
    if message is not None:
        assert got_message == message
