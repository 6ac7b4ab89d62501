"""deploy/smoke-test.sh's echo_chat model: its answer is its prompt (the rendered chat template)."""

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor("text_output", pb_utils.get_input_tensor_by_name(r, "text_input").as_numpy())])
                for r in requests]
