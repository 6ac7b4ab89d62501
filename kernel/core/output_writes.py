"""Outputs bound for client shared-memory regions: written into them as each response arrives,
beside the loop when they are large, and the response handed on after.

A request that names output windows (kernel.core.shared_memory.RequestWindows) has its
`on_response` wrapped: each response's outputs with a window are written there and leave the
response empty-handed, and the last response lets go of the windows. Up to WRITE_BESIDE_BYTES
of a response's host outputs are written on the loop (pwrite runs ~4 GB/s here: half a
millisecond); more is written on a thread, where pwrite lets go of the GIL: on the loop one
1 GiB output held every client of the front for ~0.25 s. The responses of a request that come
while one of its responses is being written wait behind it, so the client gets them in order.
A GPU output, or one bound for a CUDA region, is copied on the loop as before (CUDA work stays
on the thread that owns the device).

While written, a response is in flight (Server.in_flight counts OutputWrites.count): a
graceful stop waits for it. The bytes written come from the response as the model handed it
over (fixed then: kernel.core.request), which the write keeps alive; the response's own
tensors are dropped on the loop, after the write, not on the thread.
"""

from __future__ import annotations

import logging
from collections import deque
from functools import partial
from typing import Callable, Optional

from kernel.core.beside import run_beside
from kernel.core.cuda_shared_memory import CudaOutputWindow
from kernel.core.errors import ErrorCode, KernelError
from kernel.core.request import InferRequest, InferResponse, InferTensor
from kernel.core.shared_memory import OutputWindow, RequestWindows

log = logging.getLogger("kernel.core.output_writes")

# A response whose host outputs bound for system regions add up to more than this is written on a thread.
WRITE_BESIDE_BYTES = 2 << 20


class OutputWrites:
    """Routes requests' outputs into their windows; counts the responses being written beside the loop."""

    def __init__(self) -> None:
        self.count = 0

    def route(self, request: InferRequest) -> None:
        """Wrap `request.on_response`: copy outputs into their windows, release the windows at the end.

        An output that does not fit its window fails the response with Triton's message. Outputs bound
        for CUDA regions may come back as GPU tensors (request.device_outputs): copied device to device.
        """
        windows: RequestWindows = request.shm
        cuda = {name for name, slot in windows.outputs.items() if isinstance(slot, CudaOutputWindow)}
        if cuda:
            request.device_outputs = cuda if request.device_outputs is None else request.device_outputs
        request.on_response = _Route(self, windows, request.on_response).on_response


class _Route:
    """One request's responses on their way to its windows, then to whoever asked."""

    __slots__ = ("writes", "windows", "deliver", "behind")

    def __init__(self, writes: OutputWrites, windows: RequestWindows, deliver: Callable[[InferResponse], None]):
        self.writes = writes
        self.windows = windows
        self.deliver = deliver
        self.behind: Optional[deque] = None  # while a response is written beside the loop: those after it

    def on_response(self, response: InferResponse) -> None:
        if self.behind is not None:
            self.behind.append(response)
            return
        self._route(response)

    def _route(self, response: InferResponse) -> bool:
        """Place and hand on one response; True if it is being written beside the loop instead."""
        slots = self.windows.outputs
        if response.error is None and response.outputs and slots:
            if _host_bytes(response, slots) > WRITE_BESIDE_BYTES:
                self.writes.count += 1
                if self.behind is None:
                    self.behind = deque()
                run_beside(_placed_keeping, response, slots).add_done_callback(partial(self._written, response))
                return True
            response = _placed(response, slots)
        self._finish(response)
        return False

    def _written(self, response: InferResponse, future) -> None:
        self.writes.count -= 1
        try:
            placed, kept = future.result()
            del kept  # the model's tensors: their last reference goes here, on the loop
        except Exception as exc:  # noqa: BLE001 - _placed answers what a client can cause; this is ours
            log.exception("writing outputs into shared memory failed for model '%s'", response.model_name)
            placed = _failed(response, f"unable to write outputs into shared memory: {type(exc).__name__}: {exc}")
        self._finish(placed)
        behind = self.behind
        while behind:
            if self._route(behind.popleft()):
                return
        self.behind = None

    def _finish(self, response: InferResponse) -> None:
        if response.final:
            self.windows.release()
        self.deliver(response)


def _host_bytes(response: InferResponse, slots: dict) -> int:
    """The bytes of the response's outputs bound for system regions; 0 if one involves a GPU."""
    n = 0
    for t in response.outputs:
        slot = slots.get(t.name)
        if slot is None:
            continue
        if type(slot) is not OutputWindow or t.device is not None:
            return 0
        raw = t._raw
        if raw is None:  # an array, made into bytes where it is written
            n += getattr(t._array, "nbytes", 0)
            continue
        try:
            n += memoryview(raw).nbytes
        except TypeError:  # not a buffer: _place answers it, on the loop
            return 0
    return n


def _placed_keeping(response: InferResponse, slots: dict) -> tuple:
    """On a thread: _placed, and the model's tensors, kept for the loop to let go of."""
    kept = response.outputs
    return _placed(response, slots), kept


def _placed(response: InferResponse, slots: dict) -> InferResponse:
    try:
        return _place(response, slots)
    except KernelError as exc:  # the client shrank the object under an output window
        return _failed(response, exc.message, exc.code)
    except (ValueError, TypeError, OSError) as exc:  # an output buffer that cannot be copied
        return _failed(response, f"unable to write outputs into shared memory: {exc}")


def _place(response: InferResponse, slots: dict) -> InferResponse:
    outputs = []
    for t in response.outputs:
        slot = slots.get(t.name)
        if slot is None:
            outputs.append(t)
            continue
        device = t.device if t._raw is None else None
        raw = None if device is not None else memoryview(t.raw).cast("B")
        n = device.nbytes if device is not None else raw.nbytes
        if n > slot.nbytes:
            return _failed(
                response,
                f"shared memory size specified with the request for output '{t.name}' ({slot.nbytes} bytes) "
                f"should be at least {n} bytes to hold the results",
                ErrorCode.INVALID_ARG,  # the client's window is too small: a client error (Triton says 500)
            )
        if device is None:
            slot.write(raw)
        elif isinstance(slot, CudaOutputWindow):
            slot.write_device(device)  # GPU to GPU: the bytes never visit the host
        else:
            slot.write(device.to_host())
        # The data now lives in the client's region; the response carries none.
        outputs.append(InferTensor(t.name, t.datatype, t.shape, raw=b""))
    response.outputs = outputs
    return response


def _failed(response: InferResponse, message: str, code: ErrorCode = ErrorCode.INTERNAL) -> InferResponse:
    return InferResponse(
        response.model_name, response.model_version, response.id, final=response.final,
        error=KernelError(code, message),
    )
