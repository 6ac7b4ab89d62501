import asyncio

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    async def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "INPUT0")
            add = pb_utils.InferenceRequest(
                model_name="add_sub",
                requested_output_names=["OUTPUT0"],
                inputs=[pb_utils.Tensor("INPUT0", x.as_numpy()), pb_utils.Tensor("INPUT1", x.as_numpy())],
            )
            echo = pb_utils.InferenceRequest(
                model_name="dtype_echo",
                requested_output_names=["OUT_FP32"],
                inputs=[pb_utils.Tensor("IN_FP32", x.as_numpy())],
            )
            r1, r2 = await asyncio.gather(add.async_exec(), echo.async_exec())
            for r in (r1, r2):
                if r.has_error():
                    raise pb_utils.TritonModelException(r.error().message())
            responses.append(
                pb_utils.InferenceResponse(
                    output_tensors=[
                        pb_utils.Tensor("SUM", pb_utils.get_output_tensor_by_name(r1, "OUTPUT0").as_numpy()),
                        pb_utils.Tensor("ECHO", pb_utils.get_output_tensor_by_name(r2, "OUT_FP32").as_numpy()),
                    ]
                )
            )
        return responses
