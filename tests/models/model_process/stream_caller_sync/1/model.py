"""BLS to the decoupled stream_callee from a synchronous execute with exec(decoupled=True).

MODE: "cancel" (cancel after the first response, keep iterating),
"cancel_after_end" (cancel once the stream ended).
"""

import json

import numpy as np

import triton_python_backend_utils as pb_utils


def _values(responses):
    out = []
    for response in responses:
        tensor = pb_utils.get_output_tensor_by_name(response, "OUT")
        out.append(None if tensor is None else int(tensor.as_numpy()[0]))
    return out


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            mode = pb_utils.get_input_tensor_by_name(request, "MODE").as_numpy()[0].decode()
            bls = pb_utils.InferenceRequest(
                model_name="stream_callee",
                inputs=[pb_utils.get_input_tensor_by_name(request, "COUNT"),
                        pb_utils.Tensor("DELAY_MS", np.array([150], np.int32)),
                        pb_utils.get_input_tensor_by_name(request, "IGNORE_CANCEL")],
                requested_output_names=["OUT"],
            )
            stream = bls.exec(decoupled=True)
            got = []
            if mode == "cancel":
                for response in stream:
                    got.append(response)
                    if len(got) == 1:
                        stream.cancel()
            else:
                got = list(stream)
                stream.cancel()
            text = json.dumps({"type": type(stream).__name__, "values": _values(got)}).encode()
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("REPORT", np.array([text], np.object_))]))
        return responses
