"""What a worker asks of the front, served there: BLS calls and the model loading API.

A mixin of WorkerInstance (instance.py): a model's `InferenceRequest(...).exec()` arrives as a
BlsRequest and runs through the core like any client request (any model, its scheduler, its
instances), its responses going back as BlsResponses; `pb_utils.load_model` and its kin arrive as
ModelControl and go through the core's model control. Both use the instance's channel, its arenas
(BLS inputs are views of the worker's arena, BLS outputs are copied into the front's) and its
table of BLS calls in flight. GPU tensors go both ways as CUDA IPC handles (gpu_front.py): a GPU
input is the caller's export, a GPU output is lent to the caller, when the caller said it can take
GPU outputs (BlsRequest.device_outputs).
"""

from __future__ import annotations

import asyncio
import logging

import msgspec

from kernel.backends.python import messages, wire
from kernel.core.device_memory import ALL_OUTPUTS
from kernel.core.errors import ErrorCode, KernelError
from kernel.core.request import InferRequest, InferResponse, RequestedOutput

log = logging.getLogger("kernel.python")


class FrontCalls:
    # ---- BLS: the model calls another model through the core ---------------

    def _on_bls_request(self, msg: messages.BlsRequest) -> None:
        r = msg.request
        key = r.key
        try:  # views of the worker's arena, or its GPU tensors
            inputs = [self._views.unpack(t, None) if t.ipc is None else self._gpu.unpack(t) for t in r.inputs]
        except ValueError as exc:
            error = messages.Error("INTERNAL", f"the model's worker sent a bad tensor location: {exc}")
            self.channel.send(messages.BlsResponses([messages.Response(key, error=error)]))
            return
        params = msgspec.json.decode(r.parameters) if r.parameters and r.parameters != "{}" else {}
        outputs = [RequestedOutput(n) for n in r.requested_outputs] or None
        request = InferRequest(
            msg.model_name, msg.model_version, r.request_id, inputs, outputs, params,
            correlation_id=r.correlation_id, flags=r.flags, timeout_us=msg.timeout_us,
        )
        if msg.device_outputs:
            request.device_outputs = ALL_OUTPUTS
        state = {"done": False, "timer": None}

        def reply(response: InferResponse) -> None:
            if state["done"]:
                return
            if response.final:
                state["done"] = True
                self._bls_calls.pop(key, None)
                if state["timer"] is not None:
                    state["timer"].cancel()
                if request.trace is not None:  # this call's trace is done with (see bls_trace)
                    trace, request.trace = request.trace, None
                    trace.release()
            if not self.healthy or self.channel is None or self.channel.closed:
                return
            error = response.error
            if error is None:
                tensors = []
                try:
                    for t in response.outputs:
                        tensors.append(wire.pack(t.name, t.datatype, t.shape, t.raw, self._arena) if t.device is None
                                       else self._gpu.lend(t))
                except KernelError as exc:  # a GPU output whose producer is gone
                    self._gpu.returned(t.token for t in tensors if t.ipc is not None)
                    for seg, off in wire.arena_regions(tensors):
                        self._arena.free(seg, off)
                    error = exc
            if error is not None:
                wire_response = messages.Response(
                    key, error=messages.Error(error.code.name, error.message), final=response.final
                )
            else:
                params_json = msgspec.json.encode(response.parameters).decode() if response.parameters else ""
                wire_response = messages.Response(key, tensors, None, params_json, response.final)
            self.channel.send(messages.BlsResponses([wire_response]))

        if r.trace_context and self.core.tracer is not None:  # InferenceRequest(trace=request.trace())
            request.trace = self.core.tracer.bls_trace(r.trace_context)
        request.on_response = reply
        self._bls_calls[key] = request
        try:
            if msg.caller_blocks and self._would_deadlock(msg.model_name, msg.model_version):
                raise KernelError(
                    ErrorCode.UNAVAILABLE,
                    f"BLS request to model '{msg.model_name}' cannot run: its only instance "
                    f"'{self.name}' is the one blocked waiting for this response",
                )
            self.core.submit(request)
        except KernelError as exc:
            reply(InferResponse(msg.model_name, msg.model_version, r.request_id, error=exc))
            return
        if msg.timeout_us > 0 and not state["done"]:
            def expire() -> None:
                if state["done"]:
                    return
                request.cancel()
                reply(InferResponse(
                    msg.model_name, msg.model_version, r.request_id,
                    error=KernelError(ErrorCode.UNAVAILABLE, "Request timeout expired"),
                ))

            state["timer"] = asyncio.get_running_loop().call_later(msg.timeout_us / 1e6, expire)

    # ---- model loading API: pb_utils.load_model / unload_model / is_model_ready ----

    async def _on_model_control(self, msg: messages.ModelControl) -> None:
        """Serve a model's call through the core's model control; the answer goes back to the worker."""
        control = self.core.control if self.core is not None else None
        error, ready = None, False
        try:
            if control is None:
                raise KernelError(ErrorCode.UNSUPPORTED, "model control is not available")
            if msg.op == messages.MODEL_LOAD:
                await control.load(msg.model_name, msg.config or None, msg.files or None)
            elif msg.op == messages.MODEL_UNLOAD:
                await control.unload(msg.model_name, msg.unload_dependents)
            else:
                ready = await control.is_ready(msg.model_name, msg.model_version)
        except KernelError as exc:
            error = exc.message
        except Exception as exc:  # noqa: BLE001 - the model gets the error, the server carries on
            log.exception("model control call from '%s' failed", self.name)
            error = f"{type(exc).__name__}: {exc}"
        if self.channel is not None and not self.channel.closed:
            self.channel.send(messages.ModelControlResult(msg.key, error, ready))

    def _would_deadlock(self, model_name: str, version: str) -> bool:
        try:
            target = self.core.model(model_name, version)
        except KernelError:
            return False
        healthy = [i for i in target.instances if i.healthy]
        return healthy == [self]
