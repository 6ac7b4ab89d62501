"""GPU tensors in a worker: handed to other processes as CUDA IPC handles, and opened from them.

Out: a GPU output (a pb_utils.Tensor over a CuPy array, from `Tensor.from_dlpack` of a CuPy or
torch CUDA array) whose consumer can take device memory (the request's `device_outputs`) is copied
device to device, at hand-over, into memory this worker owns (`DeviceArena`: blocks of cudaMalloc
sub-allocated here), and leaves as that block's IPC handle plus offset, size and device, with a
token. The memory is freed when the front sends the token back (DeviceRelease): the last
consumer (a client's CUDA region, a BLS caller, an ensemble step) let go of it. Any other GPU output
is copied to the host (responses.host_array) and travels through the arena as before.

Why always copy out, even device to device: an answer is fixed when the model hands it over
(handover.py). For host outputs the worker can count who still reaches the memory; a GPU
tensor's memory belongs to whatever framework made it (the DLPack capsule's owner, a CuPy pool
block, a torch caching-allocator block), which the worker cannot see, and a model that keeps the
array, or the framework that reuses the block for its next allocation, would change an answer
already handed over. One device-to-device copy (about 45 us for 64 MiB on an H100) is the price;
the copy runs on the current stream (the null stream unless the model set one, ordered after
the model's work on blocking streams) and is waited for before the message leaves. A model that
computes on a non-blocking stream of its own synchronizes it before handing over, as any
cross-stream use needs.

In: a GPU input (`Tensor.ipc`) is opened here (IpcMappings, counted per handle; a handle the front
marks `keep`, a client's CUDA region or another worker's permanent block, stays open from one
request to the next until that front's DeviceUnmap) and given to the
model as a CuPy array over that memory, without a copy, when the model takes GPU inputs
(FORCE_CPU_ONLY_INPUT_TENSORS "no", or a BLS caller that may take GPU outputs); the front's loan
goes back (DeviceRelease) when the model's last array over it is gone. A model that takes CPU
inputs (the default) gets a host copy made here, and the loan goes back at once. The array is the
producer's memory: every consumer of one ensemble tensor sees the same bytes, so a model must not
write into a GPU input it shares. An input this worker exported itself (an ensemble whose steps
run on one instance) is used in place: a process cannot open its own handle.

Where CuPy is missing, built for ROCm/HIP, or sees no device, nothing of this is used: GPU outputs
go through host memory, with one log line saying why. A CPU-only worker imports none of it: this
module imports CuPy only when a GPU tensor is in hand.
"""

from __future__ import annotations

import importlib.util
import logging
import threading
import time
from typing import Optional

import numpy as np

from kernel.backends.python import messages, wire
from kernel.backends.python.arena import FreeList
from kernel.core.device_memory import IpcMappings
from kernel.core.gpu import visible_gpu_ids

log = logging.getLogger("kernel.worker")

MEMCPY_HOST_TO_DEVICE, MEMCPY_DEVICE_TO_HOST, MEMCPY_DEVICE_TO_DEVICE = 1, 2, 3
BLOCK_BYTES = 64 << 20  # one cudaMalloc per device to start with; larger tensors get their own block
ALIGN = 512
IDLE_BLOCK_SECONDS = 5.0  # a grown block wholly free this long is given back (at the next alloc/free)

# Bytes this process copied, by direction (tests and the GPU check read them: a GPU tensor passed
# between models must add nothing to device_to_host).
COPIED = {"device_to_host": 0, "device_to_device": 0, "host_to_device": 0}


class InputError(ValueError):
    """A GPU input that cannot be opened here: fails its request (not the client's fault)."""

    code = "UNAVAILABLE"


# ---- the process's state: bound to its worker, CuPy probed on first need ---------------------------

_worker = None
_gpu_inputs = False  # FORCE_CPU_ONLY_INPUT_TENSORS is "no": GPU inputs reach execute on the GPU
_support: "GpuSupport | str | None" = None  # GpuSupport, or why GPU tensors go through host memory
_probe_lock = threading.Lock()


def bind(worker, config: dict) -> None:
    """The worker and its model config (FORCE_CPU_ONLY_INPUT_TENSORS); no CuPy yet."""
    global _worker, _gpu_inputs
    _worker = worker
    param = (config.get("parameters") or {}).get("FORCE_CPU_ONLY_INPUT_TENSORS") or {}
    _gpu_inputs = param.get("string_value") == "no"


def gpu_inputs() -> bool:
    return _gpu_inputs


def support() -> "Optional[GpuSupport]":
    """GpuSupport once CuPy is seen to work with CUDA; None (after one log line) where it does not."""
    global _support
    if _support is None:
        with _probe_lock:
            if _support is None:
                _support = _probe()
    return _support if isinstance(_support, GpuSupport) else None


def loaded() -> bool:
    """GPU tensors are in use here already (CuPy was probed and works): no import to pay for."""
    return isinstance(_support, GpuSupport)


def _probe():
    name = getattr(_worker, "instance_name", "?")
    if not visible_gpu_ids():  # (no import of CuPy where there is no GPU, even when it is installed)
        reason = "no GPU is visible to this process"
    else:
        reason = _probe_cupy()
        if not isinstance(reason, str):
            return reason
    log.warning("GPU tensors of model instance '%s' go through host memory: %s", name, reason)
    return reason


def _probe_cupy():
    try:
        import cupy  # the [gpu] extra: only reached with a GPU tensor in hand, or a BLS asking for one
    except ImportError:
        reason = "CuPy is not installed"
    else:
        try:
            if getattr(cupy.cuda.runtime, "is_hip", False):
                reason = "CuPy is built for ROCm/HIP; tensors cross processes as CUDA IPC handles only"
            elif cupy.cuda.runtime.getDeviceCount() < 1:
                reason = "no CUDA device is visible"
            else:
                return GpuSupport(cupy)
        except Exception as exc:  # noqa: BLE001 - CUDARuntimeError: no driver, no device
            reason = f"CUDA is not usable ({exc})"
    return reason


def warm(kind: str, device: int) -> None:
    """A KIND_GPU instance at load: CuPy imported, the CUDA context made on its device, the first
    device block allocated and its IPC handle taken, one device copy run, so the first GPU tensor
    costs a copy, not CUDA's set-up (a first BLS call with a 4 MiB GPU tensor took 411 ms on an
    H200, later ones a few). Runs beside the model's initialize; the instance is ready when both
    are done. Nothing where CuPy is not installed (the first GPU tensor then says why, as before);
    a failure here is logged and leaves set-up to the first use."""
    if kind != "GPU" or importlib.util.find_spec("cupy") is None:
        return
    gpu = support()
    if gpu is None:
        return
    try:
        gpu.warm(device)
    except Exception as exc:  # noqa: BLE001 - CUDARuntimeError: the first GPU tensor will tell
        log.warning("model instance '%s': CUDA could not be set up at load on GPU %d: %s",
                    getattr(_worker, "instance_name", "?"), device, exc)


def count(direction: str, nbytes: int) -> None:
    COPIED[direction] += nbytes


# ---- what the rest of the worker calls ---------------------------------------------------------------


def export_tensor(tensor) -> Optional[messages.Tensor]:
    """`tensor`'s GPU array as an IPC-handle message (copied device to device into this worker's
    memory); None when it is not a CUDA array or GPU support is off (the caller copies to host)."""
    arr = tensor._array
    if not hasattr(arr, "__cuda_array_interface__") or not arr.nbytes:
        return None
    gpu = support()
    return gpu.export(tensor._name, tensor._datatype, arr) if gpu is not None else None


def open_input(t: messages.Tensor, on_gpu: bool, keeper: int = 0):
    """The model's array for GPU tensor `t`: a CuPy array over the lent memory (on_gpu), else a
    host copy. InputError (the request fails, nothing else) when it cannot be opened here.
    `keeper`: the front it came from (0: the primary; else its link's serial), which keeps a
    client region's mapping open here until it sends DeviceUnmap (`unmap`)."""
    gpu = support()
    if gpu is None:
        raise InputError(f"input '{t.name}' is a GPU tensor (a CUDA IPC handle) and this model instance cannot "
                         f"open it: {_support}")
    return gpu.open(t, on_gpu, keeper if t.keep else None)


def unmap(msg: messages.DeviceUnmap, keeper: int = 0) -> None:
    """DeviceUnmap from a front: it no longer has these client regions registered."""
    if isinstance(_support, GpuSupport):
        for handle, device in zip(msg.handles, msg.devices):
            _support.mappings.forget(handle, device, keeper)


def link_closed(keeper: int) -> None:
    """A front's link is gone: the client regions it kept open here are closed once unused."""
    if isinstance(_support, GpuSupport):
        _support.mappings.forget_keeper(keeper)


def to_device(arr: np.ndarray, device: int):
    """A host array copied to GPU `device` (a BLS output its caller prefers on the GPU); the host
    array itself when GPU support is off."""
    gpu = support()
    return gpu.to_device(arr, device) if gpu is not None else arr


def free(tokens) -> None:
    """DeviceRelease from the front: these exports have no holder left."""
    if isinstance(_support, GpuSupport):
        _support.arena.free(tokens)


def give_back(token: int) -> None:
    """A loan of the front's that the model never got (a request that failed first): give it back."""
    if token:
        _returns.add(token)


class _Returns:
    """Loans to give back to the front, one DeviceRelease per loop iteration (from any thread)."""

    def __init__(self):
        self._tokens: list[int] = []
        self._lock = threading.RLock()  # leases give back from __del__, maybe inside this very section
        self._scheduled = False

    def add(self, token: int) -> None:
        worker = _worker
        with self._lock:
            self._tokens.append(token)
            if self._scheduled or worker is None or worker.loop is None:
                return
            self._scheduled = True
        try:
            worker.loop.call_soon_threadsafe(self._flush)
        except RuntimeError:  # the loop is closed: the worker is exiting
            pass

    def _flush(self) -> None:
        with self._lock:
            tokens, self._tokens = self._tokens, []
            self._scheduled = False
        if tokens:
            try:
                _worker.send_device_release(tokens)  # (each to the front that lent it)
            except (ConnectionError, AttributeError):
                pass


_returns = _Returns()


# ---- device memory this worker owns: exports -------------------------------------------------------


class _Block:
    __slots__ = ("memory", "ptr", "size", "device", "handle", "free_list", "idle_since")

    def __init__(self, cupy, device: int, size: int):
        with cupy.cuda.Device(device):
            self.memory = cupy.cuda.Memory(size)  # its own cudaMalloc: the IPC handle names exactly it
            self.handle = bytes(cupy.cuda.runtime.ipcGetMemHandle(self.memory.ptr))
        self.ptr = self.memory.ptr
        self.size = size
        self.device = device
        self.free_list = FreeList(size)
        self.idle_since = 0.0

    def alloc(self, nbytes: int) -> int:
        return self.free_list.alloc(nbytes)

    def free(self, off: int, nbytes: int) -> None:
        self.free_list.free(off, nbytes)

    @property
    def empty(self) -> bool:
        return self.free_list.whole(self.size)


class DeviceArena:
    """Exports of this worker: blocks of device memory per GPU, first-fit, freed by token.

    Thread-safe: outputs are exported on whichever thread hands them over, DeviceRelease arrives
    on the loop. The first block of each device stays for the life of the process; a grown block
    wholly free for IDLE_BLOCK_SECONDS is given back at the next alloc or free (no timer).
    """

    def __init__(self, cupy, block_bytes: int = BLOCK_BYTES):
        self._cupy = cupy
        self._block_bytes = block_bytes
        self._blocks: dict[int, list[_Block]] = {}
        self._live: dict[int, tuple[_Block, int, int]] = {}  # token -> (block, offset, size)
        self._next = 1
        self._lock = threading.Lock()

    def reserve(self, device: int) -> _Block:
        """The device's first block (made now if there is none yet: cudaMalloc and its IPC handle)."""
        with self._lock:
            blocks = self._blocks.setdefault(device, [])
            if not blocks:
                blocks.append(_Block(self._cupy, device, self._block_bytes))
            return blocks[0]

    def alloc(self, device: int, nbytes: int) -> tuple[_Block, int, int]:
        size = -(-max(nbytes, 1) // ALIGN) * ALIGN
        with self._lock:
            blocks = self._blocks.setdefault(device, [])
            self._trim(blocks)
            for block in blocks:
                off = block.alloc(size)
                if off >= 0:
                    break
            else:
                block = _Block(self._cupy, device, max(self._block_bytes, size))
                blocks.append(block)
                off = block.alloc(size)
            block.idle_since = 0.0
            token = self._next
            self._next += 1
            self._live[token] = (block, off, size)
            return block, off, token

    def free(self, tokens) -> None:
        with self._lock:
            for token in tokens:
                entry = self._live.pop(token, None)
                if entry is None:
                    continue  # not ours (a token of an earlier worker of this instance): ignored
                block, off, size = entry
                block.free(off, size)
                if block.empty:
                    block.idle_since = time.monotonic()
            for blocks in self._blocks.values():
                self._trim(blocks)

    def _trim(self, blocks: list[_Block]) -> None:
        now = time.monotonic()
        for block in blocks[1:]:
            if block.idle_since and now - block.idle_since >= IDLE_BLOCK_SECONDS:
                blocks.remove(block)  # its Memory is freed (cudaFree) with the last reference

    def permanent(self, block: _Block) -> bool:
        """Whether `block` stays for the life of the process (the first of its device)."""
        blocks = self._blocks.get(block.device)
        return bool(blocks) and blocks[0] is block

    def own(self, handle: bytes, device: int) -> Optional[_Block]:
        """The block `handle` names, when it is one of this worker's own."""
        for block in self._blocks.get(device, ()):
            if block.handle == handle:
                return block
        return None

    @property
    def live(self) -> int:
        """Exports not yet given back (tests, diagnostics)."""
        return len(self._live)


# ---- CuPy at work ----------------------------------------------------------------------------------


class _Lease:
    """Owner of a CuPy array over lent memory: when the model's last array is gone, the mapping is
    closed (counted) and the loan given back to the front."""

    __slots__ = ("gpu", "handle", "device", "token", "mapped")

    def __init__(self, gpu: "GpuSupport", handle: bytes, device: int, token: int, mapped: bool):
        self.gpu, self.handle, self.device, self.token, self.mapped = gpu, handle, device, token, mapped

    def __del__(self) -> None:
        try:
            if self.mapped:
                self.gpu.mappings.release(self.handle, self.device)
            give_back(self.token)
        except Exception:  # noqa: BLE001 - at collection time nothing may raise
            pass


class GpuSupport:
    def __init__(self, cupy):
        self.cupy = cupy
        self.arena = DeviceArena(cupy)
        self.mappings = IpcMappings(cupy)

    def warm(self, device: int) -> None:
        """CUDA set up for `device` in this process (see `warm`): context, first block, one copy."""
        cupy = self.cupy
        block = self.arena.reserve(device)
        with cupy.cuda.Device(device):
            stream = cupy.cuda.get_current_stream()
            cupy.cuda.runtime.memcpyAsync(block.ptr + ALIGN, block.ptr, ALIGN, MEMCPY_DEVICE_TO_DEVICE, stream.ptr)
            stream.synchronize()

    def export(self, name: str, datatype: str, arr) -> messages.Tensor:
        cupy = self.cupy
        if not arr.flags.c_contiguous:
            arr = cupy.ascontiguousarray(arr)
        nbytes = arr.nbytes
        device = arr.device.id
        block, off, token = self.arena.alloc(device, nbytes)
        try:
            with cupy.cuda.Device(device):
                stream = cupy.cuda.get_current_stream()
                cupy.cuda.runtime.memcpyAsync(block.ptr + off, arr.data.ptr, nbytes, MEMCPY_DEVICE_TO_DEVICE, stream.ptr)
                stream.synchronize()
        except BaseException:
            self.arena.free([token])
            raise
        count("device_to_device", nbytes)
        # keep: the first block lives as long as this process, so consumers may keep its handle open
        return messages.Tensor(name, datatype, list(arr.shape), None, -1, off, nbytes, -1, block.handle, device, token,
                               self.arena.permanent(block))

    def open(self, t: messages.Tensor, on_gpu: bool, keeper=None):
        cupy = self.cupy
        dtype = wire.NUMERIC_DTYPES.get(t.datatype)
        if dtype is None:
            raise InputError(f"input '{t.name}' of datatype {t.datatype} cannot be a GPU tensor")
        if t.device < 0 or t.offset < 0 or t.nbytes != int(np.prod(t.shape, dtype=np.int64)) * dtype.itemsize:
            raise InputError(f"input '{t.name}': a GPU tensor's location does not match its shape")
        own = self.arena.own(t.ipc, t.device)
        if own is not None:
            base = own.ptr
        else:
            try:
                base = self.mappings.acquire(t.ipc, t.device, keeper)
            except Exception as exc:  # noqa: BLE001 - CUDARuntimeError: its producer exited, a foreign handle
                raise InputError(f"input '{t.name}' is a GPU tensor that could not be opened (its producer may have "
                                 f"exited): {exc}") from None
        if not on_gpu:
            try:
                host = np.empty(t.nbytes, np.uint8)
                with cupy.cuda.Device(t.device):
                    cupy.cuda.runtime.memcpy(host.ctypes.data, base + t.offset, t.nbytes, MEMCPY_DEVICE_TO_HOST)
                count("device_to_host", t.nbytes)
            finally:
                if own is None:
                    self.mappings.release(t.ipc, t.device)
            give_back(t.token)
            return host.view(dtype).reshape(t.shape)
        lease = _Lease(self, t.ipc, t.device, t.token, own is None)
        memory = cupy.cuda.UnownedMemory(base + t.offset, t.nbytes, lease, t.device)
        return cupy.ndarray(tuple(t.shape), dtype, memptr=cupy.cuda.MemoryPointer(memory, 0))

    def to_device(self, arr: np.ndarray, device: int):
        with self.cupy.cuda.Device(device):
            out = self.cupy.asarray(arr)
        count("host_to_device", arr.nbytes)
        return out
