"""Decoupled, `async def execute`: each request awaits a decoupled BLS call to async_sleep and
walks its responses with a plain `for` (as Triton's QA model async_execute_decouple_bls and its
documented async BLS example do), forwarding each through the request's sender."""

import asyncio

import triton_python_backend_utils as pb_utils

FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL


async def _serve(request):
    wait = pb_utils.get_input_tensor_by_name(request, "WAIT_S").as_numpy()
    call = pb_utils.InferenceRequest(model_name="async_sleep", inputs=[pb_utils.Tensor("WAIT_S", wait)],
                                     requested_output_names=["SLEPT"])
    sender = request.get_response_sender()
    for response in await call.async_exec(decoupled=True):
        if response.has_error():
            sender.send(pb_utils.InferenceResponse(error=response.error()))
            continue
        slept = pb_utils.get_output_tensor_by_name(response, "SLEPT")
        if slept is not None:
            sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("SLEPT", slept.as_numpy())]))
    sender.send(flags=FINAL)


class TritonPythonModel:
    async def execute(self, requests):
        await asyncio.gather(*(_serve(r) for r in requests))
        return None
