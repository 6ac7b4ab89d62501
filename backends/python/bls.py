"""Business Logic Scripting inside the worker: `InferenceRequest.exec()` / `async_exec()`.

A BLS call is sent to the front process, which runs it through the core like
any client request (any model, its scheduler, its instances). Responses come
back as BlsResponses messages. Their tensors are read in place from the front
process's arena, and each region is handed back once the numpy array that
views it has been garbage collected ("output tensors are freed when dropped").

A call's inputs are packed at the call, on the caller's thread (as Triton copies them into shared
memory inside exec()/async_exec()): a buffer the model overwrites right after the call still
reaches the callee as it was. Only the sending waits for the loop (or a thread pumping for it).

GPU tensors (gpu_worker.py): a GPU input goes as a CUDA IPC handle; outputs come back as GPU
tensors unless `preferred_memory` asks for CPU, or the caller has no GPU support loaded and asked
for nothing (a CPU model is not made to import CuPy); with TRITONSERVER_MEMORY_GPU a host output is
copied to the preferred device here.
"""

from __future__ import annotations

import asyncio
import itertools
import queue
import threading
import weakref
from typing import Optional

from kernel.backends.python import gpu_worker, messages, wire
from kernel.backends.python.bls_stream import AsyncResponseStream
from kernel.backends.python.inline_channel import OneShot
from kernel.core import datatypes

import triton_python_backend_utils as pb_utils


class _Call:
    """One BLS call in flight: where its responses go."""

    __slots__ = ("decoupled", "sync_queue", "future", "stream", "done", "gpu_device")

    def __init__(self, decoupled: bool, blocking: bool, loop: asyncio.AbstractEventLoop):
        self.decoupled = decoupled
        self.sync_queue: Optional[queue.SimpleQueue] = queue.SimpleQueue() if blocking else None
        self.future: Optional[asyncio.Future] = None if blocking or decoupled else loop.create_future()
        self.stream: Optional[AsyncResponseStream] = None  # async_exec(decoupled=True)
        self.done = False
        self.gpu_device = -1  # preferred_memory GPU: host outputs are copied to this device

    def deliver(self, response, final: bool) -> None:
        if self.sync_queue is not None:
            self.sync_queue.put((response, final))
        elif self.stream is not None:
            self.stream.deliver(response, final)
        elif not self.future.done():
            self.future.set_result(response)


class ResponseIterator:
    """The iterator `exec(decoupled=True)` returns; yields until the final response."""

    def __init__(self, client: "BlsClient", key: int, call: _Call, send=None):
        self._client = client
        self._key = key
        self._call = call
        self._send = send  # the request's OneShot send, when made from a model thread
        self._finished = False

    def __iter__(self):
        return self

    def __next__(self):
        if self._finished:
            raise StopIteration
        sync_queue = self._call.sync_queue
        worker = self._client.worker
        if worker.pumping_here():
            worker.wait_inline(lambda: not sync_queue.empty())
            response, final = sync_queue.get()
        else:
            response, final = worker.take_off_loop(sync_queue, self._send)
        if final:
            self._finished = True
        return response

    def cancel(self) -> None:
        self._client.cancel(self._key)


class BlsClient:
    """Installed as `pb_utils._bls_handler` in the worker."""

    def __init__(self, worker):
        self.worker = worker
        self.calls: dict[int, _Call] = {}
        self._keys = itertools.count(1)
        self._lock = threading.Lock()
        self.model_loading = None  # the worker's model_loading.ModelLoadingClient

    # ---- pb_utils model loading API (served by model_loading.py) ------------------

    def load_model(self, model_name: str, config: str, files) -> None:
        self._loading().load_model(model_name, config, files)

    def unload_model(self, model_name: str, unload_dependents: bool) -> None:
        self._loading().unload_model(model_name, unload_dependents)

    def is_model_ready(self, model_name: str, model_version: str) -> bool:
        return self._loading().is_model_ready(model_name, model_version)

    def _loading(self):
        if self.model_loading is None:
            raise pb_utils.TritonModelException("The model loading API is not available in this process")
        return self.model_loading

    # ---- pb_utils hook contract ----------------------------------------------

    def exec(self, request, decoupled: bool):
        self._check_phase()
        loop = self.worker.loop
        if self.worker.pumping_here():
            # A synchronous execute running on the loop: send now, pump until answered.
            key, call = self._new_call(decoupled, blocking=True)
            self._send(key, self._pack(key, request, call), decoupled, True)
            if decoupled:
                return ResponseIterator(self, key, call)
            self.worker.wait_inline(lambda: not call.sync_queue.empty())
            response, _ = call.sync_queue.get()
            return response
        if _on_loop(loop):
            raise pb_utils.TritonModelException(
                "InferenceRequest.exec() would block the worker's event loop; "
                "in an 'async def execute' use 'await request.async_exec()'"
            )
        key, call = self._new_call(decoupled, blocking=True)
        send = OneShot(self._send, key, self._pack(key, request, call), decoupled, True)
        loop.call_soon_threadsafe(send)
        if decoupled:
            return ResponseIterator(self, key, call, send)
        response, _ = self.worker.take_off_loop(call.sync_queue, send)
        return response

    def async_exec(self, request, decoupled: bool):
        """Sent at the call, not when awaited: Triton starts the call there too, and the inputs
        are the caller's buffers as they are now."""
        self._check_phase()
        key, call = self._new_call(decoupled, blocking=False)
        if decoupled:
            call.stream = AsyncResponseStream(self, key, self.worker.loop)
        self.worker.call_on_loop(self._send, key, self._pack(key, request, call), decoupled, False)
        return self._async_answer(call, decoupled)

    def _check_phase(self) -> None:
        # Triton serves BLS only once initialize has returned and until finalize begins.
        if not self.worker.bls_allowed:
            raise pb_utils.TritonModelException("BLS is only supported during the 'execute' function.")

    async def _async_answer(self, call: _Call, decoupled: bool):
        if decoupled:
            # Resolved once the first response is there, as Triton's async_exec(decoupled=True)
            # resolves with its ResponseIterator: a plain `for` over a callee that answered at
            # once (its one response with the FINAL flag) then never holds the loop, so other
            # executes keep running meanwhile. Later responses are yielded as they arrive.
            await call.stream.first()
            return call.stream
        return await call.future

    def cancel(self, key: int) -> None:
        self.worker.call_on_loop(self._send_cancel, key)

    # ---- plumbing --------------------------------------------------------------

    def _new_call(self, decoupled: bool, blocking: bool):
        with self._lock:
            key = next(self._keys)
        call = _Call(decoupled, blocking, self.worker.loop)
        self.calls[key] = call
        return key, call

    def _pack(self, key: int, request, call: _Call):
        """The BlsRequest for `request`, its inputs copied now (on the caller's thread); a
        messages.Response with the error when an input cannot be packed."""
        worker = self.worker
        try:
            inputs = [worker.pack_tensor(t) for t in request._inputs]
        except Exception as exc:  # noqa: BLE001 - a bad tensor fails this call only
            return messages.Response(key, error=messages.Error("INVALID_ARG", str(exc)))
        version = request._model_version
        wire_request = messages.Request(
            key,
            request._request_id,
            inputs,
            list(request._requested_output_names),
            request._correlation_id,
            request._flags,
            request._parameters or "{}",
            0,
            request._trace.get_context() or "",
        )
        packed = messages.BlsRequest(
            request._model_name,
            "" if version is None or version < 0 else str(version),
            wire_request,
            request._timeout,
        )
        memory = request._preferred_memory
        kind = int(memory._memory_type)  # 0 GPU, 1 CPU, 2 no preference
        if kind == 0:
            packed.device_outputs = gpu_worker.support() is not None  # else host, said once in the log
            call.gpu_device = memory._device_id if packed.device_outputs else -1
        elif kind == 2:
            packed.device_outputs = gpu_worker.loaded()
        return packed

    def _send(self, key: int, packed, decoupled: bool, blocks: bool) -> None:
        """Send a packed call (on the loop, or a thread sending directly while an inline execute holds it)."""
        if type(packed) is messages.Response:
            self.on_response(packed)
            return
        packed.decoupled = decoupled
        packed.caller_blocks = blocks
        worker = self.worker
        with worker.channel.lock:  # a model thread may be sending too (see inline_channel)
            worker.arenas.send_announcements()  # segments its inputs grew the arena by
            worker.channel.send(packed)

    def _send_cancel(self, key: int) -> None:
        if key in self.calls:
            self.worker.channel.send(messages.BlsCancel(key))

    def on_responses(self, responses: list[messages.Response]) -> None:
        for r in responses:
            self.on_response(r)

    def on_response(self, r: messages.Response) -> None:
        call = self.calls.get(r.key)
        if call is None:
            return
        if r.final:
            del self.calls[r.key]
        if r.error is not None:
            error = pb_utils.TritonError(r.error.message, _error_code(r.error.code))
            response = pb_utils.InferenceResponse._server_side([], error=error)
        else:
            tensors = []
            try:
                for t in r.outputs:
                    tensors.append(self._tensor(t, call.gpu_device))
            except gpu_worker.InputError as exc:  # a GPU output that cannot be opened here
                for t in r.outputs[len(tensors):]:  # never made into arrays: give them back now
                    if t.ipc is not None:
                        gpu_worker.give_back(t.token)
                    else:
                        self._release_now(t)
                tensors = None
                error = pb_utils.TritonError(str(exc), pb_utils.TritonError.UNAVAILABLE)
                response = pb_utils.InferenceResponse._server_side([], error=error)
            if tensors is not None:
                response = pb_utils.InferenceResponse._server_side(tensors, parameters_json=r.parameters or "{}")
        call.deliver(response, r.final)

    def _tensor(self, t: messages.Tensor, gpu_device: int = -1):
        if t.ipc is not None:  # a GPU output, opened in place (its loan goes back when the model drops it)
            return pb_utils.Tensor._wrap(t.name, gpu_worker.open_input(t, True), t.datatype)
        buffer = wire.view(t, self.worker.peer)
        if t.datatype == "BYTES":
            count = datatypes.element_count(t.shape)
            arr = datatypes.deserialize_bytes(buffer, count)
            array = _object_array(arr, t.shape)
            self._release_now(t)
            return pb_utils.Tensor._wrap(t.name, array, "BYTES")
        dtype = datatypes.datatype_to_numpy(t.datatype) if t.datatype != "BF16" else datatypes.datatype_to_numpy("UINT16")
        array = wire.numeric_array(buffer, dtype, t.shape, writable=True)
        if t.data is None:
            # Region of the front's arena: give it back when the model drops the array.
            weakref.finalize(array, self.worker.call_on_loop, self.worker.release_peer_region, t.segment, t.offset)
        if gpu_device >= 0 and array.size:  # preferred_memory GPU: the caller gets it on that device
            array = gpu_worker.to_device(array, gpu_device)
        return pb_utils.Tensor._wrap(t.name, array, t.datatype)

    def _release_now(self, t: messages.Tensor) -> None:
        if t.data is None:
            self.worker.call_on_loop(self.worker.release_peer_region, t.segment, t.offset)


def _object_array(items: list, shape):
    import numpy as np

    arr = np.empty(len(items), dtype=np.object_)
    arr[:] = items
    return arr.reshape(shape)


def _error_code(name: str) -> int:
    return getattr(pb_utils.TritonError, name, pb_utils.TritonError.INTERNAL)


def _on_loop(loop) -> bool:
    try:
        return asyncio.get_running_loop() is loop
    except RuntimeError:
        return False
