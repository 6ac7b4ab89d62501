"""Model responses on their way to the front process.

ResponseSink is the callback behind each request's InferenceResponseSender
(which enforces Triton's sending rules first); response_message turns a
pb_utils.InferenceResponse into the Response message the front reads.

A response is packed when the model hands it over, on the thread that hands it over (as Triton
copies outputs into shared memory inside `send()`): whatever the model does with its arrays
afterwards, even refilling the same buffer for the next send, the answer stays what it was.
"""

from __future__ import annotations

import numpy as np

import triton_python_backend_utils as pb_utils
from kernel.backends.python import gpu_worker, handover, messages, wire
from kernel.core import datatypes
from kernel.core.device_memory import device_ok

# Triton's numeric TritonError codes -> our ErrorCode names.
ERROR_CODE_NAMES = {
    getattr(pb_utils.TritonError, name): name
    for name in ("UNKNOWN", "INTERNAL", "NOT_FOUND", "INVALID_ARG", "UNAVAILABLE", "UNSUPPORTED", "ALREADY_EXISTS", "CANCELLED")
}


class ResponseSink:
    """Delivers one request's responses to the front process, from any thread."""

    __slots__ = ("worker", "key", "requested", "cancelled", "sender", "regions", "device")

    def __init__(self, worker, key: int, requested, regions=None):
        self.worker = worker
        self.key = key
        self.requested = requested
        self.cancelled = False
        self.sender = None
        # The request's inputs that live in the front's arena: (start address, end address,
        # segment, offset, input tensor) each, so an output that is a view of one can go back as a
        # reference (handover.py). Dropped at the final response, or when the request is cancelled.
        self.regions = regions
        # The request's device_outputs (messages.Request): GPU outputs that may go as IPC handles.
        self.device = False

    def send(self, response, flags: int) -> None:
        final = bool(flags & pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        self.worker.hand_over(self, response, final)

    def is_cancelled(self) -> bool:
        if not self.cancelled and self.worker.pumping_here():
            self.worker.poll_inline()  # a Cancel may be waiting in the socket
        return self.cancelled


def pack_tensor(tensor, arena, regions=None, siblings=(), device=False) -> messages.Tensor:
    """A pb_utils.Tensor in message form (inline, copied into the worker's arena, or for a GPU
    tensor that `device` lets stay on the GPU, a CUDA IPC handle: gpu_worker.py).

    regions: the request's inputs in the front's arena (ResponseSink.regions); siblings: the
    response's output tensors. An output that is a view of one of those inputs (an identity
    model's) is sent as a reference to it, not copied, when the model can no longer change it
    (handover.lend): the front reads it in place from its own arena and keeps that input's region
    until the transport is done with the response (see arena_views.py).
    """
    datatype = tensor._datatype
    arr = tensor._array
    if type(arr) is np.ndarray and arr.ndim and arr.nbytes <= wire.INLINE_LIMIT and datatype != "BYTES":
        # The common small output: one call to its bytes (any layout), straight into the message.
        return messages.Tensor(tensor._name, datatype, list(arr.shape), arr.tobytes())
    if datatype == "BYTES":
        if type(arr) is np.ndarray and arr.size == 1:
            # One string (a token of text, per response of a streaming model): its wire form in one
            # concatenation, no per-element loop and no second copy in wire.pack.
            item = arr.item()
            if type(item) is str:
                item = item.encode("utf-8")
            if type(item) is bytes and len(item) <= wire.INLINE_LIMIT - 4:
                return messages.Tensor(tensor._name, datatype, list(arr.shape), len(item).to_bytes(4, "little") + item)
        raw = datatypes.serialize_bytes(np.asarray(arr, dtype=np.object_))
    else:
        if device and type(arr) is not np.ndarray and device_ok(device, tensor._name):
            packed = gpu_worker.export_tensor(tensor)
            if packed is not None:
                return packed
        arr = np.ascontiguousarray(host_array(arr))
        nbytes = arr.nbytes
        if regions is not None and nbytes > wire.INLINE_LIMIT and arr is tensor._array:
            addr = arr.__array_interface__["data"][0]
            for start, end, segment, owner, source in regions:
                if start <= addr and addr + nbytes <= end:
                    shape = list(arr.shape)
                    arr = None  # lend() counts references: none may be ours
                    if source is not None and handover.lend(tensor, source, siblings or (tensor,)):
                        return messages.Tensor(tensor.name(), datatype, shape, None, segment,
                                               owner + (addr - start), nbytes, owner)
                    arr = tensor._array
                    break
        raw = memoryview(arr).cast("B") if arr.size else b""
    return wire.pack(tensor.name(), datatype, arr.shape, raw, arena)


def host_array(arr):
    """`arr` in host memory: a GPU array (a pb_utils.Tensor made from a CuPy/torch CUDA array through
    DLPack) is copied device -> host, for a consumer that wants bytes (a client over the wire, a
    BLS caller that prefers CPU memory) or where GPU support is off; the others take the GPU
    tensor itself as a CUDA IPC handle (gpu_worker.py).
    """
    if isinstance(arr, np.ndarray) or not hasattr(arr, "__cuda_array_interface__"):
        return arr
    if hasattr(arr, "get"):  # CuPy
        host = arr.get()
    else:
        host = np.from_dlpack(arr.cpu()) if hasattr(arr, "cpu") else np.asarray(arr)
    gpu_worker.count("device_to_host", host.nbytes)
    return host


def response_message(sink: ResponseSink, response, final: bool, arena) -> messages.Response:
    """The Response message for what the model gave as request sink.key's response (None: none)."""
    if response is None:
        return messages.Response(sink.key, final=final, has_response=False)
    if not isinstance(response, pb_utils.InferenceResponse):
        return messages.Response(
            sink.key,
            error=messages.Error(
                "INTERNAL",
                f"Expected an 'InferenceResponse' object in the execute function return list, "
                f"found type '{type(response)}'.",
            ),
            final=final,
        )
    if response.has_error():
        err = response.error()
        code = ERROR_CODE_NAMES.get(err.code(), "INTERNAL")
        return messages.Response(sink.key, error=messages.Error(code, err.message()), final=final)
    try:
        outputs = []
        regions = sink.regions
        siblings = response.output_tensors() if regions is not None else ()
        for tensor in response.output_tensors():
            if sink.requested is not None and tensor.name() not in sink.requested:
                continue
            outputs.append(pack_tensor(tensor, arena, regions, siblings, sink.device))
    except Exception as exc:  # noqa: BLE001 - bad output tensors fail this request only
        return messages.Response(sink.key, error=messages.Error("INTERNAL", str(exc)), final=final)
    params = response.parameters()
    return messages.Response(sink.key, outputs, None, params if params and params != "{}" else "", final)
