"""A model with no config.pbtxt: it describes itself in auto_complete_config.

SUM = A + B for INT32 vectors of any length, batched up to 16 requests.
"""

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    @staticmethod
    def auto_complete_config(auto_complete_model_config):
        for name in ("A", "B"):
            auto_complete_model_config.add_input({"name": name, "data_type": "TYPE_INT32", "dims": [-1]})
        auto_complete_model_config.add_output({"name": "SUM", "data_type": "TYPE_INT32", "dims": [-1]})
        auto_complete_model_config.set_max_batch_size(16)
        return auto_complete_model_config

    def execute(self, requests):
        responses = []
        for request in requests:
            a = pb_utils.get_input_tensor_by_name(request, "A").as_numpy()
            b = pb_utils.get_input_tensor_by_name(request, "B").as_numpy()
            responses.append(pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor("SUM", a + b)]))
        return responses
