"""pb_utils' GPU-facing API on a machine without a GPU (and without CuPy).

What a model can do here (every test runs on any machine; a GPU one hides CuPy where it must): host tensors say is_cpu(); DLPack producers on a CUDA or other device
get a clear TritonModelException instead of a crash; PreferredMemory(TRITONSERVER_MEMORY_GPU, id)
is accepted by a BLS InferenceRequest; a GPU array in a response is copied to the host through
its own `get()` (checked with a stand-in exposing the CUDA array interface, as CuPy arrays do).
FORCE_CPU_ONLY_INPUT_TENSORS is read as Triton reads it.
"""

from __future__ import annotations

import sys

import numpy as np
import pytest
import triton_python_backend_utils as pb_utils
from google.protobuf import text_format

from kernel.backends.python.backend import force_cpu_only_input_tensors
from kernel.backends.python.responses import host_array
from kernel.core.errors import KernelError
from kernel.protos import model_config_pb2 as mc

class DeviceProducer:
    """A DLPack producer whose memory is on another device (what torch/CuPy CUDA tensors report)."""

    def __init__(self, device_type: int):
        self.device_type = device_type

    def __dlpack_device__(self):
        return (self.device_type, 0)

    def __dlpack__(self, stream=None):
        raise AssertionError("a non-CPU producer must not be consumed as host memory")


def test_host_tensors_are_cpu():
    t = pb_utils.Tensor("x", np.arange(4, dtype=np.float32))
    assert t.is_cpu()
    assert t.__dlpack_device__() == (1, 0)
    back = pb_utils.Tensor.from_dlpack("y", t.to_dlpack())
    assert back.is_cpu() and np.array_equal(back.as_numpy(), t.as_numpy())


def test_cuda_dlpack_without_a_gpu_is_a_clear_error(monkeypatch):
    # As on a machine without CuPy, also where CuPy is installed (a GPU machine): `import cupy`
    # raises ImportError while sys.modules holds None for it.
    monkeypatch.setitem(sys.modules, "cupy", None)
    with pytest.raises(pb_utils.TritonModelException) as info:
        pb_utils.Tensor.from_dlpack("x", DeviceProducer(2))  # kDLCUDA
    assert "allocated on GPU device, when GPU is not available" in str(info.value)


@pytest.mark.parametrize("device_type", [10, 4, 7])  # ROCm, OpenCL, Vulkan
def test_other_devices_are_refused_in_tritons_words(device_type):
    with pytest.raises(pb_utils.TritonModelException) as info:
        pb_utils.Tensor.from_dlpack("x", DeviceProducer(device_type))
    assert str(info.value) == f"DLDevice type {device_type} is not support by Python backend."


def test_preferred_memory_names_and_bls_request():
    assert {"PreferredMemory", "TRITONSERVER_MEMORY_GPU", "TRITONSERVER_MEMORY_CPU"} <= set(dir(pb_utils))
    memory = pb_utils.PreferredMemory(pb_utils.TRITONSERVER_MEMORY_GPU, 1)
    request = pb_utils.InferenceRequest(
        model_name="add_sub", requested_output_names=["OUTPUT0"],
        inputs=[pb_utils.Tensor("INPUT0", np.zeros(4, np.float32))], preferred_memory=memory,
    )
    assert request is not None
    pb_utils.PreferredMemory(pb_utils.TRITONSERVER_MEMORY_CPU)
    with pytest.raises(TypeError):
        pb_utils.PreferredMemory(0, 0)  # the constants only, as Triton's binding


class FakeCudaArray:
    """Stands in for a CuPy array: exposes __cuda_array_interface__ and copies to host with get()."""

    def __init__(self, host: np.ndarray):
        self._host = host
        self.copies = 0
        self.__cuda_array_interface__ = {"shape": host.shape, "typestr": host.dtype.str, "data": (0, False),
                                         "version": 3}

    def get(self):
        self.copies += 1
        return self._host.copy()


def test_gpu_arrays_in_responses_are_copied_to_host():
    host = np.arange(6, dtype=np.float32).reshape(2, 3)
    device = FakeCudaArray(host)
    out = host_array(device)
    assert isinstance(out, np.ndarray) and np.array_equal(out, host) and device.copies == 1
    assert host_array(host) is host  # host arrays pass as they are


def _config(text: str):
    cfg = mc.ModelConfig()
    text_format.Parse(text, cfg)
    return cfg


@pytest.mark.parametrize("value,expected", [(None, True), ("yes", True), ("no", False)])
def test_force_cpu_only_input_tensors(value, expected):
    text = 'name: "m"'
    if value is not None:
        text += f' parameters {{ key: "FORCE_CPU_ONLY_INPUT_TENSORS" value {{ string_value: "{value}" }} }}'
    assert force_cpu_only_input_tensors(_config(text)) is expected


@pytest.mark.parametrize("value", ["maybe", "YES", "true", ""])
def test_force_cpu_only_input_tensors_bad_value(value):
    cfg = _config(f'name: "m" parameters {{ key: "FORCE_CPU_ONLY_INPUT_TENSORS" value {{ string_value: "{value}" }} }}')
    with pytest.raises(KernelError) as info:
        force_cpu_only_input_tensors(cfg)
    # tritonserver 2.51: "Unsupported: Incorrect value for FORCE_CPU_ONLY_INPUT_TENSORS: maybe'" (sic)
    assert info.value.message == f"Incorrect value for FORCE_CPU_ONLY_INPUT_TENSORS: {value}'"
