import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "INPUT0")
            y = pb_utils.get_input_tensor_by_name(request, "INPUT1")
            result = pb_utils.InferenceRequest(
                model_name="add_sub", requested_output_names=["OUTPUT0", "OUTPUT1"], inputs=[x, y],
                trace=request.trace(),
            ).exec()
            if result.has_error():
                responses.append(pb_utils.InferenceResponse(error=result.error()))
                continue
            pb_utils.InferenceRequest(
                model_name="ens_pipeline", requested_output_names=["Z"],
                inputs=[pb_utils.Tensor("X", x.as_numpy()), pb_utils.Tensor("Y", y.as_numpy())],
                trace=request.trace(),
            ).exec()
            context = request.trace().get_context() or ""
            responses.append(pb_utils.InferenceResponse(output_tensors=[
                *result.output_tensors(), pb_utils.Tensor("CONTEXT", np.array([context.encode()], dtype=object)),
            ]))
        return responses
