"""Batching benchmark model: OUTPUT0 = INPUT0 + INPUT1, OUTPUT1 = INPUT0 - INPUT1, FP32 [-1, 4].

The dynamic batcher hands execute() a list of requests; the model computes the whole batch with
one numpy call per output and slices the results back per request, as a batching model does.
Written against triton_python_backend_utils so real Triton and Kernel load the very same file.
"""

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        a = [pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy() for r in requests]
        b = [pb_utils.get_input_tensor_by_name(r, "INPUT1").as_numpy() for r in requests]
        if len(requests) == 1:
            sums, diffs = [a[0] + b[0]], [a[0] - b[0]]
        else:
            x = np.concatenate(a)
            y = np.concatenate(b)
            bounds = np.cumsum([len(t) for t in a])[:-1]
            sums = np.split(x + y, bounds)
            diffs = np.split(x - y, bounds)
        return [
            pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor("OUTPUT0", s), pb_utils.Tensor("OUTPUT1", d)])
            for s, d in zip(sums, diffs)
        ]
