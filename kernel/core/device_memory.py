"""GPU tensors that cross process boundaries as CUDA IPC handles: the core's side.

Why in the core: a GPU output of one model may go on to a CUDA shared-memory region, to a BLS
caller in another worker or to the next step of an ensemble, and the core (schedulers, the
shared-memory extension) is what hands tensors on. So a core tensor (`InferTensor.device`) can be
a `DeviceBuffer`: where the bytes lie in GPU memory (a 64-byte cudaIpcMemHandle_t naming an
allocation, an offset into it, a size, a device), not the bytes. Whoever needs them opens the
handle in its own process; only a transport writing them to a socket asks for a host copy (`raw`).

Which outputs may stay on the GPU is the consumer's choice, said per request
(`InferRequest.device_outputs`): outputs going to a CUDA shared-memory region, a BLS caller that can
take GPU tensors, an ensemble step's intermediate tensors. Every other output comes back in host
memory, copied where it was made (in the worker), so the front never copies on its loop.

Nothing here imports CuPy until a GPU buffer is actually read or copied (CPU machines never do):
the opening and copying is `IpcMappings` and the functions below it, on first use.

Lifetime: a `DeviceBuffer` is held by whatever core tensors refer to it. The backend that made it
watches it (a weak reference) and tells the producing process to free the memory once the last
holder is gone. If the producer dies first the buffer is marked `gone`, and a later read names
the reason instead of touching memory that may no longer exist.
"""

from __future__ import annotations

import threading
from typing import Callable, Optional

from kernel.core.errors import ErrorCode, KernelError

# Every output of the request may stay in device memory (InferRequest.device_outputs).
ALL_OUTPUTS = True

# cudaMemcpyKind values, as CuPy's runtime module names them.
MEMCPY_DEVICE_TO_HOST = 2
MEMCPY_DEFAULT = 4  # unified addressing: the runtime tells the direction (and peer copies) itself


class DeviceBuffer:
    """`nbytes` bytes at `offset` into the device allocation that `handle` names, on GPU `device`.

    `origin` says where it came from, for error messages ("model instance 'm_0_0'", "CUDA shared
    memory region 'r'"); `reader` copies it to the host (the default opens the handle with CuPy).
    """

    __slots__ = ("handle", "device", "offset", "nbytes", "origin", "gone", "_reader", "__weakref__")

    def __init__(self, handle: bytes, device: int, offset: int, nbytes: int, origin: str,
                 reader: Optional[Callable[["DeviceBuffer"], bytes]] = None):
        self.handle = handle
        self.device = device
        self.offset = offset
        self.nbytes = nbytes
        self.origin = origin
        self.gone: Optional[str] = None  # why the memory can no longer be read (its producer exited)
        self._reader = reader or read_to_host

    def __len__(self) -> int:
        return self.nbytes

    def check(self) -> None:
        """KernelError when the producer is gone: a consumer gets this instead of a crash."""
        if self.gone is not None:
            raise KernelError(ErrorCode.UNAVAILABLE, f"GPU tensor from {self.origin} is no longer available: {self.gone}")

    def to_host(self) -> bytes:
        """A host copy (a transport writing it to a socket, or a consumer that cannot open it)."""
        self.check()
        return self._reader(self) if self.nbytes else b""

    def release(self) -> None:
        """Held as a request's shared-memory window (kernel.core.shared_memory.RequestWindows): nothing to let go."""

    def __repr__(self) -> str:
        return f"DeviceBuffer({self.origin}, device {self.device}, {self.nbytes} bytes at {self.offset})"


def device_ok(device_outputs, name: str) -> bool:
    """Whether output `name` may stay in device memory under a request's `device_outputs`."""
    return device_outputs is ALL_OUTPUTS or (bool(device_outputs) and name in device_outputs)


def wire_form(device_outputs):
    """`device_outputs` as a message carries it: True, or a sorted list of names; False for none."""
    if not device_outputs:
        return False
    return True if device_outputs is ALL_OUTPUTS else sorted(device_outputs)


# ---- opening handles: CuPy, on first use ----------------------------------------------------------


def cupy_module():
    """CuPy (the [gpu] extra), imported now; KernelError when it is missing."""
    try:
        import cupy  # the [gpu] extra; only ever reached with a GPU tensor in hand
    except ImportError:
        raise KernelError(
            ErrorCode.UNAVAILABLE,
            "a GPU tensor cannot be read in this process: CuPy is not installed (kernel-inference-server[gpu])",
        ) from None
    return cupy


class IpcMappings:
    """CUDA IPC handles this process has open, counted: opened once, closed when the last user lets go.

    Why count: many tensors live in one allocation (a worker's device arena block), and a handle is
    opened once per process and device; counting here keeps that true whatever the driver does
    with a second open of the same handle.
    """

    def __init__(self, cupy=None):
        self._cupy = cupy
        # Reentrant: a lease collected by the garbage collector while this thread holds the lock
        # releases its mapping from inside the locked section.
        self._lock = threading.RLock()
        self._open: dict[tuple[bytes, int], list] = {}  # (handle, device) -> [base pointer, users]

    @property
    def cupy(self):
        if self._cupy is None:
            self._cupy = cupy_module()
        return self._cupy

    def acquire(self, handle: bytes, device: int) -> int:
        """The base pointer of the allocation `handle` names, opened on `device` if it was not yet."""
        key = (handle, device)
        with self._lock:
            entry = self._open.get(key)
            if entry is not None:
                entry[1] += 1
                return entry[0]
            cupy = self.cupy
            with cupy.cuda.Device(device):
                base = cupy.cuda.runtime.ipcOpenMemHandle(handle)
            self._open[key] = [base, 1]
            return base

    def release(self, handle: bytes, device: int) -> None:
        key = (handle, device)
        with self._lock:
            entry = self._open.get(key)
            if entry is None:
                return
            entry[1] -= 1
            if entry[1]:
                return
            del self._open[key]
            cupy = self.cupy
            try:
                with cupy.cuda.Device(device):
                    cupy.cuda.runtime.ipcCloseMemHandle(entry[0])
            except Exception:  # noqa: BLE001 - CUDARuntimeError: the producer's context is gone already
                pass

    @property
    def open_count(self) -> int:
        """Handles open now (tests, diagnostics)."""
        return len(self._open)


_front_mappings: Optional[IpcMappings] = None


def mappings() -> IpcMappings:
    """This process's IpcMappings (made on first use)."""
    global _front_mappings
    if _front_mappings is None:
        _front_mappings = IpcMappings()
    return _front_mappings


def read_to_host(buf: DeviceBuffer) -> bytes:
    """Copy `buf` device -> host through its IPC handle (the default DeviceBuffer reader)."""
    import numpy as np

    table = mappings()
    try:
        base = table.acquire(buf.handle, buf.device)
    except KernelError:
        raise
    except Exception as exc:  # noqa: BLE001 - CUDARuntimeError: a stale handle, a dead producer
        raise KernelError(ErrorCode.UNAVAILABLE, f"GPU tensor from {buf.origin} could not be opened: {exc}") from None
    try:
        host = np.empty(buf.nbytes, np.uint8)
        cupy = table.cupy
        with cupy.cuda.Device(buf.device):
            cupy.cuda.runtime.memcpy(host.ctypes.data, base + buf.offset, buf.nbytes, MEMCPY_DEVICE_TO_HOST)
        return host.tobytes()
    finally:
        table.release(buf.handle, buf.device)


def copy_device_to_device(cupy, dst_ptr: int, dst_device: int, buf: DeviceBuffer) -> None:
    """Copy `buf` into device memory at `dst_ptr` (on `dst_device`) without visiting the host, and
    wait for it: the destination is a client's region it reads as soon as the response arrives."""
    buf.check()
    table = mappings()
    try:
        base = table.acquire(buf.handle, buf.device)
    except Exception as exc:  # noqa: BLE001 - CUDARuntimeError: a stale handle, a dead producer
        raise KernelError(ErrorCode.UNAVAILABLE, f"GPU tensor from {buf.origin} could not be opened: {exc}") from None
    try:
        with cupy.cuda.Device(dst_device):
            stream = cupy.cuda.get_current_stream()
            cupy.cuda.runtime.memcpyAsync(dst_ptr, base + buf.offset, buf.nbytes, MEMCPY_DEFAULT, stream.ptr)
            stream.synchronize()
    finally:
        table.release(buf.handle, buf.device)
