"""CUDA shared-memory regions: the device half of the shared-memory extension.

A client allocates device memory, exports it with cudaIpcGetMemHandle and registers the 64-byte
handle (with the device it lives on and its size) under a region name; requests then name the
region in a tensor's `shared_memory_region` parameters, as for system shared memory (the two
kinds share one namespace, kept by kernel.core.shared_memory.SharedMemoryManager).

How the memory is opened is an injectable `IpcOpener`. Why: the real one needs CuPy and a GPU
(`cupy.cuda.runtime.ipcOpenMemHandle`), which CI and developers' machines do not have; the
protocol handling, bounds checks and region lifetime above it are the same whatever opens the
memory, so tests inject an opener whose "device memory" is host buffers and exercise all of it.

Data path, where the opener shares handles (CuPy: `shares_handles`): an input region is handed on
as a kernel.core.device_memory.DeviceBuffer naming the client's own handle, so a worker opens the
client's memory itself and the bytes reach execute on the GPU (or are copied to the host there,
for a model that takes CPU inputs); a GPU output a worker made arrives as an IPC handle of its
memory and is copied device to device into the output region. Otherwise (an opener that only
reads and writes, as tests inject; a host output) an input is copied device -> host when the
request is decoded and an output host -> device when its response arrives.

Lifetime, as for system regions: unregistering drops the registry's hold on the mapping at once;
a request in flight keeps its output windows (each holds the mapping) and lets go when it
finishes, and the IPC mapping is closed when the last holder lets go. So no write ever lands in
memory that was closed under it. A worker that opened the same handle (an input it reads itself)
keeps its mapping while the front's lives (the mapping's `lifetime`): one open per registration
and process, as tritonserver opens a region once, not one per request.
"""

from __future__ import annotations

import logging
import sys
from typing import Optional, Protocol

from kernel.core.device_memory import DeviceBuffer, Lifetime, copy_device_to_device
from kernel.core.errors import ErrorCode, KernelError
from kernel.core.gpu import visible_gpu_ids

log = logging.getLogger("kernel.core.cuda_shared_memory")

# sizeof(cudaIpcMemHandle_t): what a register request's raw_handle must decode to.
IPC_HANDLE_SIZE = 64


class DeviceMemory(Protocol):
    """An opened region of device memory, `byte_size` bytes from its start."""

    def read(self, offset: int, nbytes: int) -> bytes: ...

    def write(self, offset: int, data: memoryview) -> None: ...

    def close(self) -> None: ...


class IpcOpener(Protocol):
    """Opens a client's CUDA IPC handle; raises KernelError with the message the client sees.

    An opener may also have `check(name)`, raising KernelError when it cannot open anything at
    all (no GPU, no CuPy): the registry calls it before looking at the request, so that a CPU
    box answers "GPUs not supported" whatever the handle, as a CPU build of Triton does.
    """

    def open(self, name: str, raw_handle: bytes, device_id: int, byte_size: int) -> DeviceMemory: ...


class _Mapping:
    """The opened memory, closed when the last holder (region, output window, input buffer) lets go
    of it; its `lifetime` ends then, and workers close the mappings they kept of the same handle."""

    __slots__ = ("memory", "lifetime")

    def __init__(self, memory: DeviceMemory):
        self.memory = memory
        self.lifetime = Lifetime()

    def __del__(self) -> None:
        self.lifetime.end()
        try:
            self.memory.close()
        except Exception:  # noqa: BLE001 - closing at collection time must not raise
            pass


class CudaRegion:
    """One registered CUDA region: [0, byte_size) of the client's allocation on `device_id`."""

    __slots__ = ("name", "device_id", "byte_size", "mapping", "handle")

    def __init__(self, name: str, device_id: int, byte_size: int, mapping: _Mapping, handle: bytes = b""):
        self.name = name
        self.device_id = device_id
        self.byte_size = byte_size
        self.mapping: Optional[_Mapping] = mapping
        self.handle = handle  # the client's cudaIpcMemHandle_t: a worker opens the same memory with it

    def status(self) -> dict:
        """Triton's status entry (HTTP JSON and the gRPC RegionStatus use the same field names)."""
        return {"name": self.name, "device_id": self.device_id, "byte_size": self.byte_size}

    def read(self, at: int, nbytes: int) -> bytes:
        """A host copy of [at, at + nbytes) (an input); the caller has bounds-checked it."""
        return self.mapping.memory.read(at, nbytes) if nbytes else b""

    def device_view(self, at: int, nbytes: int) -> DeviceBuffer:
        """[at, at + nbytes) as a GPU tensor's buffer (an input that stays on the GPU); bounds-checked
        by the caller. Its host copy, if anyone asks for one, reads through this registration's
        mapping, which the buffer keeps open even if the region is unregistered meanwhile."""
        mapping = self.mapping
        return DeviceBuffer(self.handle, self.device_id, at, nbytes, f"CUDA shared memory region '{self.name}'",
                            lambda buf: mapping.memory.read(buf.offset, buf.nbytes), mapping.lifetime)

    def close(self) -> None:
        self.mapping = None


class CudaOutputWindow:
    """Where one output goes in a CUDA region (copied host -> device when the response arrives)."""

    __slots__ = ("region", "mapping", "at", "nbytes")

    def __init__(self, region: CudaRegion, at: int, nbytes: int):
        self.region = region
        self.mapping = region.mapping
        self.at = at
        self.nbytes = nbytes

    def write(self, data) -> None:
        data = memoryview(data).cast("B")
        if data.nbytes:
            self.mapping.memory.write(self.at, data)

    def write_device(self, buf: DeviceBuffer) -> None:
        """A GPU output (another process's memory): device to device where the memory can copy so,
        else through the host."""
        copy = getattr(self.mapping.memory, "copy_from_device", None)
        if copy is None:
            self.write(buf.to_host())
        elif buf.nbytes:
            copy(self.at, buf)

    def release(self) -> None:
        self.mapping = None


class CudaRegions:
    """The registered CUDA regions, by name; the manager checks names against system regions."""

    def __init__(self, opener: Optional[IpcOpener] = None) -> None:
        self.opener: IpcOpener = opener if opener is not None else CupyIpcOpener()
        self._regions: dict[str, CudaRegion] = {}

    def __contains__(self, name: str) -> bool:
        return name in self._regions

    def get(self, name: str) -> Optional[CudaRegion]:
        return self._regions.get(name)

    def register(self, name: str, raw_handle: bytes, device_id: int, byte_size: int) -> None:
        if not name:  # '' means "every region" to unregister, so it cannot name one
            raise KernelError(
                ErrorCode.INVALID_ARG, "'region name' is necessary to register cuda shared memory region"
            )
        if name in self._regions:
            raise KernelError(ErrorCode.ALREADY_EXISTS, f"shared memory region '{name}' already in manager")
        check = getattr(self.opener, "check", None)
        if check is not None:
            check(name)
        if len(raw_handle) != IPC_HANDLE_SIZE:
            raise KernelError(ErrorCode.INVALID_ARG, "'raw_handle' must be a valid base64 encoded cudaIpcMemHandle_t")
        if device_id < 0 or byte_size <= 0:
            raise KernelError(
                ErrorCode.INVALID_ARG,
                f"failed to register CUDA shared memory region '{name}': "
                + ("device_id must be >= 0" if device_id < 0 else "byte_size must be greater than 0"),
            )
        memory = self.opener.open(name, bytes(raw_handle), device_id, byte_size)
        self._regions[name] = CudaRegion(name, device_id, byte_size, _Mapping(memory), bytes(raw_handle))

    @property
    def shares_handles(self) -> bool:
        """Whether other processes can open the regions' handles (CuPy: yes; tests' host openers: no)."""
        return bool(getattr(self.opener, "shares_handles", False))

    def unregister(self, name: str = "") -> None:
        """Forget one region ('' = all of them); an unknown name is not an error, as in Triton."""
        if not name:
            regions, self._regions = list(self._regions.values()), {}
        else:
            region = self._regions.pop(name, None)
            regions = [region] if region is not None else []
        for region in regions:
            region.close()

    def status(self, name: str = "") -> list[dict]:
        if not name:
            return [self._regions[n].status() for n in sorted(self._regions)]
        region = self._regions.get(name)
        if region is None:
            raise KernelError(ErrorCode.NOT_FOUND, f"Unable to find cuda shared memory region: '{name}'")
        return [region.status()]


# ---- the real opener: CuPy -----------------------------------------------------------------------


class CupyIpcOpener:
    """Opens handles with cupy.cuda.runtime.ipcOpenMemHandle on the region's device.

    CuPy is imported on first use only (the optional extra `kernel-inference-server[gpu]`). Where
    there is no GPU, or no CuPy, registering answers a clear 400 instead of failing deep inside.
    """

    _said_hip = False

    @property
    def shares_handles(self) -> bool:
        """A worker can open the same handle (inputs reach it without a host copy): CuPy for CUDA,
        loaded (a region was registered). A ROCm/HIP build of CuPy goes through the host."""
        cupy = sys.modules.get("cupy")
        if cupy is None:
            return False
        if getattr(cupy.cuda.runtime, "is_hip", False):
            if not CupyIpcOpener._said_hip:
                CupyIpcOpener._said_hip = True
                log.warning("CUDA shared memory goes through host memory: CuPy is built for ROCm/HIP; GPU tensors "
                            "cross processes as CUDA IPC handles only")
            return False
        return True

    def __init__(self, gpu_ids=visible_gpu_ids):
        self._gpu_ids = gpu_ids

    def check(self, name: str):
        """CuPy, once a GPU is known to be there; KernelError (400) where there is none or no CuPy."""
        prefix = f"failed to register CUDA shared memory region: '{name}'"
        if not self._gpu_ids():
            raise KernelError(ErrorCode.INVALID_ARG, f"{prefix}, GPUs not supported")
        try:
            import cupy  # the [gpu] extra
        except ImportError:
            raise KernelError(
                ErrorCode.INVALID_ARG,
                f"{prefix}, CUDA shared memory needs CuPy: install kernel-inference-server[gpu]",
            ) from None
        return cupy

    def open(self, name: str, raw_handle: bytes, device_id: int, byte_size: int) -> DeviceMemory:
        prefix = f"failed to register CUDA shared memory region: '{name}'"
        cupy = self.check(name)
        if device_id not in self._gpu_ids():
            raise KernelError(ErrorCode.INVALID_ARG, f"{prefix}, invalid device id {device_id}")
        runtime = cupy.cuda.runtime
        try:
            with cupy.cuda.Device(device_id):
                ptr = runtime.ipcOpenMemHandle(raw_handle)  # flags: cudaIpcMemLazyEnablePeerAccess
        except Exception as exc:  # noqa: BLE001 - CUDARuntimeError: a stale or foreign handle
            raise KernelError(ErrorCode.INVALID_ARG, f"failed to open CUDA IPC handle: {exc}") from None
        return _CupyMemory(cupy, device_id, ptr, byte_size)


class _CupyMemory:
    """Device memory opened through CuPy; copies go through a host buffer (numpy) synchronously."""

    def __init__(self, cupy, device_id: int, ptr: int, byte_size: int):
        self._cupy = cupy
        self.device_id = device_id
        self.ptr = ptr
        self.byte_size = byte_size

    def read(self, offset: int, nbytes: int) -> bytes:
        import numpy

        host = numpy.empty(nbytes, dtype=numpy.uint8)
        runtime = self._cupy.cuda.runtime
        try:
            with self._cupy.cuda.Device(self.device_id):
                runtime.memcpy(host.ctypes.data, self.ptr + offset, nbytes, runtime.memcpyDeviceToHost)
        except Exception as exc:  # noqa: BLE001 - CUDARuntimeError, answered as the request's error
            raise KernelError(ErrorCode.INTERNAL, f"unable to read CUDA shared memory: {exc}") from None
        return host.tobytes()

    def write(self, offset: int, data: memoryview) -> None:
        import numpy

        host = numpy.frombuffer(data, dtype=numpy.uint8)
        runtime = self._cupy.cuda.runtime
        try:
            with self._cupy.cuda.Device(self.device_id):
                runtime.memcpy(self.ptr + offset, host.ctypes.data, host.nbytes, runtime.memcpyHostToDevice)
        except Exception as exc:  # noqa: BLE001 - CUDARuntimeError, answered as the response's error
            raise KernelError(ErrorCode.INTERNAL, f"unable to write outputs into CUDA shared memory: {exc}") from None

    def copy_from_device(self, offset: int, buf: DeviceBuffer) -> None:
        """Copy a GPU tensor another process made (`buf`, by its IPC handle) into this region, device to device."""
        try:
            copy_device_to_device(self._cupy, self.ptr + offset, self.device_id, buf)
        except KernelError:
            raise
        except Exception as exc:  # noqa: BLE001 - CUDARuntimeError, answered as the response's error
            raise KernelError(ErrorCode.INTERNAL, f"unable to write outputs into CUDA shared memory: {exc}") from None

    def close(self) -> None:
        if self.ptr:
            ptr, self.ptr = self.ptr, 0
            with self._cupy.cuda.Device(self.device_id):
                self._cupy.cuda.runtime.ipcCloseMemHandle(ptr)
