"""BLS to the decoupled stream_callee from an async execute; REPORT says what the caller saw.

MODE: "arrival" (async for: values and arrival times), "sync_for" (Triton's
example: plain for over the awaited result), "cancel" (cancel after the first
response, keep iterating), "cancel_after_end" (cancel once the stream ended).
"""

import json
import time

import numpy as np

import triton_python_backend_utils as pb_utils

DELAY_MS = 150


def _values(responses):
    out = []
    for response in responses:
        if response.has_error():
            out.append("error: " + response.error().message())
            continue
        tensor = pb_utils.get_output_tensor_by_name(response, "OUT")
        out.append(None if tensor is None else int(tensor.as_numpy()[0]))
    return out


class TritonPythonModel:
    async def execute(self, requests):
        responses = []
        for request in requests:
            mode = pb_utils.get_input_tensor_by_name(request, "MODE").as_numpy()[0].decode()
            count = pb_utils.get_input_tensor_by_name(request, "COUNT").as_numpy()
            ignore = pb_utils.get_input_tensor_by_name(request, "IGNORE_CANCEL").as_numpy()
            bls = pb_utils.InferenceRequest(
                model_name="stream_callee",
                inputs=[pb_utils.Tensor("COUNT", count), pb_utils.Tensor("DELAY_MS", np.array([DELAY_MS], np.int32)),
                        pb_utils.Tensor("IGNORE_CANCEL", ignore)],
                requested_output_names=["OUT"],
            )
            start = time.monotonic()
            stream = await bls.async_exec(decoupled=True)
            report = {"type": type(stream).__name__, "has_cancel": hasattr(stream, "cancel")}
            if mode == "arrival":
                got, times = [], []
                async for response in stream:
                    got.append(response)
                    times.append(time.monotonic() - start)
                report.update(values=_values(got), times=times)
            elif mode == "sync_for":
                report["values"] = _values([response for response in stream])
            elif mode == "cancel":
                got = []
                async for response in stream:
                    got.append(response)
                    if len(got) == 1:
                        stream.cancel()
                report["values"] = _values(got)
            elif mode == "cancel_after_end":
                got = [response async for response in stream]
                stream.cancel()
                report["values"] = _values(got)
            text = json.dumps(report).encode()
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("REPORT", np.array([text], np.object_))]))
        return responses
