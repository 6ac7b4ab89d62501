"""Records every request it executes (its inputs, and how many requests shared the execution) in
seen.jsonl next to its config, so tests can see what warmup sent; fails when FAIL is in its name."""

import json
from pathlib import Path

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.name = args["model_name"]
        self.log = Path(args["model_repository"]) / "seen.jsonl"

    def execute(self, requests):
        responses = []
        with self.log.open("a") as f:
            for request in requests:
                record = {"batch": len(requests)}
                for tensor in request.inputs():
                    array = tensor.as_numpy()
                    record[tensor.name()] = {
                        "shape": list(array.shape),
                        "dtype": str(array.dtype),
                        "hex": array.tobytes().hex() if array.dtype != object else None,
                        "values": [v.decode("latin-1") for v in array.reshape(-1)] if array.dtype == object else None,
                    }
                f.write(json.dumps(record) + "\n")
                if "fail" in self.name:
                    raise pb_utils.TritonModelException("boom in warmup")
                x = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
                responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", x)]))
        return responses
