"""Unit tests for Kernel's triton_python_backend_utils module."""

import asyncio
import gc
import json
import os
import re
import sys

import numpy as np
import pytest

import triton_python_backend_utils as pb_utils
from triton_python_backend_utils import _dlpack


# ---------------------------------------------------------------------------
# helpers
# ---------------------------------------------------------------------------


class _DLPackProducer:
    """Stand-in for a framework tensor that speaks the DLPack protocol."""

    def __init__(self, capsule, device=(1, 0)):
        self._capsule = capsule
        self._device = device

    def __dlpack__(self, *args, **kwargs):
        return self._capsule

    def __dlpack_device__(self):
        return self._device


class _RecordingCallback:
    def __init__(self, cancelled=False):
        self.sent = []
        self.cancelled = cancelled

    def send(self, response, flags):
        self.sent.append((response, flags))

    def is_cancelled(self):
        return self.cancelled


@pytest.fixture
def bls_handler():
    saved = pb_utils._bls_handler
    yield
    pb_utils._bls_handler = saved


@pytest.fixture
def log_settings():
    saved = dict(pb_utils._log_settings)
    pb_utils._log_settings["sink"] = None
    pb_utils._log_settings["escape"] = True
    pb_utils._log_settings["format"] = "default"
    yield pb_utils._log_settings
    pb_utils._log_settings.clear()
    pb_utils._log_settings.update(saved)


# ---------------------------------------------------------------------------
# constants
# ---------------------------------------------------------------------------


def test_flag_constants():
    assert pb_utils.TRITONSERVER_REQUEST_FLAG_SEQUENCE_START == 1
    assert pb_utils.TRITONSERVER_REQUEST_FLAG_SEQUENCE_END == 2
    assert pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL == 1
    assert pb_utils.TRITONSERVER_REQUEST_RELEASE_ALL == 1
    assert pb_utils.TRITONSERVER_REQUEST_RELEASE_RESCHEDULE == 2
    assert pb_utils.TRITONSERVER_MEMORY_GPU == 0
    assert pb_utils.TRITONSERVER_MEMORY_CPU == 1


def test_star_import_exposes_public_names_only():
    namespace = {}
    exec("from triton_python_backend_utils import *", namespace)
    for name in ("Tensor", "InferenceRequest", "InferenceResponse", "TritonError",
                 "TritonModelException", "Logger", "ModelConfig",
                 "get_input_tensor_by_name", "TRITONSERVER_RESPONSE_COMPLETE_FINAL"):
        assert name in namespace
    assert "_bls_handler" not in namespace


# ---------------------------------------------------------------------------
# dtype helpers
# ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "code, np_type",
    [(1, np.bool_), (2, np.uint8), (3, np.uint16), (4, np.uint32), (5, np.uint64),
     (6, np.int8), (7, np.int16), (8, np.int32), (9, np.int64), (10, np.float16),
     (11, np.float32), (12, np.float64), (13, np.object_)],
)
def test_type_code_round_trip(code, np_type):
    assert pb_utils.triton_to_numpy_type(code) is np_type
    assert pb_utils.numpy_to_triton_type(np_type) == code
    assert pb_utils.numpy_to_triton_type(np.dtype(np_type)) == code


def test_type_code_edge_cases():
    assert pb_utils.numpy_to_triton_type(np.bytes_) == 13
    assert pb_utils.numpy_to_triton_type(np.dtype("S7")) == 13
    assert pb_utils.numpy_to_triton_type(np.str_) == 13
    assert pb_utils.numpy_to_triton_type(np.complex64) is None
    assert pb_utils.triton_to_numpy_type(14) is None  # BF16: no numpy type
    assert pb_utils.triton_to_numpy_type(0) is None


def test_triton_string_to_numpy():
    assert pb_utils.triton_string_to_numpy("TYPE_FP32") is np.float32
    assert pb_utils.triton_string_to_numpy("TYPE_FP16") is np.float16
    assert pb_utils.triton_string_to_numpy("TYPE_BOOL") is bool
    assert pb_utils.triton_string_to_numpy("TYPE_STRING") is np.object_
    assert set(pb_utils.TRITON_STRING_TO_NUMPY) == {
        "TYPE_BOOL", "TYPE_UINT8", "TYPE_UINT16", "TYPE_UINT32", "TYPE_UINT64",
        "TYPE_INT8", "TYPE_INT16", "TYPE_INT32", "TYPE_INT64", "TYPE_FP16",
        "TYPE_FP32", "TYPE_FP64", "TYPE_STRING"}
    with pytest.raises(KeyError):
        pb_utils.triton_string_to_numpy("TYPE_BF16")


# ---------------------------------------------------------------------------
# BYTES serialization
# ---------------------------------------------------------------------------


def test_serialize_byte_tensor_layout():
    array = np.array([[b"ab", b""], [b"xyz", b"\x00\x01"]], dtype=np.object_)
    data = pb_utils.serialize_byte_tensor(array)
    assert data == (b"\x02\x00\x00\x00ab" b"\x00\x00\x00\x00"
                    b"\x03\x00\x00\x00xyz" b"\x02\x00\x00\x00\x00\x01")


def test_serialize_converts_str_and_objects():
    array = np.array(["héllo", 7, b"raw"], dtype=np.object_)
    data = pb_utils.serialize_byte_tensor(array)
    decoded = pb_utils.deserialize_bytes_tensor(data)
    assert decoded.tolist() == ["héllo".encode(), b"7", b"raw"]


def test_serialize_bytes_and_unicode_dtypes():
    assert pb_utils.deserialize_bytes_tensor(
        pb_utils.serialize_byte_tensor(np.array([b"a", b"bc"]))).tolist() == [b"a", b"bc"]
    assert pb_utils.deserialize_bytes_tensor(
        pb_utils.serialize_byte_tensor(np.array(["a", "bc"]))).tolist() == [b"a", b"bc"]


def test_serialize_non_bytes_and_empty():
    assert pb_utils.serialize_byte_tensor(np.zeros(3, np.float32)) is None
    assert pb_utils.serialize_byte_tensor(np.array([], dtype=np.object_)) == b""


def test_bytes_round_trip_keeps_c_order():
    array = np.array([[b"1", b"22"], [b"333", b"4444"]], dtype=np.object_)
    fortran = np.asfortranarray(array)
    decoded = pb_utils.deserialize_bytes_tensor(pb_utils.serialize_byte_tensor(fortran))
    assert decoded.dtype == np.object_
    assert decoded.tolist() == [b"1", b"22", b"333", b"4444"]
    assert np.array_equal(decoded.reshape(array.shape), array)


def test_deserialize_accepts_buffers_and_rejects_truncation():
    data = pb_utils.serialize_byte_tensor(np.array([b"abc"], dtype=np.object_))
    as_uint8 = np.frombuffer(data, dtype=np.uint8)
    assert pb_utils.deserialize_bytes_tensor(as_uint8).tolist() == [b"abc"]
    assert pb_utils.deserialize_bytes_tensor(b"").shape == (0,)
    with pytest.raises(pb_utils.TritonModelException, match="incomplete length field"):
        pb_utils.deserialize_bytes_tensor(data + b"\x01")
    with pytest.raises(pb_utils.TritonModelException, match="extends beyond buffer"):
        pb_utils.deserialize_bytes_tensor(data[:-1])


# ---------------------------------------------------------------------------
# Tensor
# ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "dtype, datatype",
    [(np.bool_, "BOOL"), (np.uint8, "UINT8"), (np.uint16, "UINT16"),
     (np.uint32, "UINT32"), (np.uint64, "UINT64"), (np.int8, "INT8"),
     (np.int16, "INT16"), (np.int32, "INT32"), (np.int64, "INT64"),
     (np.float16, "FP16"), (np.float32, "FP32"), (np.float64, "FP64")],
)
def test_tensor_datatypes(dtype, datatype):
    array = np.ones((2, 3), dtype=dtype)
    tensor = pb_utils.Tensor("T", array)
    assert tensor.name() == "T"
    assert tensor._datatype == datatype
    assert tensor.as_numpy() is array
    assert tensor._array is array
    assert tensor.shape() == [2, 3]
    assert tensor.is_cpu() is True
    assert tensor.triton_dtype() == pb_utils.numpy_to_triton_type(dtype)


@pytest.mark.parametrize(
    "array",
    [np.array([b"a", b"bb"], dtype=np.object_), np.array([b"a", b"bb"]),
     np.array(["a", "bb"])],
)
def test_tensor_bytes(array):
    tensor = pb_utils.Tensor("S", array)
    assert tensor._datatype == "BYTES"
    assert tensor.triton_dtype() == 13
    assert tensor.as_numpy() is array
    with pytest.raises(pb_utils.TritonModelException,
                       match="DLPack does not have support for string tensors."):
        tensor.to_dlpack()


def test_tensor_takes_numpy_arrays_only():
    # Triton 2.51's binding: a list or a numpy scalar is a TypeError; a 0-d array is a tensor.
    with pytest.raises(TypeError):
        pb_utils.Tensor("L", [[1, 2], [3, 4]])
    with pytest.raises(TypeError):
        pb_utils.Tensor("S", np.float32(2.5))
    assert pb_utils.Tensor("S", np.array(2.5, np.float32)).shape() == []


def test_tensor_non_contiguous_is_copied():
    base = np.arange(12, dtype=np.float32).reshape(3, 4)
    view = base.T
    tensor = pb_utils.Tensor("T", view)
    result = tensor.as_numpy()
    assert result.flags.c_contiguous
    assert np.array_equal(result, view)
    assert not np.shares_memory(result, base)
    assert tensor.shape() == [4, 3]


def test_tensor_rejects_bad_names_and_dtypes():
    with pytest.raises(pb_utils.TritonModelException,
                       match="Tensor name cannot be an empty string."):
        pb_utils.Tensor("", np.zeros(1))
    with pytest.raises(TypeError):
        pb_utils.Tensor(None, np.zeros(1))
    with pytest.raises(pb_utils.TritonModelException, match="NumPy dtype is not supported."):
        pb_utils.Tensor("c", np.zeros(2, dtype=np.complex64))
    with pytest.raises(pb_utils.TritonModelException, match="NumPy dtype is not supported."):
        pb_utils.Tensor("big", np.zeros(2, dtype=">f4"))


def test_bf16_tensor_refuses_numpy():
    tensor = pb_utils.Tensor._wrap("B", np.array([0x3F80], dtype=np.uint16), "BF16")
    assert tensor.triton_dtype() == 14
    with pytest.raises(pb_utils.TritonModelException) as info:
        tensor.as_numpy()
    assert str(info.value) == (
        "Tensor dtype is BF16 and cannot be converted to NumPy. Use to_dlpack() "
        "and from_dlpack() instead.")


def test_to_dlpack_consumed_by_numpy_shares_memory():
    array = np.arange(6, dtype=np.float32).reshape(2, 3)
    tensor = pb_utils.Tensor("T", array)
    imported = np.from_dlpack(_DLPackProducer(tensor.to_dlpack()))
    assert np.array_equal(imported, array)
    assert np.shares_memory(imported, array)
    # Tensor itself is a DLPack producer.
    assert tensor.__dlpack_device__() == (1, 0)
    assert np.array_equal(np.from_dlpack(tensor), array)


def test_to_dlpack_of_read_only_array():
    array = np.arange(4, dtype=np.int32)
    array.flags.writeable = False
    tensor = pb_utils.Tensor("R", array)
    back = pb_utils.Tensor.from_dlpack("R2", tensor.to_dlpack())
    assert np.array_equal(back.as_numpy(), array)
    assert np.shares_memory(back.as_numpy(), array)


def test_dlpack_exports_are_released():
    gc.collect()
    before = len(_dlpack._live_exports)
    tensor = pb_utils.Tensor("T", np.arange(3, dtype=np.int64))
    unused = tensor.to_dlpack()
    consumed = pb_utils.Tensor.from_dlpack("U", tensor.to_dlpack())
    assert len(_dlpack._live_exports) == before + 2
    del unused
    gc.collect()
    assert len(_dlpack._live_exports) == before + 1
    del consumed
    gc.collect()
    assert len(_dlpack._live_exports) == before


def test_from_dlpack_numpy_capsule_and_object():
    array = np.arange(12, dtype=np.int16).reshape(3, 4)
    from_capsule = pb_utils.Tensor.from_dlpack("A", array.__dlpack__())
    assert from_capsule._datatype == "INT16"
    assert from_capsule.shape() == [3, 4]
    assert np.shares_memory(from_capsule.as_numpy(), array)
    assert from_capsule.as_numpy().flags.writeable
    from_array = pb_utils.Tensor.from_dlpack("B", array)
    assert from_array.as_numpy() is array
    from_producer = pb_utils.Tensor.from_dlpack("C", _DLPackProducer(array.__dlpack__()))
    assert np.array_equal(from_producer.as_numpy(), array)


def test_from_dlpack_versioned_capsule_keeps_read_only():
    array = np.arange(4, dtype=np.float16)
    array.flags.writeable = False
    tensor = pb_utils.Tensor.from_dlpack("V", array.__dlpack__(max_version=(1, 0)))
    assert tensor._datatype == "FP16"
    assert not tensor.as_numpy().flags.writeable
    assert np.array_equal(tensor.as_numpy(), array)


def test_from_dlpack_bool_and_empty():
    flags = pb_utils.Tensor.from_dlpack("F", np.array([True, False]).__dlpack__())
    assert flags._datatype == "BOOL"
    assert flags.as_numpy().tolist() == [True, False]
    empty = pb_utils.Tensor.from_dlpack("E", np.zeros((0, 3), np.float32).__dlpack__())
    assert empty.shape() == [0, 3]


def test_bf16_dlpack_round_trip():
    bits = np.array([[0x3F80, 0x4000, 0xC040]], dtype=np.uint16)  # 1.0, 2.0, -3.0
    tensor = pb_utils.Tensor._wrap("B", bits, "BF16")
    back = pb_utils.Tensor.from_dlpack("B2", tensor.to_dlpack())
    assert back._datatype == "BF16"
    assert back.shape() == [1, 3]
    assert np.array_equal(back._array, bits)
    assert np.shares_memory(back._array, bits)
    with pytest.raises(pb_utils.TritonModelException):
        back.as_numpy()


def test_from_dlpack_non_contiguous_raises():
    array = np.arange(12, dtype=np.float32).reshape(3, 4)
    message = ("DLPack tensor is not contiguous. Only contiguous DLPack tensors "
               "that are stored in C-Order are supported.")
    with pytest.raises(pb_utils.TritonModelException) as info:
        pb_utils.Tensor.from_dlpack("N", array.T.__dlpack__())
    assert str(info.value) == message
    with pytest.raises(pb_utils.TritonModelException, match="not contiguous"):
        pb_utils.Tensor.from_dlpack("N", array[:, ::2])
    with pytest.raises(pb_utils.TritonModelException, match="not contiguous"):
        pb_utils.Tensor.from_dlpack("N", array[::2].__dlpack__())
    # Size-1 dimensions may carry any stride.
    ok = pb_utils.Tensor.from_dlpack("K", array[1:2, :].__dlpack__())
    assert ok.shape() == [1, 4]


def test_from_dlpack_rejections():
    with pytest.raises(pb_utils.TritonModelException) as info:
        pb_utils.Tensor.from_dlpack("X", [1, 2, 3])
    assert str(info.value) == (
        "Provided tensor is not supported. Tensor must be a DLPack capsule         or "
        "have `__dlpack__` and `__dlpack_device__` attributes")
    with pytest.raises(pb_utils.TritonModelException,
                       match="Tensor name cannot be an empty string."):
        pb_utils.Tensor.from_dlpack("", np.zeros(2))
    odd_device = _DLPackProducer(None, device=(7, 0))
    with pytest.raises(pb_utils.TritonModelException,
                       match="DLDevice type 7 is not support by Python backend."):
        pb_utils.Tensor.from_dlpack("X", odd_device)
    with pytest.raises(pb_utils.TritonModelException, match="Dtype is invalid."):
        pb_utils.Tensor.from_dlpack("X", np.zeros(2, np.complex64).__dlpack__())
    capsule = np.zeros(2, np.float32).__dlpack__()
    pb_utils.Tensor.from_dlpack("X", capsule)
    with pytest.raises(pb_utils.TritonModelException, match="already been consumed"):
        pb_utils.Tensor.from_dlpack("X", capsule)


def test_from_dlpack_gpu_without_cupy():
    try:
        import cupy  # noqa: F401
        pytest.skip("cupy present; covered by the GPU test")
    except ImportError:
        pass
    with pytest.raises(pb_utils.TritonModelException, match="GPU"):
        pb_utils.Tensor.from_dlpack("G", _DLPackProducer(None, device=(2, 0)))


def test_gpu_tensor_with_cupy():
    cupy = pytest.importorskip("cupy")
    try:
        if cupy.cuda.runtime.getDeviceCount() == 0:
            pytest.skip("no GPU")
    except Exception:
        pytest.skip("no GPU")
    source = cupy.arange(6, dtype=cupy.float32).reshape(2, 3)
    tensor = pb_utils.Tensor.from_dlpack("G", source)
    assert not tensor.is_cpu()
    assert tensor._datatype == "FP32"
    assert tensor.shape() == [2, 3]
    with pytest.raises(pb_utils.TritonModelException,
                       match="Tensor is stored in GPU and cannot be converted to NumPy."):
        tensor.as_numpy()
    back = cupy.from_dlpack(tensor.to_dlpack())
    assert cupy.asnumpy(back).tolist() == [[0, 1, 2], [3, 4, 5]]


# ---------------------------------------------------------------------------
# TritonError
# ---------------------------------------------------------------------------


def test_triton_error_codes():
    expected = {"UNKNOWN": 0, "INTERNAL": 1, "NOT_FOUND": 2, "INVALID_ARG": 3,
                "UNAVAILABLE": 4, "UNSUPPORTED": 5, "ALREADY_EXISTS": 6,
                "CANCELLED": 7}
    for name, value in expected.items():
        assert int(getattr(pb_utils.TritonError, name)) == value


def test_triton_error_defaults_and_accessors():
    error = pb_utils.TritonError("boom")
    assert error.message() == "boom"
    assert error.code() == pb_utils.TritonError.INTERNAL
    not_found = pb_utils.TritonError("missing", pb_utils.TritonError.NOT_FOUND)
    assert not_found.code() == pb_utils.TritonError.NOT_FOUND
    assert pb_utils.TritonError("x", code=pb_utils.TritonError.CANCELLED).code() == 7
    with pytest.raises(TypeError):  # Triton's binding takes the TritonError.<CODE> constants only
        pb_utils.TritonError("x", code=7)
    assert not isinstance(error, BaseException)


def test_triton_error_rejects_bad_arguments():
    with pytest.raises(TypeError):
        pb_utils.TritonError(None)
    with pytest.raises(TypeError):
        pb_utils.TritonError("x", None)
    with pytest.raises(TypeError):
        pb_utils.TritonError("x", 42)


def test_triton_model_exception_is_exception():
    assert issubclass(pb_utils.TritonModelException, Exception)
    with pytest.raises(pb_utils.TritonModelException, match="bad"):
        raise pb_utils.TritonModelException("bad")


# ---------------------------------------------------------------------------
# InferenceResponse
# ---------------------------------------------------------------------------


def test_response_basics():
    out = pb_utils.Tensor("OUT", np.zeros(2, np.float32))
    response = pb_utils.InferenceResponse([out])
    assert response.output_tensors() == [out]
    assert not response.has_error()
    assert response.error() is None
    assert response.parameters() == "{}"
    assert pb_utils.get_output_tensor_by_name(response, "OUT") is out
    assert pb_utils.get_output_tensor_by_name(response, "NOPE") is None
    assert pb_utils.InferenceResponse().output_tensors() == []


def test_response_with_error():
    error = pb_utils.TritonError("An Error Occurred")
    response = pb_utils.InferenceResponse(error=error)
    assert response.has_error()
    assert response.error() is error
    assert response.error().message() == "An Error Occurred"
    with pytest.raises(TypeError):
        pb_utils.InferenceResponse(error="not an error object")


def test_response_parameters():
    response = pb_utils.InferenceResponse(
        parameters={"key": "value", "n": 3, "flag": True})
    assert json.loads(response.parameters()) == {"key": "value", "n": 3, "flag": True}


@pytest.mark.parametrize(
    "parameters, message",
    [({"f": 1.5}, "Expect parameters values to have type bool/int/str, found type "
                  "<class 'float'>"),
     ({"n": None}, "Expect parameters values to have type bool/int/str, found type "
                   "<class 'NoneType'>"),
     ({1: "x"}, "Expect parameters keys to have type str, found type <class 'int'>"),
     ({"l": [1]}, "Expect parameters values to have type bool/int/str, found type "
                  "<class 'list'>")],
)
def test_response_parameter_validation(parameters, message):
    with pytest.raises(pb_utils.TritonModelException) as info:
        pb_utils.InferenceResponse(parameters=parameters)
    assert str(info.value) == message


def test_response_rejects_bad_tensors():
    with pytest.raises(pb_utils.TritonModelException,
                       match="Output tensor for inference response should not be empty."):
        pb_utils.InferenceResponse([None])
    with pytest.raises(TypeError):
        pb_utils.InferenceResponse([np.zeros(1)])
    with pytest.raises(pb_utils.TritonModelException):
        pb_utils.InferenceResponse(parameters=["not", "a", "dict"])


def test_response_server_side_and_prune():
    a = pb_utils.Tensor("A", np.zeros(1))
    b = pb_utils.Tensor("B", np.zeros(1))
    response = pb_utils.InferenceResponse._server_side([a, b], None, '{"x":1}')
    assert response.parameters() == '{"x":1}'
    response._prune_outputs({"B"})
    assert [t.name() for t in response.output_tensors()] == ["B"]


# ---------------------------------------------------------------------------
# InferenceRequest: server side
# ---------------------------------------------------------------------------


def _server_request(**overrides):
    args = dict(
        inputs=[pb_utils.Tensor("IN", np.arange(3, dtype=np.int32))],
        request_id="req-1",
        correlation_id=42,
        flags=pb_utils.TRITONSERVER_REQUEST_FLAG_SEQUENCE_START,
        requested_output_names=["OUT0", "OUT1"],
        parameters_json='{"p":1}',
        model_name="m",
        model_version=1,
    )
    args.update(overrides)
    return pb_utils.InferenceRequest._server_side(**args)


def test_server_side_request_accessors():
    request = _server_request()
    assert request.request_id() == "req-1"
    assert request.correlation_id() == 42
    assert request.flags() == 1
    assert request.requested_output_names() == {"OUT0", "OUT1"}
    assert request.parameters() == '{"p":1}'
    assert request.timeout() == 0
    assert request.trace().get_context() is None
    assert pb_utils.get_input_tensor_by_name(request, "IN").as_numpy().tolist() == [0, 1, 2]
    assert pb_utils.get_input_tensor_by_name(request, "MISSING") is None
    assert request.is_cancelled() is False
    request.set_flags(3)
    assert request.flags() == 3
    assert _server_request(correlation_id="seq-a").correlation_id() == "seq-a"
    assert _server_request(trace_context="ctx").trace().get_context() == "ctx"


def test_release_flags():
    request = _server_request()
    assert request._release_flags == pb_utils.TRITONSERVER_REQUEST_RELEASE_ALL
    request.set_release_flags(pb_utils.TRITONSERVER_REQUEST_RELEASE_RESCHEDULE)
    assert request._release_flags == pb_utils.TRITONSERVER_REQUEST_RELEASE_RESCHEDULE


def test_cancellation_sources():
    state = {"cancelled": False}
    request = _server_request(cancel_check=lambda: state["cancelled"])
    assert request.is_cancelled() is False
    state["cancelled"] = True
    assert request.is_cancelled() is True
    callback = _RecordingCallback(cancelled=True)
    sender = pb_utils.InferenceResponseSender(callback, decoupled=True)
    request = _server_request(response_sender=sender)
    assert request.get_response_sender() is sender
    assert request.is_cancelled() is True
    assert sender.is_cancelled() is True


# ---------------------------------------------------------------------------
# InferenceResponseSender
# ---------------------------------------------------------------------------


def _response(*names):
    return pb_utils.InferenceResponse(
        [pb_utils.Tensor(n, np.zeros(1, np.float32)) for n in names])


def test_decoupled_sender_sends_many_then_final():
    callback = _RecordingCallback()
    sender = pb_utils.InferenceResponseSender(callback, True, ["OUT"])
    sender.send(_response("OUT", "EXTRA"))
    sender.send(_response("OUT"))
    sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
    assert [flags for _, flags in callback.sent] == [0, 0, 1]
    assert [t.name() for t in callback.sent[0][0].output_tensors()] == ["OUT"]
    assert callback.sent[2][0] is None
    assert sender._is_closed()
    with pytest.raises(pb_utils.TritonModelException,
                       match="Unable to send response. Response sender has been closed."):
        sender.send(_response("OUT"))


def test_sender_argument_checks():
    sender = pb_utils.InferenceResponseSender(_RecordingCallback(), True)
    with pytest.raises(pb_utils.TritonModelException,
                       match="Unable to send response. Unsupported flag provided."):
        sender.send(_response(), flags=2)
    with pytest.raises(pb_utils.TritonModelException) as info:
        sender.send()
    assert str(info.value) == ("Inference Response object must be provided when the "
                               "response flags is set to zero.")
    with pytest.raises(TypeError):
        sender.send("nope")


def test_non_decoupled_sender_rules():
    callback = _RecordingCallback()
    sender = pb_utils.InferenceResponseSender(callback, False)
    with pytest.raises(pb_utils.TritonModelException) as info:
        sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
    assert str(info.value) == ("Unable to send response. Non-decoupled model cannot "
                               "send complete final before sending a response.")
    sender.send(_response("A"))
    with pytest.raises(pb_utils.TritonModelException) as info:
        sender.send(_response("A"))
    assert str(info.value) == ("Unable to send response. Non-decoupled model cannot "
                               "send more than one response.")
    sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
    assert len(callback.sent) == 2


def test_returned_response_after_sender_use_is_refused():
    sender = pb_utils.InferenceResponseSender(_RecordingCallback(), False)
    sender.send(_response("A"), pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
    with pytest.raises(pb_utils.TritonModelException):
        sender._update_state(_response("A"), pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)


def test_sender_close_hook():
    sender = pb_utils.InferenceResponseSender(_RecordingCallback(), True)
    sender._close()
    with pytest.raises(pb_utils.TritonModelException, match="has been closed"):
        sender.send(_response("A"))


def test_bls_request_sender_cannot_send():
    request = pb_utils.InferenceRequest(
        model_name="m", requested_output_names=["O"], inputs=[])
    sender = request.get_response_sender()
    assert request.get_response_sender() is sender
    with pytest.raises(pb_utils.TritonModelException) as info:
        sender.send(_response("O"))
    assert str(info.value) == ("Unable to send response. Response sender has no "
                               "reference to the decoupled state of the model.")
    assert request.is_cancelled() is False


# ---------------------------------------------------------------------------
# InferenceRequest: BLS construction and exec
# ---------------------------------------------------------------------------


def test_bls_request_defaults():
    tensor = pb_utils.Tensor("IN", np.zeros(2, np.float32))
    request = pb_utils.InferenceRequest(
        model_name="add_sub", requested_output_names=["OUT0", "OUT1", "OUT0"],
        inputs=[tensor])
    assert request.inputs() == [tensor]
    assert request.request_id() == ""
    assert request.correlation_id() == 0
    assert request.flags() == 0
    assert request.timeout() == 0
    assert request.parameters() == "{}"
    assert request.requested_output_names() == {"OUT0", "OUT1"}
    assert request._requested_output_names == ["OUT0", "OUT1"]
    assert request._model_name == "add_sub"
    assert request._model_version == -1
    assert request._preferred_memory._memory_type == 2
    assert request.trace().get_context() is None


def test_bls_request_all_arguments():
    request = pb_utils.InferenceRequest(
        model_name="m", requested_output_names=["O"], inputs=[],
        request_id="1", correlation_id="ex-4", model_version=1,
        flags=pb_utils.TRITONSERVER_REQUEST_FLAG_SEQUENCE_START
        | pb_utils.TRITONSERVER_REQUEST_FLAG_SEQUENCE_END,
        timeout=5,
        preferred_memory=pb_utils.PreferredMemory(pb_utils.TRITONSERVER_MEMORY_GPU, 1),
        parameters={"a": 1, "b": "x", "c": False})
    assert request.request_id() == "1"
    assert request.correlation_id() == "ex-4"
    assert request.flags() == 3
    assert request.timeout() == 5
    assert request._preferred_memory._memory_type == pb_utils.TRITONSERVER_MEMORY_GPU
    assert request._preferred_memory._device_id == 1
    assert json.loads(request.parameters()) == {"a": 1, "b": "x", "c": False}


def test_bls_request_positional_order():
    request = pb_utils.InferenceRequest("rid", 7, [], ["O"], "m")
    assert request.request_id() == "rid"
    assert request.correlation_id() == 7
    assert request._model_name == "m"


def test_bls_request_validation():
    with pytest.raises(TypeError, match="model_name"):
        pb_utils.InferenceRequest(requested_output_names=["O"], inputs=[])
    with pytest.raises(pb_utils.TritonModelException,
                       match="Correlation ID must be integer or string"):
        pb_utils.InferenceRequest(model_name="m", requested_output_names=[], inputs=[],
                                  correlation_id=1.5)
    with pytest.raises(pb_utils.TritonModelException) as info:
        pb_utils.InferenceRequest(model_name="m", requested_output_names=[""],
                                  inputs=[], request_id="r")
    assert str(info.value) == ("Requested output name for request with id 'r' and "
                               "model name 'm' should not be empty.")
    with pytest.raises(pb_utils.TritonModelException) as info:
        pb_utils.InferenceRequest(model_name="m", requested_output_names=[],
                                  inputs=[None])
    assert str(info.value) == ("Input tensor for request with id '' and model name "
                               "'m' should not be empty.")
    with pytest.raises(pb_utils.TritonModelException, match="bool/int/str"):
        pb_utils.InferenceRequest(model_name="m", requested_output_names=[], inputs=[],
                                  parameters={"x": 0.5})


def test_exec_without_handler(bls_handler):
    pb_utils._bls_handler = None
    request = pb_utils.InferenceRequest(model_name="m", requested_output_names=[],
                                        inputs=[])
    with pytest.raises(pb_utils.TritonModelException,
                       match="BLS is not available in this process"):
        request.exec()
    with pytest.raises(pb_utils.TritonModelException,
                       match="BLS is not available in this process"):
        request.async_exec()
    with pytest.raises(pb_utils.TritonModelException, match="not available"):
        pb_utils.load_model("m")


def test_exec_and_async_exec_delegate(bls_handler):
    calls = []

    class Handler:
        def exec(self, request, decoupled):
            calls.append(("exec", request, decoupled))
            return pb_utils.InferenceResponse()

        def async_exec(self, request, decoupled):
            calls.append(("async", request, decoupled))

            async def run():
                return iter([pb_utils.InferenceResponse()])
            return run()

        def is_model_ready(self, model_name, model_version):
            return model_name == "ready"

    pb_utils._bls_handler = Handler()
    request = pb_utils.InferenceRequest(model_name="m", requested_output_names=[],
                                        inputs=[])
    assert isinstance(request.exec(), pb_utils.InferenceResponse)
    responses = asyncio.run(request.async_exec(decoupled=True))
    assert len(list(responses)) == 1
    assert calls[0][0] == "exec" and calls[0][1] is request and calls[0][2] is False
    assert calls[1][0] == "async" and calls[1][2] is True
    assert pb_utils.is_model_ready("ready") is True
    assert pb_utils.is_model_ready("other", "1") is False
    with pytest.raises(pb_utils.TritonModelException, match="not available"):
        pb_utils.unload_model("m")


# ---------------------------------------------------------------------------
# config helpers
# ---------------------------------------------------------------------------


CONFIG = {
    "name": "add_sub",
    "max_batch_size": 0,
    "input": [{"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [4]}],
    "output": [{"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [4]}],
}


def test_config_lookup_helpers():
    assert pb_utils.get_input_config_by_name(CONFIG, "INPUT0")["dims"] == [4]
    assert pb_utils.get_input_config_by_name(CONFIG, "X") is None
    assert pb_utils.get_output_config_by_name(CONFIG, "OUTPUT0")["data_type"] == "TYPE_FP32"
    assert pb_utils.get_output_config_by_name({}, "OUTPUT0") is None
    assert not pb_utils.using_decoupled_model_transaction_policy(CONFIG)
    assert pb_utils.using_decoupled_model_transaction_policy(
        {"model_transaction_policy": {"decoupled": True}})


def test_get_model_dir():
    saved = pb_utils._model_dir
    try:
        pb_utils._set_model_dir(None)
        with pytest.raises(pb_utils.TritonModelException):
            pb_utils.get_model_dir()
        pb_utils._set_model_dir("/models/add_sub/1")
        assert pb_utils.get_model_dir() == "/models/add_sub/1"
    finally:
        pb_utils._model_dir = saved


# ---------------------------------------------------------------------------
# ModelConfig
# ---------------------------------------------------------------------------


def _model_config(**extra):
    config = {"name": "m", "max_batch_size": 0, "input": [], "output": []}
    config.update(extra)
    return pb_utils.ModelConfig(json.dumps(config))


def test_model_config_from_json_and_dict():
    config = pb_utils.ModelConfig(json.dumps(CONFIG))
    assert config.as_dict() == CONFIG
    from_dict = pb_utils.ModelConfig(CONFIG)
    from_dict.set_max_batch_size(8)
    assert CONFIG["max_batch_size"] == 0  # caller's dict untouched
    assert from_dict._model_config["max_batch_size"] == 8


def test_set_max_batch_size():
    config = _model_config()
    config.set_max_batch_size(4)
    assert config.as_dict()["max_batch_size"] == 4
    config = _model_config(max_batch_size=8)
    config.set_max_batch_size(16)
    assert config.as_dict()["max_batch_size"] == 16
    config = _model_config(max_batch_size=8)
    with pytest.raises(ValueError) as info:
        config.set_max_batch_size(4)
    assert str(info.value) == (
        "configuration specified max_batch_size 8, but in auto-complete-config "
        "function for model 'm' specified max_batch_size 4")


def test_set_dynamic_batching():
    config = _model_config()
    config.set_dynamic_batching()
    assert config.as_dict()["dynamic_batching"] == {}
    config = _model_config(dynamic_batching={"max_queue_delay_microseconds": 100})
    config.set_dynamic_batching()
    assert config.as_dict()["dynamic_batching"] == {"max_queue_delay_microseconds": 100}
    config = _model_config(sequence_batching={})
    with pytest.raises(ValueError) as info:
        config.set_dynamic_batching()
    assert str(info.value) == (
        "Configuration specified scheduling_choice as 'sequence_batching', but "
        "auto-complete-config function for model 'm' tries to set "
        "scheduling_choice as 'dynamic_batching'")
    with pytest.raises(ValueError, match="'ensemble_scheduling'"):
        _model_config(ensemble_scheduling={}).set_dynamic_batching()


def test_add_input_and_output():
    config = _model_config()
    config.add_input({"name": "IN", "data_type": "TYPE_FP32", "dims": [4]})
    config.add_input({"name": "OPT", "data_type": "TYPE_INT32", "dims": [1],
                      "optional": True})
    config.add_output({"name": "OUT", "data_type": "TYPE_FP32", "dims": [4]})
    data = config.as_dict()
    assert [i["name"] for i in data["input"]] == ["IN", "OPT"]
    assert data["input"][1]["optional"] is True
    assert data["output"] == [{"name": "OUT", "data_type": "TYPE_FP32", "dims": [4]}]


def test_add_input_merges_with_existing_entry():
    config = _model_config(input=[{"name": "IN", "data_type": "TYPE_INVALID", "dims": []}])
    config.add_input({"name": "IN", "data_type": "TYPE_FP32", "dims": [2, 2]})
    assert config.as_dict()["input"] == [
        {"name": "IN", "data_type": "TYPE_FP32", "dims": [2, 2]}]
    same = _model_config(input=[{"name": "IN", "data_type": "TYPE_FP32", "dims": [4]}])
    same.add_input({"name": "IN", "data_type": "TYPE_FP32", "dims": [4]})
    assert len(same.as_dict()["input"]) == 1


def test_add_input_conflicts():
    existing = [{"name": "IN", "data_type": "TYPE_FP32", "dims": [4], "optional": False}]
    with pytest.raises(ValueError) as info:
        _model_config(input=existing).add_input(
            {"name": "IN", "data_type": "TYPE_INT32", "dims": [4]})
    assert str(info.value) == (
        "unable to load model 'm', configuration expects datatype TYPE_FP32 for "
        "input 'IN', model provides TYPE_INT32")
    with pytest.raises(ValueError) as info:
        _model_config(input=existing).add_input(
            {"name": "IN", "data_type": "TYPE_FP32", "dims": [8]})
    assert str(info.value) == (
        "model 'm', tensor 'IN': the model expects dims [8] but the model "
        "configuration specifies dims [4]")
    with pytest.raises(ValueError) as info:
        _model_config(input=existing).add_input(
            {"name": "IN", "data_type": "TYPE_FP32", "dims": [4], "optional": True})
    assert str(info.value) == (
        "model 'm', tensor 'IN': the model expects optional True but the model "
        "configuration specifies optional False")


def test_add_input_property_checks():
    config = _model_config()
    with pytest.raises(ValueError) as info:
        config.add_input({"name": "IN", "data_type": "TYPE_FP32", "dims": [1],
                          "format": "x"})
    assert str(info.value) == (
        "input 'IN' in auto-complete-config function for model 'm' contains "
        "property other than 'name', 'data_type', 'dims' and 'optional'.")
    with pytest.raises(ValueError) as info:
        config.add_input({"data_type": "TYPE_FP32", "dims": [1]})
    assert str(info.value) == (
        "input in auto-complete-config function for model 'm' is missing 'name' "
        "property.")
    with pytest.raises(ValueError) as info:
        config.add_input({"name": "IN", "dims": [1]})
    assert str(info.value) == (
        "input 'IN' in auto-complete-config function for model 'm' is missing "
        "'data_type' property.")
    with pytest.raises(ValueError) as info:
        config.add_input({"name": "IN", "data_type": "TYPE_FP32"})
    assert str(info.value) == (
        "input 'IN' in auto-complete-config function for model 'm' is missing "
        "'dims' property.")


def test_add_output_checks():
    config = _model_config(output=[{"name": "OUT", "data_type": "TYPE_FP32", "dims": [4]}])
    with pytest.raises(ValueError) as info:
        config.add_output({"name": "OUT", "data_type": "TYPE_FP32", "dims": [4],
                           "optional": True})
    assert str(info.value) == (
        "output 'OUT' in auto-complete-config function for model 'm' contains "
        "property other than 'name', 'data_type' and 'dims'.")
    with pytest.raises(ValueError) as info:
        config.add_output({"name": "OUT", "data_type": "TYPE_FP16", "dims": [4]})
    assert str(info.value) == (
        "unable to load model 'm', configuration expects datatype TYPE_FP32 for "
        "output 'OUT', model provides TYPE_FP16")
    with pytest.raises(ValueError) as info:
        config.add_output({"name": "OUT", "data_type": "TYPE_FP32", "dims": [-1]})
    assert str(info.value) == (
        "model 'm', tensor 'OUT': the model expects dims [-1] but the model "
        "configuration specifies dims [4]")
    with pytest.raises(ValueError, match="is missing 'dims' property."):
        config.add_output({"name": "X", "data_type": "TYPE_FP32"})


def test_set_model_transaction_policy():
    config = _model_config()
    config.set_model_transaction_policy({"decoupled": True})
    assert config.as_dict()["model_transaction_policy"] == {"decoupled": True}
    config.set_model_transaction_policy({"decoupled": True})
    with pytest.raises(ValueError) as info:
        config.set_model_transaction_policy({"decoupled": False})
    assert str(info.value) == (
        "trying to change decoupled property in auto-complete-config for model "
        "'m', which is already set to 'True'.")
    with pytest.raises(ValueError) as info:
        config.set_model_transaction_policy({"other": 1})
    assert str(info.value) == (
        "model transaction property in auto-complete-config function for model "
        "'m' contains property other than 'decoupled'.")


# ---------------------------------------------------------------------------
# Logger
# ---------------------------------------------------------------------------

_DEFAULT_LINE = re.compile(
    r"^(?P<level>[IWE])(?P<mm>\d\d)(?P<dd>\d\d) \d\d:\d\d:\d\d\.\d{6} "
    r"(?P<pid>\d+) (?P<file>[^ :]+):(?P<line>\d+)\] (?P<msg>.*)$")


def _lines(captured):
    return [line for line in captured.err.splitlines() if line]


def test_logger_levels_and_location(capsys, log_settings):
    logger = pb_utils.Logger
    logger.log_info("Info Msg!"); info_line = sys._getframe().f_lineno  # noqa: E702
    logger.log_warn("Warning Msg!")
    logger.log_error("Error Msg!")
    logger.log("Specific Msg!", logger.WARNING)
    logger.log("Default Msg!")
    lines = _lines(capsys.readouterr())
    assert len(lines) == 5
    parsed = [_DEFAULT_LINE.match(line) for line in lines]
    assert all(parsed), lines
    assert [m["level"] for m in parsed] == ["I", "W", "E", "W", "I"]
    assert [m["msg"] for m in parsed] == [
        '"Info Msg!"', '"Warning Msg!"', '"Error Msg!"', '"Specific Msg!"',
        '"Default Msg!"']
    assert parsed[0]["file"] == os.path.basename(__file__)
    assert int(parsed[0]["line"]) == info_line
    assert int(parsed[1]["line"]) == info_line + 1
    assert int(parsed[0]["pid"]) == os.getpid()


def test_logger_verbose_needs_verbosity(capsys, log_settings):
    pb_utils._set_log_verbosity(0)
    pb_utils.Logger.log_verbose("hidden")
    pb_utils.Logger.log("hidden too", pb_utils.Logger.VERBOSE)
    assert _lines(capsys.readouterr()) == []
    pb_utils._set_log_verbosity(1)
    pb_utils.Logger.log_verbose("shown")
    lines = _lines(capsys.readouterr())
    assert len(lines) == 1
    match = _DEFAULT_LINE.match(lines[0])
    assert match["level"] == "I" and match["msg"] == '"shown"'


def test_logger_escaping_and_formats(capsys, log_settings):
    pb_utils.Logger.log_info('say "hi"\nbye')
    line = _lines(capsys.readouterr())[0]
    assert line.endswith(r'] "say \"hi\"\nbye"')
    pb_utils._configure_logging(escape=False)
    pb_utils.Logger.log_info("plain text")
    assert _lines(capsys.readouterr())[0].endswith("] plain text")
    pb_utils._configure_logging(escape=True, log_format="ISO8601")
    pb_utils.Logger.log_error("iso")
    line = _lines(capsys.readouterr())[0]
    assert re.match(
        r'^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ E \d+ test_pb_utils\.py:\d+\] "iso"$', line)


def test_logger_level_switches_and_sink(capsys, log_settings):
    got = []
    pb_utils._configure_logging(info=False, sink=got.append)
    pb_utils.Logger.log_info("dropped")
    pb_utils.Logger.log_warn("kept")
    assert capsys.readouterr().err == ""
    assert len(got) == 1 and got[0].startswith("W") and got[0].endswith('"kept"')
    pb_utils._configure_logging(sink=False)
    pb_utils.Logger.log_warn("back on stderr")
    assert len(got) == 1
    assert _lines(capsys.readouterr())[0].endswith('"back on stderr"')


def test_log_level_values():
    assert pb_utils.Logger.LogLevel.INFO == 0
    assert pb_utils.Logger.WARNING == 1
    assert pb_utils.Logger.ERROR == 2
    assert pb_utils.Logger.VERBOSE == 3
    assert pb_utils.LogLevel is pb_utils.Logger.LogLevel


def test_bls_request_accepts_bytes_for_string_arguments():
    # Models often pass a BYTES tensor element (bytes) as the model name.
    import triton_python_backend_utils as pb_utils

    request = pb_utils.InferenceRequest(
        model_name=np.array([b"add_sub"], dtype=np.object_)[0],
        request_id=b"7",
        requested_output_names=["OUTPUT0"],
        inputs=[],
    )
    assert request._model_name == "add_sub"
    assert request.request_id() == "7"
