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

import itertools
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
    `lifetime`, where set, is how long the allocation is known to stay (a client's CUDA region while
    it is registered here; a worker's permanent device block while that worker runs): consumers
    may keep their mappings of `handle` open until it ends (IpcMappings' keepers).
    """

    __slots__ = ("handle", "device", "offset", "nbytes", "origin", "gone", "lifetime", "_reader", "__weakref__")

    def __init__(self, handle: bytes, device: int, offset: int, nbytes: int, origin: str,
                 reader: Optional[Callable[["DeviceBuffer"], bytes]] = None, lifetime: "Optional[Lifetime]" = None):
        self.handle = handle
        self.device = device
        self.offset = offset
        self.nbytes = nbytes
        self.origin = origin
        self.gone: Optional[str] = None  # why the memory can no longer be read (its producer exited)
        self.lifetime = lifetime
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


class Lifetime:
    """How long an allocation is known to stay: whoever kept a mapping of it open past its last use
    is called back when it ends (`when_ended`), from whichever thread ends it.

    Why: opening a CUDA IPC handle costs hundreds of microseconds, so a handle used request after
    request (a client's CUDA region, a worker's permanent block) is opened once and kept; the
    allocation's owner ends its Lifetime when the memory may go (the region unregistered, the
    worker exited), and every mapping kept on its account is closed once unused.
    """

    __slots__ = ("_callbacks", "ended", "_lock", "__weakref__")

    def __init__(self) -> None:
        self._callbacks: dict = {}  # key -> callback: one per key, however often it is asked for
        self.ended = False
        self._lock = threading.Lock()

    def when_ended(self, key, fn: Callable[[], None]) -> None:
        """Call `fn` when this ends (at once if it has), unless a callback under `key` is set already."""
        with self._lock:
            if not self.ended:
                self._callbacks.setdefault(key, fn)
                return
        fn()

    def end(self) -> None:
        with self._lock:
            if self.ended:
                return
            self.ended = True
            callbacks, self._callbacks = list(self._callbacks.values()), {}
        for fn in callbacks:
            try:
                fn()
            except Exception:  # noqa: BLE001 - one keeper's failure must not keep the others open
                pass


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

    Why some stay open with no user (`keeper`): opening a handle (cudaIpcOpenMemHandle) costs
    hundreds of microseconds, far more than copying a small tensor. A handle used request after
    request (a client's CUDA shared-memory region, opened once per registration as tritonserver
    does; a worker's permanent device block) stays open while some keeper asks for it, and is
    closed when the last keeper lets go and nobody uses it. A keeper is a Lifetime (forgotten when
    it ends) or, in a worker, the front that lent the handle (its link's serial: forgotten on that
    front's DeviceUnmap, or `forget_keeper` when the link closes). At most KEPT_IDLE such mappings
    stay open unused; past that the least recently used is closed (its next use opens it again).
    """

    KEPT_IDLE = 64
    _serials = itertools.count(1)

    def __init__(self, cupy=None):
        self._cupy = cupy
        self._serial = next(self._serials)  # (names its callbacks in a Lifetime: ids are reused)
        # Reentrant: a lease collected by the garbage collector while this thread holds the lock
        # releases its mapping from inside the locked section.
        self._lock = threading.RLock()
        # (handle, device) -> [base pointer, users, keepers]; in order of last use (oldest first)
        self._open: dict[tuple[bytes, int], list] = {}

    @property
    def cupy(self):
        if self._cupy is None:
            self._cupy = cupy_module()
        return self._cupy

    def acquire(self, handle: bytes, device: int, keeper=None) -> int:
        """The base pointer of the allocation `handle` names, opened on `device` if it was not yet;
        with `keeper`, it stays open after its last user until that keeper forgets it."""
        key = (handle, device)
        with self._lock:
            entry = self._open.pop(key, None)
            if entry is None:
                cupy = self.cupy
                with cupy.cuda.Device(device):
                    base = cupy.cuda.runtime.ipcOpenMemHandle(handle)
                entry = [base, 0, set()]
            entry[1] += 1
            self._open[key] = entry  # (re)inserted last: the most recently used
            if keeper is not None and keeper not in entry[2]:
                entry[2].add(keeper)
                if isinstance(keeper, Lifetime):
                    keeper.when_ended(("mappings", self._serial, key), lambda: self.forget(handle, device, keeper))
            return entry[0]

    def release(self, handle: bytes, device: int) -> None:
        key = (handle, device)
        with self._lock:
            entry = self._open.get(key)
            if entry is None:
                return
            entry[1] -= 1
            if entry[1] <= 0:
                if not entry[2]:
                    self._close(key)
                else:
                    self._trim()

    def forget(self, handle: bytes, device: int, keeper) -> None:
        """`keeper` no longer asks for this handle to stay open (its region was unregistered)."""
        key = (handle, device)
        with self._lock:
            entry = self._open.get(key)
            if entry is not None:
                entry[2].discard(keeper)
                if entry[1] <= 0 and not entry[2]:
                    self._close(key)

    def forget_keeper(self, keeper) -> None:
        """`keeper` is gone (a front's link closed): forget every handle it kept."""
        with self._lock:
            for handle, device in [k for k, e in self._open.items() if keeper in e[2]]:
                self.forget(handle, device, keeper)

    def _trim(self) -> None:
        idle = [k for k, e in self._open.items() if e[1] <= 0]
        for key in idle[: max(0, len(idle) - self.KEPT_IDLE)]:
            self._close(key)

    def _close(self, key: tuple[bytes, int]) -> None:
        entry = self._open.pop(key)
        cupy = self.cupy
        try:
            with cupy.cuda.Device(key[1]):
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


def kept_open(buf: DeviceBuffer) -> bool:
    """Whether `buf` lies in an allocation this process keeps mapped (a host copy then costs a
    cudaMemcpy, no IPC open): a client's registered region, a running worker's permanent block."""
    lifetime = buf.lifetime
    return lifetime is not None and not lifetime.ended


def _kept(buf: DeviceBuffer) -> Optional[Lifetime]:
    """The keeper this process's mapping of `buf` stays open for, if its allocation outlives the use."""
    return buf.lifetime if kept_open(buf) else None


def read_to_host(buf: DeviceBuffer) -> bytes:
    """Copy `buf` device -> host through its IPC handle (the default DeviceBuffer reader)."""
    import numpy as np

    table = mappings()
    try:
        base = table.acquire(buf.handle, buf.device, _kept(buf))
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
        base = table.acquire(buf.handle, buf.device, _kept(buf))
    except Exception as exc:  # noqa: BLE001 - CUDARuntimeError: a stale handle, a dead producer
        raise KernelError(ErrorCode.UNAVAILABLE, f"GPU tensor from {buf.origin} could not be opened: {exc}") from None
    try:
        with cupy.cuda.Device(dst_device):
            stream = cupy.cuda.get_current_stream()
            cupy.cuda.runtime.memcpyAsync(dst_ptr, base + buf.offset, buf.nbytes, MEMCPY_DEFAULT, stream.ptr)
            stream.synchronize()
    finally:
        table.release(buf.handle, buf.device)
