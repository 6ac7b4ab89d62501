"""Answers with JSON: what reached the model (see config.pbtxt)."""

import json

import numpy as np
import triton_python_backend_utils as pb_utils


def _value(request, name):
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    if tensor is None:
        return None
    value = tensor.as_numpy().reshape(-1)[0]
    return value.decode("utf-8") if isinstance(value, bytes) else bool(value)


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            sampling = _value(request, "sampling_parameters")
            doc = {
                "prompt": _value(request, "text_input"),
                "sampling": json.loads(sampling) if sampling else None,
                "stream": _value(request, "stream"),
                "exclude_input_in_output": _value(request, "exclude_input_in_output"),
                "return_num_input_tokens": _value(request, "return_num_input_tokens"),
                "return_num_output_tokens": _value(request, "return_num_output_tokens"),
                "parameters": json.loads(request.parameters()),
            }
            text = json.dumps(doc)
            responses.append(pb_utils.InferenceResponse(output_tensors=[
                pb_utils.Tensor("text_output", np.array([text.encode()], dtype=np.object_)),
                pb_utils.Tensor("num_input_tokens", np.array([len(doc["prompt"].split())], dtype=np.uint32)),
                pb_utils.Tensor("num_output_tokens", np.array([len(text.split())], dtype=np.uint32)),
            ]))
        return responses
