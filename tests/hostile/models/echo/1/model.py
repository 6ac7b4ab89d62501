"""Echo: OUT = IN, UOUT = U (whichever were given)."""

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            outputs = []
            for name, out in (("IN", "OUT"), ("U", "UOUT")):
                t = pb_utils.get_input_tensor_by_name(request, name)
                if t is not None:
                    outputs.append(pb_utils.Tensor(out, t.as_numpy()))
            responses.append(pb_utils.InferenceResponse(output_tensors=outputs))
        return responses
