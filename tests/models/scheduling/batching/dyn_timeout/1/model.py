"""A probe model for scheduler tests: reports how it was batched and scheduled.

Behaviour comes from the config's `parameters`:
  SLEEP_S   seconds to sleep in each execute() (default 0)
Outputs (whichever the config declares):
  OUTPUT0   INPUT0 (+ INPUT1 when present), element-wise
  BATCH     [1] INT32: how many requests this execute() received
  SEQ       [1] INT32: the execute() call's sequence number in this instance (1, 2, ...)
  INSTANCE  [1] BYTES: the instance name
  SHAPES    [1] INT32: how many distinct INPUT0 shapes this execute() received
"""

import json
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        params = config.get("parameters", {})
        self.sleep_s = float(params.get("SLEEP_S", {}).get("string_value", "0") or 0)
        self.outputs = {o["name"] for o in config["output"]}
        self.batching = config.get("max_batch_size", 0) > 0
        self.instance = args["model_instance_name"]
        self.calls = 0

    def _column(self, value, dtype, request):
        rows = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy().shape[0] if self.batching else None
        arr = np.array([value], dtype=dtype)
        return np.repeat(arr.reshape(1, 1), rows, axis=0) if rows is not None else arr

    def execute(self, requests):
        self.calls += 1
        seq = self.calls
        if self.sleep_s:
            time.sleep(self.sleep_s)
        shapes = {pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy().shape for r in requests}
        responses = []
        for request in requests:
            out = []
            a = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            b = pb_utils.get_input_tensor_by_name(request, "INPUT1")
            if "OUTPUT0" in self.outputs:
                out.append(pb_utils.Tensor("OUTPUT0", a + b.as_numpy() if b is not None else a.copy()))
            if "BATCH" in self.outputs:
                out.append(pb_utils.Tensor("BATCH", self._column(len(requests), np.int32, request)))
            if "SEQ" in self.outputs:
                out.append(pb_utils.Tensor("SEQ", self._column(seq, np.int32, request)))
            if "SHAPES" in self.outputs:
                out.append(pb_utils.Tensor("SHAPES", self._column(len(shapes), np.int32, request)))
            if "INSTANCE" in self.outputs:
                out.append(pb_utils.Tensor("INSTANCE", self._column(self.instance.encode(), np.object_, request)))
            responses.append(pb_utils.InferenceResponse(output_tensors=out))
        return responses
