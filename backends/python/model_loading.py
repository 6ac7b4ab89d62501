"""The model loading API inside the worker: pb_utils.load_model, unload_model, is_model_ready.

Each call travels to the front process as a ModelControl message, where the
core's model control serves it as it serves the repository API (so the same
modes apply: load and unload only in explicit mode), and the caller's thread
waits for the ModelControlResult. Errors reach the model as
TritonModelException with the wording Triton's Python backend uses.
"""

from __future__ import annotations

import asyncio
import itertools
import queue
import threading

from kernel.backends.python import messages
from kernel.backends.python.inline_channel import OneShot

import triton_python_backend_utils as pb_utils

_WHAT = {
    messages.MODEL_LOAD: "Failed to load model",
    messages.MODEL_UNLOAD: "Failed to unload model",
    messages.MODEL_READY: "Failed to check model readiness",
}


class ModelLoadingClient:
    def __init__(self, worker):
        self.worker = worker
        self.calls: dict[int, queue.SimpleQueue] = {}
        self._keys = itertools.count(1)
        self._lock = threading.Lock()

    def load_model(self, model_name: str, config: str, files) -> None:
        self._call(messages.ModelControl(0, messages.MODEL_LOAD, model_name, config or "", _files(model_name, files)))

    def unload_model(self, model_name: str, unload_dependents: bool) -> None:
        self._call(messages.ModelControl(0, messages.MODEL_UNLOAD, model_name, unload_dependents=unload_dependents))

    def is_model_ready(self, model_name: str, model_version: str) -> bool:
        msg = messages.ModelControl(0, messages.MODEL_READY, model_name, model_version=model_version)
        return self._call(msg).ready

    def _call(self, msg: messages.ModelControl) -> messages.ModelControlResult:
        loop = self.worker.loop
        pumping = self.worker.pumping_here()  # a synchronous execute running on the loop
        if not pumping and _on_loop(loop):
            # The answer arrives on this very loop: waiting here would wait forever.
            raise pb_utils.TritonModelException(
                "the model loading API blocks until the server answers, so it cannot be called on the worker's "
                "event loop (from 'async def' methods); call it from initialize() or a synchronous execute()"
            )
        with self._lock:
            msg.key = next(self._keys)
        answer: queue.SimpleQueue = queue.SimpleQueue()
        self.calls[msg.key] = answer
        if pumping:
            self._send(msg)
            self.worker.wait_inline(lambda: not answer.empty())
            result = answer.get()
        else:
            send = OneShot(self._send, msg)
            loop.call_soon_threadsafe(send)
            result = self.worker.take_off_loop(answer, send)
        if result.error is not None:
            raise pb_utils.TritonModelException(
                f"{_WHAT[msg.op]}: Failed to process the request for model '{self.worker.instance_name}', "
                f"message: {result.error}"
            )
        return result

    def _send(self, msg: messages.ModelControl) -> None:
        try:
            self.worker.channel.send(msg)
        except ConnectionError:
            self.on_result(messages.ModelControlResult(msg.key, "the server is not reachable"))

    def on_result(self, result: messages.ModelControlResult) -> None:
        answer = self.calls.pop(result.key, None)
        if answer is not None:
            answer.put(result)


def _files(model_name: str, files) -> dict[str, bytes]:
    if files is None:
        return {}
    problem = pb_utils.TritonModelException(
        f"failed to load model '{model_name}', files should be a dictionary of file paths and file contents"
    )
    if not isinstance(files, dict):
        raise problem
    out = {}
    for key, value in files.items():
        if not isinstance(key, str) or not isinstance(value, (bytes, bytearray, memoryview)):
            raise problem
        out[key] = bytes(value)
    return out


def _on_loop(loop) -> bool:
    try:
        return asyncio.get_running_loop() is loop
    except RuntimeError:
        return False
