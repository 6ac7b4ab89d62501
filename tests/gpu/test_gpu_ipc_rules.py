"""The release rules of GPU tensors, piece by piece, with the CuPy stand-in (tests/gpu/fake_cupy).

test_gpu_ipc_fake.py runs the whole protocol in a real server; these pin the rules it rests on,
where a server cannot reach them on purpose: a producer that dies between making a tensor and a
consumer opening it, a handle whose process is gone, a worker that receives its own export, and
the worker's device arena giving memory back. The stand-in is loaded as a module of its own
(GpuSupport and IpcMappings take it as an argument): this process never imports `cupy`.
"""

from __future__ import annotations

import asyncio
import importlib.util
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from kernel.backends.python import gpu_worker, messages
from kernel.backends.python.gpu_front import DeviceTensors
from kernel.core.device_memory import ALL_OUTPUTS, DeviceBuffer, IpcMappings, Lifetime, device_ok, wire_form
from kernel.core.errors import ErrorCode, KernelError
from kernel.core.request import InferTensor

FAKE = Path(__file__).resolve().parent / "fake_cupy" / "cupy" / "__init__.py"


@pytest.fixture(scope="module")
def fake():
    spec = importlib.util.spec_from_file_location("fake_cupy_rules", FAKE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def exporter(nbytes: int = 64, exit_after: bool = False):
    """Another process that allocates "device memory", fills it with 0..n-1 and prints its handle;
    it stays until its stdin closes (or exits at once)."""
    code = (f"import importlib.util, sys\n"
            f"spec = importlib.util.spec_from_file_location('c', {str(FAKE)!r})\n"
            f"c = importlib.util.module_from_spec(spec); spec.loader.exec_module(c)\n"
            f"m = c.cuda.Memory({nbytes})\n"
            f"import ctypes; ctypes.memmove(m.ptr, bytes(range({nbytes})), {nbytes})\n"
            f"print(c.runtime.ipcGetMemHandle(m.ptr).hex(), flush=True)\n"
            + ("" if exit_after else "sys.stdin.read()\n"))
    proc = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    handle = bytes.fromhex(proc.stdout.readline().strip())
    if exit_after:
        proc.wait(10)
    return proc, handle


def test_device_outputs_rules():
    assert device_ok(ALL_OUTPUTS, "X") and device_ok({"X"}, "X")
    assert not device_ok(None, "X") and not device_ok({"Y"}, "X") and not device_ok(frozenset(), "X")
    assert wire_form(None) is False and wire_form(ALL_OUTPUTS) is True and wire_form({"b", "a"}) == ["a", "b"]
    # a host tensor's frame without the GPU fields still decodes; with them (ipc, device, token,
    # keep) it is 4 bytes longer
    import msgspec

    old = msgspec.msgpack.encode(["X", "FP32", [1], b"\0" * 4, -1, 0, 0, -1])
    plain = msgspec.msgpack.decode(old, type=messages.Tensor)
    assert plain.ipc is None and plain.token == 0 and plain.device == -1 and not plain.keep
    assert len(msgspec.msgpack.encode(plain)) == len(old) + 4


def test_a_buffer_whose_producer_is_gone_is_a_clear_error_not_a_read():
    async def run():
        class Instance:
            name, channel = "m_0_0", None

        tensors = DeviceTensors(Instance())
        t = tensors.unpack(messages.Tensor("OUT", "FP32", [4], None, -1, 0, 16, -1, b"\1" * 64, 0, 7))
        assert isinstance(t.device, DeviceBuffer) and t.nbytes == 16
        tensors.close("its process exited (killed)")
        with pytest.raises(KernelError) as info:
            t.raw  # a transport asking for the bytes after all
        assert info.value.code == ErrorCode.UNAVAILABLE
        assert info.value.message == ("GPU tensor from model instance 'm_0_0' is no longer available: "
                                      "its process exited (killed)")
        with pytest.raises(KernelError):
            DeviceTensors(Instance()).lend(t)  # handing it on to another worker
        return tensors

    tensors = asyncio.run(run())
    assert tensors.live == (0, 0)


@pytest.mark.parametrize("change", [{"nbytes": 12}, {"offset": -1}, {"device": -1}, {"ipc": b"\1" * 8},
                                    {"datatype": "BYTES"}])
def test_a_gpu_location_that_does_not_fit_its_tensor_is_refused(change):
    """What a worker says about its GPU tensor is checked as arena locations are: the front never
    copies more (or other) device memory than the tensor's shape and datatype describe."""
    class Instance:
        name, channel = "m_0_0", None

    fields = {"name": "OUT", "datatype": "FP32", "shape": [4], "data": None, "segment": -1, "offset": 0, "nbytes": 16,
              "owner": -1, "ipc": b"\1" * 64, "device": 0, "token": 1, **change}
    with pytest.raises(ValueError) as info:
        DeviceTensors(Instance()).unpack(messages.Tensor(**fields))
    assert "has a location that does not fit it" in str(info.value)


def test_front_releases_an_export_once_its_last_holder_is_gone():
    sent = []

    class Channel:
        closed = False

        def send(self, msg):
            sent.append(msg)

    class Instance:
        name, channel = "m_0_0", Channel()

    async def run():
        tensors = DeviceTensors(Instance())
        a = tensors.unpack(messages.Tensor("A", "FP32", [4], None, -1, 0, 16, -1, b"\1" * 64, 0, 1))
        b = tensors.unpack(messages.Tensor("B", "FP32", [4], None, -1, 512, 16, -1, b"\1" * 64, 0, 2))
        borrower = DeviceTensors(Instance())  # another worker's table: the loan keeps `a` alive
        lent = borrower.lend(InferTensor("IN", "FP32", [4], device=a.device))
        assert lent.ipc == b"\1" * 64 and lent.offset == 0 and lent.nbytes == 16 and lent.token == 1
        del a
        await asyncio.sleep(0)
        assert sent == []  # lent out: still held
        del b
        await asyncio.sleep(0)
        assert [m.tokens for m in sent] == [[2]]
        borrower.returned([lent.token])  # the borrowing worker's model dropped it
        await asyncio.sleep(0)
        assert [m.tokens for m in sent] == [[2], [1]]
        return tensors

    asyncio.run(run())


def test_worker_opens_another_process_handle_and_gives_it_back(fake, monkeypatch):
    proc, handle = exporter(64)
    returned = []
    monkeypatch.setattr(gpu_worker, "give_back", returned.append)
    try:
        gpu = gpu_worker.GpuSupport(fake)
        t = messages.Tensor("IN", "UINT8", [16], None, -1, 16, 16, -1, handle, 0, 9)
        arr = gpu.open(t, True)
        assert isinstance(arr, fake.ndarray) and list(arr.get()) == list(range(16, 32))
        assert gpu.mappings.open_count == 1 and returned == []
        view = fake.from_dlpack(arr)  # a view keeps the memory, and so the loan
        del arr
        assert returned == []
        del view
        assert returned == [9] and gpu.mappings.open_count == 0 and fake.open_count() == 0
        host = gpu.open(t, False)  # a model that takes CPU inputs: copied here, given back at once
        assert isinstance(host, np.ndarray) and list(host) == list(range(16, 32)) and returned == [9, 9]
    finally:
        proc.stdin.close()
        proc.wait(10)


def test_a_handle_whose_producer_exited_cannot_be_opened(fake):
    _, handle = exporter(64, exit_after=True)
    gpu = gpu_worker.GpuSupport(fake)
    with pytest.raises(gpu_worker.InputError) as info:
        gpu.open(messages.Tensor("IN", "UINT8", [16], None, -1, 0, 16, -1, handle, 0, 3), True)
    assert info.value.code == "UNAVAILABLE"
    assert str(info.value).startswith("input 'IN' is a GPU tensor that could not be opened (its producer may have exited)")


def test_a_worker_uses_its_own_export_in_place(fake):
    """An ensemble whose two steps run on one instance hands the worker its own export back: a
    process cannot open its own handle, so it must not try."""
    gpu = gpu_worker.GpuSupport(fake)
    src = fake.asarray(np.arange(8, dtype=np.float32))
    out = gpu.export("OUT", "FP32", src)
    assert out.ipc and out.nbytes == 32 and gpu.arena.live == 1
    back = gpu.open(messages.Tensor("IN", "FP32", [8], None, -1, out.offset, 32, -1, out.ipc, 0, 1), True)
    assert back.get().tolist() == list(range(8)) and gpu.mappings.open_count == 0
    src[...] = 0  # the export is a copy: the model changing its array afterwards changes no answer
    assert back.get().tolist() == list(range(8))


def test_device_arena_reuses_and_gives_back_grown_blocks(fake, monkeypatch):
    arena = gpu_worker.DeviceArena(fake, block_bytes=4096)
    a = arena.alloc(0, 4000)
    b = arena.alloc(0, 4000)  # does not fit the first block: a second one
    assert a[0] is not b[0] and arena.live == 2
    arena.free([a[2], b[2], 12345])  # an unknown token (an earlier worker's) is ignored
    assert arena.live == 0
    c = arena.alloc(0, 100)
    assert c[0] is a[0] and c[1] == 0  # first fit, from the start of the first block
    monkeypatch.setattr(gpu_worker, "IDLE_BLOCK_SECONDS", 0.0)
    arena.free([c[2]])
    assert len(arena._blocks[0]) == 1  # the idle grown block went back; the first one stays


def test_a_gpu_input_where_cupy_cannot_open_it_is_refused_with_the_reason(monkeypatch):
    monkeypatch.setattr(gpu_worker, "_support", "CuPy is not installed")
    with pytest.raises(gpu_worker.InputError) as info:
        gpu_worker.open_input(messages.Tensor("IN", "FP32", [4], None, -1, 0, 16, -1, b"\1" * 64, 0, 1), True)
    assert str(info.value) == ("input 'IN' is a GPU tensor (a CUDA IPC handle) and this model instance cannot open "
                               "it: CuPy is not installed")


def test_no_gpu_means_no_cupy_import(monkeypatch):
    """Where no GPU is visible the probe says so without importing CuPy, even if it is installed."""
    code = ("import sys, os; os.environ['KERNEL_GPU_IDS'] = ''\n"
            "from kernel.backends.python import gpu_worker\n"
            "print(gpu_worker.support(), gpu_worker._support, 'cupy' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "None no GPU is visible to this process False"
    assert "go through host memory: no GPU is visible to this process" in out.stderr


def test_ipc_mappings_open_a_handle_once_per_process(fake):
    proc, handle = exporter(64)
    try:
        table = IpcMappings(fake)
        p1, p2 = table.acquire(handle, 0), table.acquire(handle, 0)
        assert p1 == p2 and table.open_count == 1 and fake.open_count() == 1
        table.release(handle, 0)
        assert fake.open_count() == 1
        table.release(handle, 0)
        assert table.open_count == 0 and fake.open_count() == 0
    finally:
        proc.stdin.close()
        proc.wait(10)


def test_ipc_mappings_keep_a_handle_open_while_a_keeper_asks(fake, monkeypatch):
    """A client region's handle stays open between requests (opening costs hundreds of microseconds)
    until every keeper lets go: a front's DeviceUnmap, its link closing, or a Lifetime ending."""
    procs = [exporter(64) for _ in range(3)]
    (_, h1), (_, h2), (_, h3) = procs
    try:
        table = IpcMappings(fake)
        table.acquire(h1, 0, keeper=1)
        table.acquire(h1, 0, keeper=2)  # a second front (link) lends the same region
        table.release(h1, 0)
        table.release(h1, 0)
        assert fake.open_count() == 1, "a kept handle was closed after its last use"
        table.forget(h1, 0, 1)
        assert fake.open_count() == 1  # link 2 still has it registered
        table.acquire(h1, 0, keeper=2)
        table.forget_keeper(2)  # link 2 closed while a request still uses it: closed after that use
        assert fake.open_count() == 1
        table.release(h1, 0)
        assert fake.open_count() == 0 and table.open_count == 0

        lifetime = Lifetime()  # the front's side: a region's mapping, a worker generation
        table.acquire(h2, 0, keeper=lifetime)
        table.acquire(h2, 0, keeper=lifetime)
        table.release(h2, 0)
        table.release(h2, 0)
        assert fake.open_count() == 1
        lifetime.end()
        assert fake.open_count() == 0
        table.acquire(h2, 0, keeper=lifetime)  # an ended lifetime keeps nothing open
        table.release(h2, 0)
        assert fake.open_count() == 0

        monkeypatch.setattr(IpcMappings, "KEPT_IDLE", 1)  # past the bound the least recently used goes
        for handle in (h1, h2, h3):
            table.acquire(handle, 0, keeper=1)
            table.release(handle, 0)
        assert table.open_count == 1 and fake.open_count() == 1
        table.forget_keeper(1)
        assert fake.open_count() == 0
    finally:
        for proc, _ in procs:
            proc.stdin.close()
            proc.wait(10)
