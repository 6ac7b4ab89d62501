"""Benchmark model for Kernel: OUTPUT0 = INPUT0 + INPUT1, OUTPUT1 = INPUT0 - INPUT1 (FP32, shape [4]).

Written against the Triton Python-backend API so that real Triton and Kernel serve the very same
file. It does as little work as possible per request, so that a benchmark on it measures the
server's own overhead.
"""

import json

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        dtypes = {}
        for name in ("OUTPUT0", "OUTPUT1"):
            out_config = pb_utils.get_output_config_by_name(config, name)
            dtypes[name] = pb_utils.triton_string_to_numpy(out_config["data_type"])
        self._sum_dtype = dtypes["OUTPUT0"]
        self._diff_dtype = dtypes["OUTPUT1"]

    def execute(self, requests):
        responses = []
        for request in requests:
            a = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            b = pb_utils.get_input_tensor_by_name(request, "INPUT1").as_numpy()
            total = pb_utils.Tensor("OUTPUT0", np.add(a, b).astype(self._sum_dtype, copy=False))
            diff = pb_utils.Tensor("OUTPUT1", np.subtract(a, b).astype(self._diff_dtype, copy=False))
            responses.append(pb_utils.InferenceResponse(output_tensors=[total, diff]))
        return responses

    def finalize(self):
        pass
