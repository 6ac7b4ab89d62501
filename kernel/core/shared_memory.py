"""Client shared-memory regions: the system and CUDA shared-memory extensions.

A client creates a POSIX shared-memory object, registers a window of it under
a region name, and then names that region in a request's tensor parameters
(`shared_memory_region`, `shared_memory_offset`, `shared_memory_byte_size`)
instead of sending the bytes. Both transports share the one registry kept
here on the Server.

The object is read and written with pread/pwrite on a file descriptor, never
through a mapping. Why: the client owns the object and can shrink it at any
time; touching a mapped page past the new end raises SIGBUS, which kills the
whole front process (issue 14 item 3). pread past the end is just a short read
(answered 400), and each output write checks the object's current size first.
The cost is one copy of each input (the Python backend reads a large one straight
into its own arena: backends/python/input_copy.py) and none extra for outputs.
Every access is also bounds-checked against the registered window. Inputs a
backend does not take unread are read when the request is submitted
(kernel.core.admission), and large outputs written as each response arrives
(kernel.core.output_writes), both beside the event loop once large.

Unregistering drops the registry's descriptor at once; a request still in
flight keeps its windows (each holds the descriptor) and lets go of them when
it finishes, which closes it. So no read or write can ever reach a descriptor
number that was closed and reused for something else.

CUDA regions (kernel.core.cuda_shared_memory) live in the same namespace and go through the
same bounds checks and window lifetime; only how their bytes are reached differs. Where the IPC
opener shares handles (CuPy), a CUDA input is a GPU tensor (`InferTensor.device`, see
kernel.core.device_memory) rather than bytes, and outputs going to CUDA regions may come back as
GPU tensors, copied device to device into the region.
"""

from __future__ import annotations

import os
import stat
from typing import Optional

import msgspec
import numpy as np

from kernel.core.cuda_shared_memory import CudaOutputWindow, CudaRegion, CudaRegions, IpcOpener
from kernel.core.device_memory import DeviceBuffer
from kernel.core.errors import ErrorCode, KernelError
from kernel.core.request import InferRequest

# An input of a system region up to this size is read as its request is parsed; a larger one is
# left as an InputWindow (kernel.core.admission says who reads it). The Python backend sends
# inputs up to this size inline (wire.INLINE_LIMIT), so every window it gets goes to its arena.
READ_AT_ONCE_BYTES = 64 << 10
# The most one pread is asked for (Linux returns at most 0x7ffff000 bytes per call).
_ONE_READ_BYTES = 1 << 30

# Where shm_open(3) puts POSIX shared-memory objects on Linux.
SHM_DIR = "/dev/shm"
_NAME_MAX = 255


class _Descriptor:
    """An open file descriptor, closed when the last holder (region or output window) lets go of it."""

    __slots__ = ("fd",)

    def __init__(self, fd: int):
        self.fd = fd

    def __del__(self) -> None:
        os.close(self.fd)


class SystemRegion:
    """One registered window [offset, offset + byte_size) of a shared-memory object."""

    __slots__ = ("name", "key", "offset", "byte_size", "file")

    def __init__(self, name: str, key: str, offset: int, byte_size: int, file: _Descriptor):
        self.name = name
        self.key = key
        self.offset = offset
        self.byte_size = byte_size
        self.file = file

    def status(self) -> dict:
        return {"name": self.name, "key": self.key, "offset": self.offset, "byte_size": self.byte_size}

    def close(self) -> None:
        """Drop the registry's descriptor; output windows of in-flight requests keep theirs."""
        self.file = None

    def shrunk(self, at: int, n: int) -> KernelError:
        return KernelError(
            ErrorCode.INVALID_ARG,
            f"shared memory region '{self.name}' (key '{self.key}') no longer holds bytes {at}..{at + n} of its "
            "object: the object was made smaller after it was registered",
        )


class _Window:
    """A span of a client's object that one tensor of a request reads or writes. It holds the
    object's descriptor until the request lets go of it, so a region unregistered meanwhile is
    still reached through it, never through a descriptor number closed and reused meanwhile."""

    __slots__ = ("region", "file", "at", "nbytes")

    def __init__(self, region: SystemRegion, at: int, nbytes: int):
        self.region = region
        self.file = region.file
        self.at = at  # offset in the shared-memory object
        self.nbytes = nbytes

    def release(self) -> None:
        self.file = None


class InputWindow(_Window):
    """An input's bytes in a client region, not read yet: read when its request is submitted
    (kernel.core.admission), or by a backend straight into its own memory (fill)."""

    __slots__ = ()

    def read(self) -> "bytes | memoryview":
        """A copy of the bytes; KernelError(INVALID_ARG) when the object no longer holds them.

        pread lets go of the GIL (so this runs on a thread beside the loop) and returns at most
        ~2 GiB per call: a larger input is read in pieces into one buffer, which numpy leaves
        unfilled until the kernel writes it.
        """
        n = self.nbytes
        if n <= _ONE_READ_BYTES:
            file = self.file  # (held to the end: its descriptor stays open while read, on any thread)
            data = os.pread(file.fd, n, self.at) if n else b""
            if len(data) != n:
                raise self.region.shrunk(self.at, n)
            return data
        out = memoryview(np.empty(n, np.uint8))
        error = self.fill(out)
        if error is not None:
            raise error
        return out

    def __len__(self) -> int:
        return self.nbytes  # (request validation checks an input's byte size before it is read)

    def fits(self) -> bool:
        """Whether the object still holds the window's bytes (the client may have shrunk it)."""
        return os.fstat(self.file.fd).st_size >= self.at + self.nbytes

    def fill(self, out) -> Optional[KernelError]:
        """Read the bytes straight into `out` (a writable buffer of nbytes: a backend's own memory,
        one copy in all). If the object no longer holds them all, the rest of `out` is zeroed and
        the error is returned, for whoever sent `out` on to answer the request with it."""
        out = memoryview(out).cast("B")
        file = self.file  # (held to the end: its descriptor stays open while read, on any thread)
        n, at, fd = self.nbytes, self.at, file.fd
        done = 0
        while done < n:
            got = os.preadv(fd, [out[done : done + _ONE_READ_BYTES]], at + done)
            if got == 0:
                np.frombuffer(out, np.uint8)[done:] = 0
                return self.region.shrunk(at, n)
            done += got
        return None


class OutputWindow(_Window):
    """Where one output goes in a client region: written with pwrite once the object's size is checked."""

    __slots__ = ()

    def write(self, data) -> None:
        """Write `data` (at most nbytes) at the start of the window; KernelError if the object shrank."""
        data = memoryview(data).cast("B")
        n = data.nbytes
        fd = self.file.fd
        if os.fstat(fd).st_size < self.at + n:
            raise self.region.shrunk(self.at, n)
        done = 0
        while done < n:
            done += os.pwrite(fd, data[done:], self.at + done)


def _open_key(key: str) -> int:
    """Open the shared-memory object the way shm_open(key, O_RDWR) would, without following links."""
    name = key.lstrip("/")
    if not name or "/" in name or "\0" in name or name in (".", "..") or len(name) > _NAME_MAX:
        raise OSError("invalid shared-memory key")
    return os.open(os.path.join(SHM_DIR, name), os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)


class RegionChange(msgspec.Struct, array_like=True, omit_defaults=True, frozen=True):
    """One registration or unregistration of a client region, as data: a server with several front
    processes applies the same change on every front (kernel.core.peers), a single one here."""

    op: str  # one of REGION_OPS
    name: str = ""  # "" with an unregister: every region of that kind
    key: str = ""  # system: the shared-memory object's key
    offset: int = 0
    byte_size: int = 0
    raw_handle: bytes = b""  # CUDA: the cudaIpcMemHandle_t
    device_id: int = 0

    def apply(self, manager: "SharedMemoryManager") -> None:
        """Do it on `manager`; KernelError with the extension's messages, as the calls raise."""
        if self.op == "register_system":
            manager.register_system(self.name, self.key, self.offset, self.byte_size)
        elif self.op == "unregister_system":
            manager.unregister_system(self.name)
        elif self.op == "register_cuda":
            manager.register_cuda(self.name, self.raw_handle, self.device_id, self.byte_size)
        elif self.op == "unregister_cuda":
            manager.unregister_cuda(self.name)
        else:
            raise KernelError(ErrorCode.INVALID_ARG, f"unknown shared-memory operation '{self.op}'")


REGION_OPS = ("register_system", "unregister_system", "register_cuda", "unregister_cuda")


class SharedMemoryManager:
    """The server's registered client regions, by name (system and CUDA share one namespace)."""

    def __init__(self, cuda_opener: Optional[IpcOpener] = None) -> None:
        self._system: dict[str, SystemRegion] = {}
        # CUDA regions; cuda_opener replaces the CuPy IPC opener (tests inject a host-backed one).
        self.cuda = CudaRegions(cuda_opener)

    # ---- system shared memory ----------------------------------------------

    def register_system(self, name: str, key: str, offset: int, byte_size: int) -> None:
        if not name:  # '' means "every region" to unregister, so it cannot name one
            raise KernelError(
                ErrorCode.INVALID_ARG, "'region name' is necessary to register system shared memory region"
            )
        if name in self._system or name in self.cuda:
            raise KernelError(ErrorCode.ALREADY_EXISTS, f"shared memory region '{name}' already in manager")
        try:
            fd = _open_key(key)
        except OSError:
            raise KernelError(ErrorCode.INVALID_ARG, f"Unable to open shared memory region: '{key}'") from None
        file = _Descriptor(fd)  # closes fd however this ends
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or byte_size <= 0 or offset < 0 or offset + byte_size > info.st_size:
            raise KernelError(ErrorCode.INVALID_ARG, f"Invalid shared memory region: '{key}'")
        self._system[name] = SystemRegion(name, key, offset, byte_size, file)

    def unregister_system(self, name: str = "") -> None:
        """Forget one region ('' = all of them); an unknown name is not an error, as in Triton."""
        if not name:
            regions, self._system = list(self._system.values()), {}
        else:
            region = self._system.pop(name, None)
            regions = [region] if region is not None else []
        for region in regions:
            region.close()

    def system_status(self, name: str = "") -> list[dict]:
        if not name:
            return [self._system[n].status() for n in sorted(self._system)]
        region = self._system.get(name)
        if region is None:
            raise KernelError(ErrorCode.NOT_FOUND, f"Unable to find system shared memory region: '{name}'")
        return [region.status()]

    # ---- CUDA shared memory (kernel/core/cuda_shared_memory.py) -----------------

    def register_cuda(self, name: str, raw_handle: bytes, device_id: int, byte_size: int) -> None:
        if name and name in self._system:
            raise KernelError(ErrorCode.ALREADY_EXISTS, f"shared memory region '{name}' already in manager")
        self.cuda.register(name, raw_handle, device_id, byte_size)

    def unregister_cuda(self, name: str = "") -> None:
        """Forget one CUDA region ('' = all); an unknown name is not an error, as in Triton."""
        self.cuda.unregister(name)

    def cuda_status(self, name: str = "") -> list[dict]:
        if name and name in self._system:
            raise KernelError(
                ErrorCode.NOT_FOUND,
                f"The region named '{name}' is registered as system shared memory, not CUDA shared memory",
            )
        return self.cuda.status(name)

    # ---- tensors -------------------------------------------------------------

    def _window(self, name: str, offset: int, byte_size: int) -> "SystemRegion | CudaRegion":
        region = self._system.get(name) or self.cuda.get(name)
        if region is None:
            raise KernelError(ErrorCode.NOT_FOUND, f"Unable to find shared memory region: '{name}'")
        size = region.byte_size
        if offset < 0 or offset >= size:
            raise KernelError(ErrorCode.INVALID_ARG, f"Invalid offset for shared memory region: '{name}'")
        if byte_size < 0 or offset + byte_size > size:
            raise KernelError(
                ErrorCode.INVALID_ARG, f"Invalid offset + byte size for shared memory region: '{name}'"
            )
        return region

    def input(self, name: str, offset: int, byte_size: int) -> "bytes | DeviceBuffer | InputWindow":
        """The bytes [offset, offset + byte_size) of region `name` (an input), bounds-checked.

        A small system-memory input is read at once (a copy; KernelError(INVALID_ARG) when the
        object no longer holds it: the client shrank it); a larger one is an InputWindow, read when
        the request is submitted. A CUDA region whose handle other processes can open gives a
        DeviceBuffer instead (no copy): the server turns it into a GPU tensor when the request is
        submitted (take_device_inputs).
        """
        region = self._window(name, offset, byte_size)
        if isinstance(region, CudaRegion):
            if self.cuda.shares_handles:
                return region.device_view(offset, byte_size)
            return region.read(offset, byte_size)  # device -> host copy
        window = InputWindow(region, region.offset + offset, byte_size)
        return window.read() if byte_size <= READ_AT_ONCE_BYTES else window

    def output_window(self, name: str, offset: int, byte_size: int) -> "OutputWindow | CudaOutputWindow":
        """Where an output goes: [offset, offset + byte_size) of region `name`, bounds-checked."""
        region = self._window(name, offset, byte_size)
        if isinstance(region, CudaRegion):
            return CudaOutputWindow(region, offset, byte_size)
        return OutputWindow(region, region.offset + offset, byte_size)

    def close(self) -> None:
        """Forget every region (server shutdown)."""
        self.unregister_system()
        self.unregister_cuda()


# ---- per request: the windows it holds; outputs copied in when a response arrives ----


class RequestWindows:
    """The client windows one request writes its outputs into (its `shm`), released when it finishes."""

    __slots__ = ("outputs", "held")

    def __init__(self) -> None:
        self.outputs: dict[str, OutputWindow] = {}  # output name -> window it is written into
        self.held: list = []

    def hold(self, window):
        """Keep a window until the request ends: an output's, an input's not read yet (its
        descriptor), a CUDA input left on the GPU (so the request is marked as using shared memory).
        An input's bytes already read are a copy: nothing to hold."""
        if isinstance(window, (_Window, CudaOutputWindow, DeviceBuffer)):
            self.held.append(window)
        return window

    def release(self) -> None:
        """Let go of every window, so an unregistered region's descriptor closes as soon as its requests end."""
        for window in self.held:
            window.release()
        self.held = []
        self.outputs = {}


def take_device_inputs(request: InferRequest) -> None:
    """Inputs read from CUDA regions as DeviceBuffers (SharedMemoryManager.view) become GPU tensors
    (`InferTensor.device`); BYTES, which are read element by element, are copied to the host."""
    for t in request.inputs:
        raw = t._raw
        if type(raw) is DeviceBuffer:
            if t.datatype == "BYTES":
                t._raw = raw.to_host()
            else:
                t._raw = None
                t.device = raw
