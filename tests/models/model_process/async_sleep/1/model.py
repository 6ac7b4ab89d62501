"""Decoupled, `async def execute`: sleeps WAIT_S seconds on the loop, then answers each request
with one response that carries the FINAL flag (SLEPT = WAIT_S). Several executes overlap."""

import asyncio

import triton_python_backend_utils as pb_utils

FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL


class TritonPythonModel:
    async def execute(self, requests):
        waits = [pb_utils.get_input_tensor_by_name(r, "WAIT_S").as_numpy() for r in requests]
        await asyncio.sleep(float(max(w.max() for w in waits)))
        for request, wait in zip(requests, waits):
            request.get_response_sender().send(pb_utils.InferenceResponse([pb_utils.Tensor("SLEPT", wait)]), FINAL)
        return None
