"""A Python-based backend: OUTPUT0 = INPUT0 * the model's SCALE parameter.

INFO reports what initialize(args) saw, so tests can check that each model
served by this one file keeps its own name, repository and version.
"""

import json

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    @staticmethod
    def auto_complete_config(config):
        # Models of this backend need not spell out their tensors.
        if not config.as_dict().get("input"):
            config.add_input({"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [-1]})
        if not config.as_dict().get("output"):
            config.add_output({"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [-1]})
            config.add_output({"name": "INFO", "data_type": "TYPE_STRING", "dims": [1]})
        return config

    def initialize(self, args):
        config = json.loads(args["model_config"])
        self.scale = float(config["parameters"]["SCALE"]["string_value"])
        self.info = json.dumps(
            {
                "model_name": args["model_name"],
                "model_repository": args["model_repository"],
                "model_version": args["model_version"],
                "model_dir": pb_utils.get_model_dir(),
                "config_name": config["name"],
                "runtime": config.get("runtime", ""),
                "backend": config.get("backend", ""),
                "module_file": __file__,
            }
        )

    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            out = pb_utils.Tensor("OUTPUT0", (x * self.scale).astype(np.float32))
            info = pb_utils.Tensor("INFO", np.array([self.info.encode()], dtype=np.object_))
            responses.append(pb_utils.InferenceResponse(output_tensors=[out, info]))
        return responses
