import time

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            tag = pb_utils.get_input_tensor_by_name(request, "TAG").as_numpy()[0].decode()
            deadline = time.time() + 20
            while time.time() < deadline and not request.is_cancelled():
                time.sleep(0.01)
            if request.is_cancelled():
                print(f"cancel_watcher saw cancellation of {tag}", flush=True)
                responses.append(
                    pb_utils.InferenceResponse(error=pb_utils.TritonError("cancelled", pb_utils.TritonError.CANCELLED))
                )
            else:
                responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", pb_utils.get_input_tensor_by_name(request, "TAG").as_numpy())]))
        return responses
