"""Dies (os._exit) when INPUT0[0] is negative; echoes otherwise."""

import os
import sys

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            data = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            if data.size and data[0] < 0:
                print("crasher: exiting on request", flush=True)
                sys.stderr.flush()
                os._exit(3)
            responses.append(pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor("OUTPUT0", data)]))
        return responses
