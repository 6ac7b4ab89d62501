"""Iterative sequence test model: each request runs INPUT times, rescheduled in between.

Non-decoupled: returns None for a rescheduled request and, on the last run,
OUTPUT = number of runs. Decoupled: sends OUTPUT = runs left after each run,
the last one with the FINAL flag (as Triton's Python backend README shows).
"""

import json

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        self.decoupled = config.get("model_transaction_policy", {}).get("decoupled", False)
        self.batching = config.get("max_batch_size", 0) > 0
        self.left = {}

    def _tensor(self, value):
        arr = np.array([value], dtype=np.int32)
        return pb_utils.Tensor("OUTPUT", arr.reshape(1, 1) if self.batching else arr)

    def execute(self, requests):
        responses = []
        for request in requests:
            corr = request.correlation_id()
            if request.flags() & pb_utils.TRITONSERVER_REQUEST_FLAG_SEQUENCE_START or corr not in self.left:
                total = int(pb_utils.get_input_tensor_by_name(request, "INPUT").as_numpy().reshape(-1)[0])
                self.left[corr] = [total, 0]
            state = self.left[corr]
            state[0] -= 1
            state[1] += 1
            done = state[0] <= 0
            if self.decoupled:
                sender = request.get_response_sender()
                response = pb_utils.InferenceResponse(output_tensors=[self._tensor(max(0, state[0]))])
                if done:
                    del self.left[corr]
                    sender.send(response, flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
                else:
                    request.set_release_flags(pb_utils.TRITONSERVER_REQUEST_RELEASE_RESCHEDULE)
                    sender.send(response)
                continue
            if done:
                del self.left[corr]
                responses.append(pb_utils.InferenceResponse(output_tensors=[self._tensor(state[1])]))
            else:
                request.set_release_flags(pb_utils.TRITONSERVER_REQUEST_RELEASE_RESCHEDULE)
                responses.append(None)
        return None if self.decoupled else responses
