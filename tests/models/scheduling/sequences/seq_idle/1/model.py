"""Sequence test model: a running sum per sequence.

Reads the sequence control inputs the config declares (START, END, READY,
CORRID) and the request's own correlation ID. Outputs:
  OUTPUT   running sum of INPUT over the sequence so far
  CORRID_OUT  the CORRID control's value (or the request's correlation ID)
  BATCH    how many requests this execute() received (null requests included)
  READY_OUT   the READY control (1 ready, 0 a not-ready filler)
"""

import json
import time

import numpy as np
import triton_python_backend_utils as pb_utils


def _scalar(request, name):
    t = pb_utils.get_input_tensor_by_name(request, name)
    return None if t is None else t.as_numpy().reshape(-1)[0]


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        params = config.get("parameters", {})
        self.sleep_s = float(params.get("SLEEP_S", {}).get("string_value", "0") or 0)
        self.batching = config.get("max_batch_size", 0) > 0
        self.outputs = {o["name"]: o for o in config["output"]}
        self.sums = {}

    def _out(self, name, value, dtype):
        arr = np.array([value], dtype=dtype)
        return pb_utils.Tensor(name, arr.reshape(1, 1) if self.batching else arr)

    def execute(self, requests):
        if self.sleep_s:
            time.sleep(self.sleep_s)
        responses = []
        for request in requests:
            ready = _scalar(request, "READY")
            start = _scalar(request, "START")
            end = _scalar(request, "END")
            corrid = _scalar(request, "CORRID")
            if corrid is None:
                corrid = request.correlation_id()
            if isinstance(corrid, bytes):
                corrid = corrid.decode()
            value = int(_scalar(request, "INPUT"))
            if ready is not None and not ready:
                total = 0
            else:
                if start is None:
                    start = request.flags() & pb_utils.TRITONSERVER_REQUEST_FLAG_SEQUENCE_START
                if start or corrid not in self.sums:
                    self.sums[corrid] = 0
                self.sums[corrid] += value
                total = self.sums[corrid]
                if end:
                    del self.sums[corrid]
            out = [self._out("OUTPUT", total, np.int32), self._out("BATCH", len(requests), np.int32)]
            if "READY_OUT" in self.outputs:
                out.append(self._out("READY_OUT", 1 if ready is None else int(bool(ready)), np.int32))
            if "CORRID_OUT" in self.outputs:
                if self.outputs["CORRID_OUT"]["data_type"] == "TYPE_STRING":
                    out.append(self._out("CORRID_OUT", str(corrid).encode(), np.object_))
                else:
                    out.append(self._out("CORRID_OUT", int(corrid), np.uint64))
            responses.append(pb_utils.InferenceResponse(output_tensors=out))
        return responses
