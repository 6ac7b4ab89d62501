"""Client shared-memory regions: the system (and, later, CUDA) shared-memory extensions.

A client creates a POSIX shared-memory object, registers a window of it under
a region name, and then names that region in a request's tensor parameters
(`shared_memory_region`, `shared_memory_offset`, `shared_memory_byte_size`)
instead of sending the bytes. Both transports share the one registry kept
here on the Server.

Inputs enter the core as memoryview slices of the mapping (no copy until the
backend moves them into its own arena); outputs are copied into the client's
window when the response arrives, and the response then carries no data for
them. Every access is bounds-checked against the registered window.

Unregistering drops the registry's hold on the mapping at once; a request
still in flight keeps its slices (a memoryview keeps its mmap alive) and lets
go of them when it finishes, which unmaps the window. So no access can ever
reach memory that is no longer mapped.
"""

from __future__ import annotations

import mmap
import os
import stat

from kernel.core.errors import ErrorCode, KernelError
from kernel.core.request import InferRequest, InferResponse, InferTensor

# Where shm_open(3) puts POSIX shared-memory objects on Linux.
SHM_DIR = "/dev/shm"
_NAME_MAX = 255


class SystemRegion:
    """One registered window [offset, offset + byte_size) of a shared-memory object."""

    __slots__ = ("name", "key", "offset", "byte_size", "_map", "view")

    def __init__(self, name: str, key: str, offset: int, byte_size: int, mapping: mmap.mmap, skip: int):
        self.name = name
        self.key = key
        self.offset = offset
        self.byte_size = byte_size
        self._map = mapping
        # The mapping starts on a page boundary at or below `offset`; skip the slack.
        self.view = memoryview(mapping)[skip : skip + byte_size]

    def status(self) -> dict:
        return {"name": self.name, "key": self.key, "offset": self.offset, "byte_size": self.byte_size}

    def close(self) -> None:
        """Unmap now unless a request still holds a slice; then the last slice's release unmaps it."""
        self.view.release()
        try:
            self._map.close()
        except BufferError:
            pass  # in use by an in-flight request: freed with its last reference
        self._map = None


def _open_key(key: str) -> int:
    """Open the shared-memory object the way shm_open(key, O_RDWR) would, without following links."""
    name = key.lstrip("/")
    if not name or "/" in name or "\0" in name or name in (".", "..") or len(name) > _NAME_MAX:
        raise OSError("invalid shared-memory key")
    return os.open(os.path.join(SHM_DIR, name), os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)


class SharedMemoryManager:
    """The server's registered client regions, by name (system and CUDA share one namespace)."""

    def __init__(self) -> None:
        self._system: dict[str, SystemRegion] = {}

    # ---- system shared memory ----------------------------------------------

    def register_system(self, name: str, key: str, offset: int, byte_size: int) -> None:
        if not name:  # '' means "every region" to unregister, so it cannot name one
            raise KernelError(
                ErrorCode.INVALID_ARG, "'region name' is necessary to register system shared memory region"
            )
        if name in self._system:
            raise KernelError(ErrorCode.ALREADY_EXISTS, f"shared memory region '{name}' already in manager")
        try:
            fd = _open_key(key)
        except OSError:
            raise KernelError(ErrorCode.INTERNAL, f"Unable to open shared memory region: '{key}'") from None
        try:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode) or byte_size <= 0 or offset < 0 or offset + byte_size > info.st_size:
                raise KernelError(ErrorCode.INTERNAL, f"Invalid shared memory region: '{key}'")
            # mmap wants a page-aligned file offset; map from the page holding `offset`.
            start = offset - offset % mmap.ALLOCATIONGRANULARITY
            try:
                mapping = mmap.mmap(fd, offset + byte_size - start, mmap.MAP_SHARED,
                                    mmap.PROT_READ | mmap.PROT_WRITE, offset=start)
            except (OSError, ValueError) as exc:
                raise KernelError(
                    ErrorCode.INVALID_ARG,
                    f"failed to register shared memory region '{name}': unable to map '{key}': {exc}",
                ) from None
        finally:
            os.close(fd)
        self._system[name] = SystemRegion(name, key, offset, byte_size, mapping, offset - start)

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

    # ---- CUDA shared memory: not yet (the CUDA path is a later issue) ---------

    def register_cuda(self, name: str) -> None:
        if not _gpu_present():
            raise KernelError(
                ErrorCode.INVALID_ARG, f"failed to register CUDA shared memory region: '{name}', GPUs not supported"
            )
        raise KernelError(
            ErrorCode.UNSUPPORTED,
            f"failed to register CUDA shared memory region: '{name}', "
            "CUDA shared memory is not supported by Kernel yet",
        )

    def unregister_cuda(self, name: str = "") -> None:
        """No CUDA region can exist, so there is nothing to forget (not an error, as in Triton)."""

    def cuda_status(self, name: str = "") -> list[dict]:
        if not name:
            return []
        if name in self._system:
            raise KernelError(
                ErrorCode.NOT_FOUND,
                f"The region named '{name}' is registered as system shared memory, not CUDA shared memory",
            )
        raise KernelError(ErrorCode.NOT_FOUND, f"Unable to find cuda shared memory region: '{name}'")

    # ---- tensors -------------------------------------------------------------

    def view(self, name: str, offset: int, byte_size: int) -> memoryview:
        """The bytes [offset, offset + byte_size) of region `name`, bounds-checked."""
        region = self._system.get(name)
        if region is None:
            raise KernelError(ErrorCode.NOT_FOUND, f"Unable to find shared memory region: '{name}'")
        size = region.byte_size
        if offset < 0 or offset >= size:
            raise KernelError(ErrorCode.INVALID_ARG, f"Invalid offset for shared memory region: '{name}'")
        if byte_size < 0 or offset + byte_size > size:
            raise KernelError(
                ErrorCode.INVALID_ARG, f"Invalid offset + byte size for shared memory region: '{name}'"
            )
        return region.view[offset : offset + byte_size]

    def close(self) -> None:
        """Unmap everything (server shutdown)."""
        self.unregister_system()


def _gpu_present() -> bool:
    return os.path.exists("/dev/nvidiactl")


# ---- per request: the windows it holds; outputs copied in when a response arrives ----


class RequestWindows:
    """The client windows one request uses (its `shm`), released when the request finishes."""

    __slots__ = ("outputs", "held")

    def __init__(self) -> None:
        self.outputs: dict[str, memoryview] = {}  # output name -> window it is written into
        self.held: list[memoryview] = []

    def hold(self, window: memoryview) -> memoryview:
        self.held.append(window)
        return window

    def release(self) -> None:
        """Let go of every window, so an unregistered region is unmapped as soon as its requests end."""
        for window in self.held:
            try:
                window.release()
            except BufferError:
                pass  # something still reads it (a numpy view): freed with that
        self.held = []
        self.outputs = {}


def route_through_windows(request: InferRequest) -> None:
    """Wrap `request.on_response`: copy outputs into their windows, release the windows at the end.

    An output that does not fit its window fails the response with Triton's message.
    """
    windows: RequestWindows = request.shm
    deliver = request.on_response

    def on_response(response: InferResponse) -> None:
        if response.error is None and response.outputs and windows.outputs:
            try:
                response = _place(response, windows.outputs)
            except (ValueError, TypeError) as exc:  # an output buffer numpy/memoryview cannot copy
                response = _failed(response, f"unable to write outputs into shared memory: {exc}")
        if response.final:
            windows.release()
        deliver(response)

    request.on_response = on_response


def _place(response: InferResponse, slots: dict[str, memoryview]) -> InferResponse:
    outputs = []
    for t in response.outputs:
        slot = slots.get(t.name)
        if slot is None:
            outputs.append(t)
            continue
        raw = memoryview(t.raw).cast("B")
        n = raw.nbytes
        if n > slot.nbytes:
            return _failed(
                response,
                f"shared memory size specified with the request for output '{t.name}' ({slot.nbytes} bytes) "
                f"should be at least {n} bytes to hold the results",
            )
        slot[:n] = raw
        # The data now lives in the client's region; the response carries none.
        outputs.append(InferTensor(t.name, t.datatype, t.shape, raw=b""))
    response.outputs = outputs
    return response



def _failed(response: InferResponse, message: str) -> InferResponse:
    return InferResponse(
        response.model_name, response.model_version, response.id, final=response.final,
        error=KernelError(ErrorCode.INTERNAL, message),
    )
