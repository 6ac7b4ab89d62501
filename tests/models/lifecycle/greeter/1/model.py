"""Prints at each lifecycle step (the tests read the server log) and sleeps on request."""

import json
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        keys = sorted(args)
        print(f"greeter initialize keys={','.join(keys)} instance={args['model_instance_name']}", flush=True)
        self.config = json.loads(args["model_config"])

    def execute(self, requests):
        responses = []
        for request in requests:
            delay = int(pb_utils.get_input_tensor_by_name(request, "DELAY_MS").as_numpy()[0])
            print(f"greeter executing delay={delay}", flush=True)
            time.sleep(delay / 1000)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("DONE", np.array([delay], np.int32))]))
        return responses

    def finalize(self):
        print("greeter finalize called", flush=True)
