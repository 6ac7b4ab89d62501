import asyncio

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    async def execute(self, requests):
        responses = []
        for request in requests:
            delay = pb_utils.get_input_tensor_by_name(request, "DELAY_MS").as_numpy()
            await asyncio.sleep(int(delay[0]) / 1000)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("DELAY_MS_OUT", delay)]))
        return responses
