"""MODE "async": `async_exec()`, overwrite, then await. MODE "thread": a thread of the model's calls
`exec()` while this async execute still holds the worker's loop, and the buffer is overwritten
before the loop runs again."""

import asyncio
import threading
import time

import numpy as np

import triton_python_backend_utils as pb_utils


def _bls(buffer):
    return pb_utils.InferenceRequest(model_name="identity", requested_output_names=["OUT"],
                                     inputs=[pb_utils.Tensor("IN", buffer)])


def _out(response):
    if response.has_error():
        raise pb_utils.TritonModelException(response.error().message())
    return pb_utils.get_output_tensor_by_name(response, "OUT").as_numpy().copy()


class TritonPythonModel:
    async def execute(self, requests):
        responses = []
        for request in requests:
            mode = pb_utils.get_input_tensor_by_name(request, "MODE").as_numpy()[0].decode()
            buffer = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy().copy()
            if mode == "async":
                pending = _bls(buffer).async_exec()
                buffer[:] = -1.0
                out = _out(await pending)
            else:
                answer = []
                called = threading.Event()

                def call():
                    request_ = _bls(buffer)
                    called.set()
                    answer.append(request_.exec())

                thread = threading.Thread(target=call)
                thread.start()
                called.wait()
                time.sleep(0.2)  # the thread is in exec(); this execute still holds the loop
                buffer[:] = -1.0
                await asyncio.get_running_loop().run_in_executor(None, thread.join)
                out = _out(answer[0])
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", out)]))
        return responses
