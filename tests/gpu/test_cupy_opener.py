"""kernel.core.cuda_shared_memory.CupyIpcOpener without a GPU.

On a CPU box it must refuse clearly (400, "GPUs not supported"; "needs CuPy" where GPUs exist but
CuPy does not). Its use of CuPy is then checked against a stand-in `cupy` module whose runtime
calls work on host memory: ipcOpenMemHandle hands out the address of a ctypes buffer and memcpy
is a real memmove, so the pointer arithmetic, copy directions, device selection and the close
are exercised for real; only the CUDA driver underneath is replaced.
"""

from __future__ import annotations

import contextlib
import ctypes
import sys
import types

import pytest

from kernel.core.cuda_shared_memory import CupyIpcOpener, CudaRegions
from kernel.core.errors import ErrorCode, KernelError


def test_no_gpu_is_a_clear_400():
    opener = CupyIpcOpener(gpu_ids=lambda: ())
    with pytest.raises(KernelError) as info:
        CudaRegions(opener).register("r", b"\0" * 3, 0, 16)  # refused before the handle is looked at
    assert info.value.code == ErrorCode.INVALID_ARG
    assert info.value.message == "failed to register CUDA shared memory region: 'r', GPUs not supported"


def test_gpu_without_cupy_says_what_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "cupy", None)  # import cupy -> ImportError
    with pytest.raises(KernelError) as info:
        CupyIpcOpener(gpu_ids=lambda: (0,)).open("r", b"\0" * 64, 0, 16)
    assert info.value.code == ErrorCode.INVALID_ARG
    assert "needs CuPy: install kernel-inference-server[gpu]" in info.value.message


class FakeRuntime:
    memcpyHostToDevice = 1
    memcpyDeviceToHost = 2

    def __init__(self):
        self.buffers = {}  # handle -> ctypes buffer playing the client's allocation
        self.opened = {}  # pointer -> handle
        self.current_device = None
        self.calls = []

    def export(self, data: bytes) -> bytes:
        handle = bytes([len(self.buffers) + 1]) * 64
        self.buffers[handle] = ctypes.create_string_buffer(data, len(data))
        return handle

    def ipcOpenMemHandle(self, handle):
        if handle not in self.buffers:
            raise RuntimeError("cudaErrorInvalidValue: invalid argument")
        ptr = ctypes.addressof(self.buffers[handle])
        self.opened[ptr] = handle
        self.calls.append(("open", self.current_device))
        return ptr

    def ipcCloseMemHandle(self, ptr):
        self.calls.append(("close", self.current_device))
        del self.opened[ptr]

    def memcpy(self, dst, src, size, kind):
        self.calls.append(("memcpy", kind, self.current_device))
        ctypes.memmove(dst, src, size)


def fake_cupy(runtime: FakeRuntime):
    @contextlib.contextmanager
    def device(i):
        before, runtime.current_device = runtime.current_device, i
        try:
            yield
        finally:
            runtime.current_device = before

    cuda = types.SimpleNamespace(runtime=runtime, Device=device)
    return types.SimpleNamespace(cuda=cuda)


@pytest.fixture
def runtime(monkeypatch):
    rt = FakeRuntime()
    monkeypatch.setitem(sys.modules, "cupy", fake_cupy(rt))
    return rt


def test_open_read_write_close_through_cupy(runtime):
    handle = runtime.export(bytes(range(32)))
    regions = CudaRegions(CupyIpcOpener(gpu_ids=lambda: (0, 1)))
    regions.register("r", handle, 1, 32)
    region = regions.get("r")
    assert region.read(4, 8) == bytes(range(4, 12))
    region.mapping.memory.write(30, memoryview(b"\xff\xfe"))
    assert runtime.buffers[handle].raw[28:32] == bytes([28, 29, 0xFF, 0xFE])
    assert ("open", 1) in runtime.calls
    assert ("memcpy", FakeRuntime.memcpyDeviceToHost, 1) in runtime.calls
    assert ("memcpy", FakeRuntime.memcpyHostToDevice, 1) in runtime.calls
    regions.unregister("r")
    del region
    assert runtime.opened == {} and runtime.calls[-1] == ("close", 1)


def test_bad_handle_and_bad_device(runtime):
    regions = CudaRegions(CupyIpcOpener(gpu_ids=lambda: (0,)))
    with pytest.raises(KernelError) as info:
        regions.register("r", b"\x09" * 64, 0, 16)
    assert info.value.code == ErrorCode.INVALID_ARG
    assert info.value.message.startswith("failed to open CUDA IPC handle: ")
    with pytest.raises(KernelError) as info:
        regions.register("r", runtime.export(b"x" * 16), 3, 16)
    assert info.value.message == "failed to register CUDA shared memory region: 'r', invalid device id 3"
    assert regions.status() == []


class NeverOpens:
    def open(self, *args):
        raise AssertionError("a request that fails the registry's checks reached the opener")


@pytest.mark.parametrize("name,handle,device_id,byte_size,message", [
    ("", b"\0" * 64, 0, 16, "'region name' is necessary to register cuda shared memory region"),
    ("r", b"\0" * 63, 0, 16, "'raw_handle' must be a valid base64 encoded cudaIpcMemHandle_t"),
    ("r", b"\0" * 64, -1, 16, "failed to register CUDA shared memory region 'r': device_id must be >= 0"),
    ("r", b"\0" * 64, 0, 0, "failed to register CUDA shared memory region 'r': byte_size must be greater than 0"),
])
def test_registry_checks_come_before_the_open(name, handle, device_id, byte_size, message):
    """gRPC hands these over unchecked (int64 device_id, any bytes), so the registry checks them."""
    with pytest.raises(KernelError) as info:
        CudaRegions(NeverOpens()).register(name, handle, device_id, byte_size)
    assert (info.value.code, info.value.message) == (ErrorCode.INVALID_ARG, message)
