"""A stand-in for CuPy whose "device memory" is host memory shared between processes.

Why: the GPU tensor protocol (kernel.core.device_memory, backends/python/gpu_worker.py and
gpu_front.py) opens CUDA IPC handles in other processes, copies device to device and gives memory
back when the last consumer lets go. Those rules are what break, and they need no GPU to check, only
an API that behaves like CuPy's across processes. So each `cuda.Memory` here is a memfd mapped into
this process; its "IPC handle" names the owning process and descriptor, and `ipcOpenMemHandle` in
another process maps the same memfd through /proc/<pid>/fd (same user), so cross-process opens,
closes and a producer's death really happen: after the exporting process exits, a handle can no
longer be opened (mappings already open stay valid, as the memfd does). Opening a handle in the
process that exported it fails, as it does with CUDA.

Only the API surface Kernel and the tests' models use is here: cuda.Device, cuda.Memory,
cuda.UnownedMemory, cuda.MemoryPointer, cuda.Stream / get_current_stream, cuda.runtime (device
count, IPC get/open/close, memcpy, memcpyAsync, is_hip), ndarray with __cuda_array_interface__ and
DLPack, asarray / asnumpy / from_dlpack and a little arithmetic (computed on the host copy, which is
the device memory here, so it counts as no transfer).

Every copy is appended to the file named by FAKE_CUPY_LOG (one "pid kind nbytes" line, kind one of
h2d d2h d2d), and every allocation, IPC open and close too (with the allocation's size), so a test
can count host copies and handle opens across the server's processes. The first call of a process
that needs a CUDA context (an allocation, a copy, an IPC call) logs "context" once: when a process
set CUDA up. Environment: FAKE_CUPY_DEVICES (default 1), FAKE_CUPY_HIP=1 (a ROCm build),
FAKE_CUPY_CONTEXT_S (seconds that first call takes, as CUDA's set-up does; default 0).
"""

from __future__ import annotations

import ctypes
import mmap
import os
import struct
import threading
import time
import types
import weakref

import numpy as np

__version__ = "0.0-fake"

_LOG = os.environ.get("FAKE_CUPY_LOG")
_MAGIC = b"FAKECUDA"


def _log(event: str, nbytes: int = 0) -> None:
    if _LOG:
        fd = os.open(_LOG, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            os.write(fd, f"{os.getpid()} {event} {nbytes}\n".encode())
        finally:
            os.close(fd)


class CUDARuntimeError(RuntimeError):
    pass


_context_made = False


def _context() -> None:
    """CUDA makes a process's context on its first call that needs one: logged, and as slow as asked."""
    global _context_made
    if not _context_made:
        _context_made = True
        _log("context")
        time.sleep(float(os.environ.get("FAKE_CUPY_CONTEXT_S", "0")))


def _address(m: mmap.mmap) -> int:
    probe = ctypes.c_char.from_buffer(m)
    addr = ctypes.addressof(probe)
    del probe
    return addr


# ---- allocations and IPC ---------------------------------------------------------------------------

_lock = threading.RLock()
# base pointer -> live Memory of this process (weakly: an allocation is freed when its last user lets go)
_allocations: "weakref.WeakValueDictionary[int, Memory]" = weakref.WeakValueDictionary()
_opened: dict[bytes, list] = {}  # handle -> [pointer, opens, mmap]
_opened_by_ptr: dict[int, bytes] = {}
_local = threading.local()


def _device_count() -> int:
    return int(os.environ.get("FAKE_CUPY_DEVICES", "1"))


class Device:
    def __init__(self, device=None):
        if device is None:
            device = getattr(_local, "device", 0)
        self.id = int(getattr(device, "id", device))

    def __enter__(self):
        if not 0 <= self.id < _device_count():
            raise CUDARuntimeError("cudaErrorInvalidDevice: invalid device ordinal")
        self._before = getattr(_local, "device", 0)
        _local.device = self.id
        return self

    def __exit__(self, *exc):
        _local.device = self._before
        return False

    def use(self):
        _local.device = self.id

    def synchronize(self):
        pass

    def __repr__(self):
        return f"<CUDA Device {self.id}>"


class Memory:
    """cudaMalloc: a memfd of its own, mapped here."""

    def __init__(self, size: int):
        _context()
        self.size = size
        self.device_id = getattr(_local, "device", 0)
        self._fd = os.memfd_create("fake-cuda", os.MFD_CLOEXEC)
        os.ftruncate(self._fd, max(size, 1))
        self._map = mmap.mmap(self._fd, max(size, 1))
        self.ptr = _address(self._map)
        with _lock:
            _allocations[self.ptr] = self
        _log("malloc", size)

    def __del__(self):
        try:
            with _lock:
                _allocations.pop(self.ptr, None)
            self._map.close()
            os.close(self._fd)
            _log("free", self.size)
        except Exception:  # noqa: BLE001
            pass


class UnownedMemory:
    def __init__(self, ptr: int, size: int, owner, device_id: int = -1):
        self.ptr = ptr
        self.size = size
        self.owner = owner
        self.device_id = device_id if device_id >= 0 else getattr(_local, "device", 0)


class MemoryPointer:
    def __init__(self, mem, offset: int):
        self.mem = mem
        self.ptr = mem.ptr + offset
        self.device_id = mem.device_id
        self.device = Device(mem.device_id)


class Stream:
    null = None

    def __init__(self, null=False, non_blocking=False, ptds=False):
        self.ptr = 0

    def synchronize(self):
        pass

    def use(self):
        return self


Stream.null = Stream(null=True)


def get_current_stream():
    return Stream.null


def _allocation_of(ptr: int) -> "Memory":
    with _lock:
        for base, mem in list(_allocations.items()):
            if base <= ptr < base + max(mem.size, 1):
                return mem
    raise CUDARuntimeError("cudaErrorInvalidValue: invalid argument (not a device allocation of this process)")


class _Runtime(types.SimpleNamespace):
    CUDARuntimeError = CUDARuntimeError
    memcpyHostToHost, memcpyHostToDevice, memcpyDeviceToHost, memcpyDeviceToDevice, memcpyDefault = 0, 1, 2, 3, 4
    cudaIpcMemLazyEnablePeerAccess = 1

    @property
    def is_hip(self):
        return os.environ.get("FAKE_CUPY_HIP") == "1"

    @staticmethod
    def getDeviceCount():
        return _device_count()

    @staticmethod
    def getDevice():
        return getattr(_local, "device", 0)

    @staticmethod
    def deviceSynchronize():
        pass

    @staticmethod
    def getDeviceProperties(device: int) -> dict:
        return {"name": b"fake CuPy device (host memory)"}

    @staticmethod
    def ipcGetMemHandle(ptr: int) -> bytes:
        _context()
        mem = _allocation_of(ptr)
        body = _MAGIC + struct.pack("<iiqi", os.getpid(), mem._fd, mem.size, mem.device_id)
        return body + b"\0" * (64 - len(body))

    @staticmethod
    def ipcOpenMemHandle(handle: bytes, flags: int = 1) -> int:
        _context()
        handle = bytes(handle)
        if len(handle) != 64 or not handle.startswith(_MAGIC):
            raise CUDARuntimeError("cudaErrorInvalidValue: invalid argument")
        pid, fd, size, _device = struct.unpack_from("<iiqi", handle, len(_MAGIC))
        if pid == os.getpid():
            raise CUDARuntimeError("cudaErrorInvalidContext: invalid device context (a process cannot open its own handle)")
        with _lock:
            entry = _opened.get(handle)
            if entry is not None:
                entry[1] += 1
                return entry[0]
            try:
                f = os.open(f"/proc/{pid}/fd/{fd}", os.O_RDWR)
            except OSError:
                raise CUDARuntimeError("cudaErrorMapBufferObjectFailed: mapping of buffer object failed") from None
            try:
                m = mmap.mmap(f, max(size, 1))
            finally:
                os.close(f)
            ptr = _address(m)
            _opened[handle] = [ptr, 1, m]
            _opened_by_ptr[ptr] = handle
        _log("ipc_open", size)
        return ptr

    @staticmethod
    def ipcCloseMemHandle(ptr: int) -> None:
        with _lock:
            handle = _opened_by_ptr.get(ptr)
            if handle is None:
                raise CUDARuntimeError("cudaErrorInvalidValue: invalid argument")
            entry = _opened[handle]
            entry[1] -= 1
            if entry[1]:
                return
            del _opened[handle], _opened_by_ptr[ptr]
            size = len(entry[2])
            entry[2].close()
        _log("ipc_close", size)

    @staticmethod
    def memcpy(dst: int, src: int, size: int, kind: int) -> None:
        _context()
        ctypes.memmove(dst, src, size)
        _log({1: "h2d", 2: "d2h", 3: "d2d", 4: "d2d"}.get(kind, "h2h"), size)

    @staticmethod
    def memcpyAsync(dst: int, src: int, size: int, kind: int, stream: int = 0) -> None:
        _Runtime.memcpy(dst, src, size, kind)


runtime = _Runtime()
cuda = types.SimpleNamespace(
    Device=Device, Memory=Memory, UnownedMemory=UnownedMemory, MemoryPointer=MemoryPointer, Stream=Stream,
    get_current_stream=get_current_stream, runtime=runtime,
)


def open_count() -> int:
    """Handles this process has open (tests)."""
    return len(_opened)


# ---- arrays ----------------------------------------------------------------------------------------


class _Flags:
    c_contiguous = True
    f_contiguous = False


class _Capsule:
    """What __dlpack__ returns here (not a real PyCapsule): the array it came from."""

    def __init__(self, array):
        self.array = array


class ndarray:
    def __init__(self, shape, dtype=np.float64, memptr=None):
        self.shape = tuple(shape) if isinstance(shape, (tuple, list)) else (int(shape),)
        self.dtype = np.dtype(dtype)
        self.size = int(np.prod(self.shape, dtype=np.int64))
        nbytes = self.size * self.dtype.itemsize
        if memptr is None:
            memptr = MemoryPointer(Memory(nbytes), 0)
        self.data = memptr
        buf = (ctypes.c_char * max(nbytes, 1)).from_address(memptr.ptr)
        self._host = np.frombuffer(buf, self.dtype, count=self.size).reshape(self.shape)

    nbytes = property(lambda self: self.size * self.dtype.itemsize)
    ndim = property(lambda self: len(self.shape))
    flags = _Flags()
    device = property(lambda self: Device(self.data.device_id))

    @property
    def __cuda_array_interface__(self):
        return {"shape": self.shape, "typestr": self.dtype.str, "data": (self.data.ptr, False), "version": 3,
                "strides": None}

    def __dlpack_device__(self):
        return (2, self.data.device_id)

    def __dlpack__(self, stream=None, **kwargs):
        return _Capsule(self)

    def get(self) -> np.ndarray:
        _log("d2h", self.nbytes)
        return self._host.copy()

    def reshape(self, *shape):
        shape = shape[0] if len(shape) == 1 and isinstance(shape[0], (tuple, list)) else shape
        return ndarray(np.empty(self.shape)[...].reshape(shape).shape, self.dtype, self.data)

    def fill(self, value) -> None:
        self._host[...] = value

    def __setitem__(self, index, value) -> None:
        self._host[index] = _host(value)

    def __getitem__(self, index):
        return _device(self._host[index])

    def __len__(self):
        return self.shape[0]

    def __bool__(self):
        return bool(self._host)

    def __int__(self):
        return int(self._host)

    def __float__(self):
        return float(self._host)

    def _op(name):  # noqa: N805 - builds the operator methods below
        def op(self, other):
            return _device(getattr(self._host, name)(_host(other)))
        return op

    __add__, __sub__, __mul__, __truediv__ = _op("__add__"), _op("__sub__"), _op("__mul__"), _op("__truediv__")
    __radd__, __rmul__ = _op("__radd__"), _op("__rmul__")
    __eq__, __ne__ = _op("__eq__"), _op("__ne__")
    del _op

    def astype(self, dtype):
        return _device(self._host.astype(dtype))

    def copy(self):
        return _device(self._host.copy())

    def sum(self):
        return _device(np.asarray(self._host.sum()))

    def __repr__(self):
        return f"fake_cupy.ndarray({self._host!r})"


def _host(x):
    return x._host if isinstance(x, ndarray) else x


def _device(host) -> ndarray:
    """A new device array holding `host`'s values (device compute: no transfer logged)."""
    host = np.ascontiguousarray(host)
    out = ndarray(host.shape, host.dtype)
    out._host[...] = host
    return out


def asarray(a, dtype=None):
    if isinstance(a, ndarray):
        return a if dtype is None else a.astype(dtype)
    host = np.ascontiguousarray(np.asarray(a, dtype=dtype))
    out = ndarray(host.shape, host.dtype)
    ctypes.memmove(out.data.ptr, host.ctypes.data, host.nbytes)
    _log("h2d", host.nbytes)
    return out


def asnumpy(a):
    return a.get() if isinstance(a, ndarray) else np.asarray(a)


def ascontiguousarray(a):
    return a


def from_dlpack(x):
    """A view of x's memory (no copy), as CuPy's from_dlpack gives."""
    if not isinstance(x, ndarray):
        capsule = x.__dlpack__() if hasattr(x, "__dlpack__") else x
        if not isinstance(capsule, _Capsule):
            raise TypeError("fake cupy.from_dlpack takes fake CuPy arrays only")
        x = capsule.array
    return ndarray(x.shape, x.dtype, x.data)


def all(a):  # noqa: A001 - CuPy's name
    return _device(np.asarray(np.all(_host(a))))


def arange(*args, dtype=None):
    return _device(np.arange(*args, dtype=dtype))


def zeros(shape, dtype=np.float64):
    return _device(np.zeros(shape, dtype))


def empty(shape, dtype=np.float64):
    return ndarray(shape, dtype)


def ones(shape, dtype=np.float64):
    return _device(np.ones(shape, dtype))


def empty_like(a):
    return ndarray(a.shape, a.dtype)


class _Generator:
    def __init__(self, seed):
        self._rng = np.random.default_rng(seed)

    def random(self, size, dtype=np.float64):
        return _device(self._rng.random(size, dtype=dtype))


random = types.SimpleNamespace(default_rng=_Generator)


float16, float32, float64 = np.float16, np.float32, np.float64
int8, int16, int32, int64, uint8, uint16, bool_ = np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.bool_
