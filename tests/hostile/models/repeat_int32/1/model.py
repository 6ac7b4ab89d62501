import asyncio

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    async def execute(self, requests):
        await asyncio.gather(*(self._repeat(r) for r in requests))
        return None

    async def _repeat(self, request):
        sender = request.get_response_sender()
        values = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
        delay = pb_utils.get_input_tensor_by_name(request, "DELAY")
        delays = delay.as_numpy() if delay is not None else np.zeros(len(values), np.uint32)
        for i, value in enumerate(values):
            if delays[i]:
                await asyncio.sleep(float(delays[i]) / 1000.0)
            if request.is_cancelled():
                print(f"repeat_int32 request '{request.request_id()}' cancelled after {i} responses", flush=True)
                break
            sender.send(
                pb_utils.InferenceResponse(
                    [
                        pb_utils.Tensor("OUT", np.array([value], np.int32)),
                        pb_utils.Tensor("IDX", np.array([i], np.uint32)),
                    ]
                )
            )
        sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
