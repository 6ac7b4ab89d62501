"""Identity on one FP32 tensor of any length: the response carries the request's INPUT0 as OUTPUT0.

The model itself does no work, so a benchmark on it measures how a server moves tensor bytes
(socket -> model -> socket). Written against triton_python_backend_utils: real Triton and Kernel
load the same file.
"""

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            data = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            responses.append(pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor("OUTPUT0", data)]))
        return responses
